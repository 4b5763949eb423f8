"""The ASGI app end to end against the scripted fake engine: routes, auth, errors, streams, cancellation."""

from __future__ import annotations

import asyncio

import anthropic
import httpx
import openai
import orjson
import pytest
from k3_helpers import anthropic_stream, chat_stream, responses_stream, sse_frames

from k3.app import create_app
from k3.config import Config
from k3.testing.asgi import StreamingASGITransport
from k3.testing.fake_upstream import FakeUpstream, Reply, ToolCall

ANTHROPIC = {"model": "claude-sonnet-4-6", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
CHAT = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
RESPONSES = {"model": "gpt-5", "input": "hi"}
ROUTES = {"anthropic": "/v1/messages", "chat": "/v1/chat/completions", "responses": "/v1/responses"}
BODIES = {"anthropic": ANTHROPIC, "chat": CHAT, "responses": RESPONSES}
DIALECTS = list(ROUTES)


def body_for(dialect, stream=False, **extra):
    return {**BODIES[dialect], "stream": stream, **extra}


def error_of(dialect, response):
    """(type, message) from an error body, checking its dialect's shape."""
    body = response.json()
    if dialect == "anthropic":
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
        return body["error"]["type"], body["error"]["message"]
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]["type"], body["error"]["message"]


def judge(dialect, text):
    """Parse a stream with the dialect's SDK judge; returns the final object."""
    return {"anthropic": anthropic_stream, "chat": chat_stream, "responses": responses_stream}[dialect](text)


# ---------------------------------------------------------------------------------------------
# Side routes


async def test_root_probe_and_query_strings(client, fake):
    assert (await client.head("/")).status_code == 200
    assert (await client.get("/")).json()["name"] == "k3"
    response = await client.post("/v1/messages?beta=true", json=ANTHROPIC)
    assert response.status_code == 200 and response.headers["x-k3-preset"] == "anthropic"
    assert len(fake.requests) == 1  # one upstream POST per client turn


async def test_models_shape_follows_the_caller(make_client):
    client = make_client(small_model="tiny")
    anthropic_list = (await client.get("/v1/models", headers={"anthropic-version": "2023-06-01"})).json()
    ids = [anthropic.types.ModelInfo.model_validate(m).id for m in anthropic_list["data"]]
    assert ids[:2] == ["kimi-linear", "tiny"] and anthropic_list["has_more"] is False
    openai_list = (await client.get("/v1/models")).json()
    assert [openai.types.Model.model_validate(m).id for m in openai_list["data"]][:2] == [
        "kimi-linear",
        "tiny",
    ]


@pytest.fixture
async def dead_client():
    """k3 over the real network in front of a port nobody listens on."""
    app = create_app(Config(upstream="http://127.0.0.1:1/v1", connect_timeout=2))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://k3") as client:
        yield client


async def test_health_presets_and_stats(make_client, client, dead_client):
    health = await client.get("/health")
    assert health.status_code == 200 and health.json() == {"status": "ok"}  # no key: nobody is known
    keyed = make_client(api_key="k")
    health = await keyed.get("/health", headers={"authorization": "Bearer k"})
    assert health.status_code == 200 and health.json()["models"] == ["kimi-linear"]
    dead = await dead_client.get("/health")
    assert dead.status_code == 503 and dead.json()["status"] == "degraded"
    names = [p["name"] for p in (await client.get("/k3/presets")).json()["presets"]]
    assert "claude-code" in names and "codex" in names
    await client.post("/v1/chat/completions", json=CHAT)
    await client.post("/v1/chat/completions", content=b"{nope")
    stats = (await client.get("/k3/stats")).json()
    assert stats["counters"]["requests"] == 1 and stats["counters"]["errors"] == 1
    assert stats["by_preset"] == {"openai": 1}


async def test_unknown_paths_and_methods_answer_json_in_a_guessed_dialect(client):
    missing = await client.post("/v1/embeddings", json={})
    assert missing.status_code == 404 and error_of("chat", missing)[0] == "not_found_error"
    wrong = await client.get("/v1/messages")
    assert wrong.status_code == 405 and error_of("anthropic", wrong)[0] == "invalid_request_error"


# ---------------------------------------------------------------------------------------------
# Client errors


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_bad_json_and_bad_shapes_are_400_in_the_callers_dialect(client, dialect):
    route = ROUTES[dialect]
    for raw in (b"{not json", b"[1, 2]", b'"text"'):
        response = await client.post(route, content=raw)
        assert response.status_code == 400
        error_of(dialect, response)
    bad = {"anthropic": {"messages": [{"role": "user", "content": 5}]}, "chat": {"messages": [{"role": "user", "content": 5}]},
           "responses": {"input": [{"type": "message", "role": "user", "content": 5}]}}[dialect]  # fmt: skip
    response = await client.post(route, json=bad)
    assert response.status_code == 400 and "content" in error_of(dialect, response)[1]


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_auth_bearer_and_x_api_key(make_client, dialect):
    client = make_client(api_key="s3cret")
    route = ROUTES[dialect]
    denied = await client.post(route, json=body_for(dialect))
    assert denied.status_code == 401 and error_of(dialect, denied)[0] == "authentication_error"
    assert (
        await client.post(route, json=body_for(dialect), headers={"authorization": "Bearer wrong"})
    ).status_code == 401
    assert (
        await client.post(route, json=body_for(dialect), headers={"authorization": "Bearer s3cret"})
    ).status_code == 200
    assert (
        await client.post(route, json=body_for(dialect), headers={"x-api-key": "s3cret"})
    ).status_code == 200
    for path in ("/v1/models", "/k3/stats", "/k3/presets"):  # the same 401 as a turn's
        refused = await client.get(path)
        assert refused.status_code == 401 and refused.json()["error"]["type"] == "authentication_error"
    health = (await client.get("/health")).json()
    assert set(health) == {"status"}  # reachable without credentials, but says nothing more


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_body_over_the_limit_is_413(make_client, dialect):
    client = make_client(max_body_bytes=1000)
    big = body_for(dialect)
    big = {**big, "metadata": {"pad": "x" * 2000}}
    response = await client.post(ROUTES[dialect], json=big)
    assert response.status_code == 413
    error_of(dialect, response)

    async def chunked():  # no content-length: the limit holds while reading
        yield orjson.dumps(big)[:600]
        yield orjson.dumps(big)[600:]

    response = await client.post(ROUTES[dialect], content=chunked())
    assert response.status_code == 413


# ---------------------------------------------------------------------------------------------
# Upstream failures


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("status", [400, 500])
async def test_upstream_errors_pass_through_with_status_and_message(client, fake, dialect, stream, status):
    fake.push(Reply(status=status, error="prompt is too long: 99999 tokens"))
    response = await client.post(ROUTES[dialect], json=body_for(dialect, stream))
    assert response.status_code == status
    assert (
        response.headers["content-type"] == "application/json"
    )  # a stream that never started is a JSON error
    assert error_of(dialect, response)[1] == "prompt is too long: 99999 tokens"


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("stream", [False, True])
async def test_unreachable_upstream_is_502(dead_client, dialect, stream):
    response = await dead_client.post(ROUTES[dialect], json=body_for(dialect, stream))
    assert response.status_code == 502
    assert "cannot reach" in error_of(dialect, response)[1]


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("stream", [False, True])
async def test_upstream_timeout_is_504(make_streaming_client, live, dialect, stream):
    fake, _ = live
    fake.push(Reply(content="late", delay=2.0))
    client = make_streaming_client(read_timeout=0.2, keepalive_interval=5)
    response = await client.post(ROUTES[dialect], json=body_for(dialect, stream))
    assert response.status_code == 504
    assert error_of(dialect, response)[0] in ("timeout_error", "server_error")


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("how", ["error_after", "cut_after"])
async def test_failure_mid_stream_ends_with_the_dialects_error_event(client, fake, dialect, how):
    fake.push(Reply(content="a long answer that will not finish", chunk_chars=4, **{how: 3}))
    response = await client.post(ROUTES[dialect], json=body_for(dialect, True))
    assert response.status_code == 200
    frames = sse_frames(response.text)
    if dialect == "anthropic":
        assert frames[-1][0] == "error" and frames[-1][1]["error"]["type"] in (
            "api_error",
            "overloaded_error",
        )
        assert "message_stop" not in [n for n, _ in frames]
    elif dialect == "chat":
        assert frames[-1] == (None, "[DONE]") and "error" in frames[-2][1]
        with pytest.raises(openai.APIError):
            _raise_like_the_openai_sdk(frames)
    else:
        assert [n for n, _ in frames[-2:]] == ["error", "response.failed"]
        assert frames[-1][1]["response"]["status"] == "failed"
        assert [d["sequence_number"] for _, d in frames] == list(range(len(frames)))


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_engine_dropping_the_connection_mid_stream_is_an_error_event(
    make_streaming_client, live, dialect
):
    fake, _ = live
    fake.push(Reply(content="a long answer that will not finish", chunk_chars=4, drop_after=3))
    client = make_streaming_client()
    response = await client.post(ROUTES[dialect], json=body_for(dialect, True))
    assert response.status_code == 200
    frames = [f for f in sse_frames(response.text) if f[0] != ":"]
    ending = {"anthropic": ["error"], "chat": [None, None], "responses": ["error", "response.failed"]}[
        dialect
    ]
    assert [name for name, _ in frames[-len(ending) :]] == ending
    error = frames[-1][1] if dialect != "chat" else frames[-2][1]
    assert "upstream connection failed" in orjson.dumps(error).decode()


def _raise_like_the_openai_sdk(frames):
    for _, data in frames:
        if isinstance(data, dict) and data.get("error"):
            # a real request: openai >= 3.60 reads its headers when the error is built
            request = httpx.Request("POST", "http://k3/v1/chat/completions")
            raise openai.APIError(data["error"]["message"], request=request, body=data["error"])


# ---------------------------------------------------------------------------------------------
# Streams


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_keepalive_frames_on_a_slow_stream_do_not_break_the_sdk_parsers(
    make_streaming_client, live, dialect
):
    fake, _ = live
    fake.push(Reply(reasoning="slow thought", content="done", chunk_chars=6, delay=0.25))
    client = make_streaming_client(keepalive_interval=0.1)
    response = await client.post(ROUTES[dialect], json=body_for(dialect, True))
    assert response.status_code == 200
    frames = sse_frames(response.text)
    pings = [f for f in frames if f[0] in ("ping", ":")]
    assert len(pings) >= 3  # one per 0.1 s of a ~1.5 s stream, at least
    final = judge(dialect, response.text)
    text = {"anthropic": lambda m: m.content[-1].text, "chat": lambda c: c.choices[0].message.content,
            "responses": lambda r: r.output_text}[dialect](final)  # fmt: skip
    assert text == "done"


async def test_client_disconnect_cancels_the_upstream_request(make_streaming_client, live):
    fake, _ = live
    fake.push(Reply(content="x" * 400, chunk_chars=4, delay=0.05))  # 100 chunks, 5 s
    client = make_streaming_client()
    async with client.stream("POST", "/v1/messages", json=body_for("anthropic", True)) as response:
        assert response.status_code == 200
        async for _ in response.aiter_bytes():
            break  # the first frames arrived: hang up
    started = asyncio.get_running_loop().time()
    assert await asyncio.to_thread(fake.disconnected.wait, 3.0), "the engine never saw the connection close"
    assert asyncio.get_running_loop().time() - started < 1.5
    assert fake.chunks_sent < 60


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_streams_commit_only_after_the_first_event(client, fake, dialect):
    fake.push(Reply(content="ok"))
    response = await client.post(ROUTES[dialect], json=body_for(dialect, True))
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["x-k3-preset"] == ("anthropic" if dialect == "anthropic" else "openai")


async def _sent_bodies(app, dialect: str) -> list[dict]:
    """The http.response.body messages k3 sends for one streamed turn, straight over ASGI."""
    sent: list[dict] = []
    body = orjson.dumps(body_for(dialect, True))
    messages = iter([{"type": "http.request", "body": body, "more_body": False}])

    async def receive():
        return next(messages, {"type": "http.disconnect"})

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": ROUTES[dialect], "headers": [], "query_string": b""}
    await app(scope, receive, send)
    return [m for m in sent if m["type"] == "http.response.body"]


def _streamed_text(dialect: str, bodies: list[dict]) -> str:
    final = judge(dialect, b"".join(m["body"] for m in bodies).decode())
    if dialect == "anthropic":
        return "".join(block.text for block in final.content if block.type == "text")
    return final.choices[0].message.content if dialect == "chat" else final.output_text


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_the_engines_last_read_goes_out_with_the_closing_frames(fake, dialect):
    app = create_app(Config(upstream="http://fake/v1"), upstream_transport=httpx.ASGITransport(fake))
    # httpx's ASGI transport hands k3 the whole engine body in one read: one write, which closes.
    fake.push(Reply(content="hello there, general", reasoning="hmm"))
    bodies = await _sent_bodies(app, dialect)
    assert [m["more_body"] for m in bodies] == [False]
    assert _streamed_text(dialect, bodies) == "hello there, general"
    # Read by read (the engine waits between chunks), the reply streams out before the close.
    app = create_app(Config(upstream="http://fake/v1"), upstream_transport=StreamingASGITransport(fake))
    fake.push(Reply(content="hello there, general", delay=0.001))
    bodies = await _sent_bodies(app, dialect)
    assert len(bodies) > 2 and bodies[-1]["more_body"] is False
    assert all(m["more_body"] for m in bodies[:-1])
    assert _streamed_text(dialect, bodies) == "hello there, general"


# ---------------------------------------------------------------------------------------------
# Turns


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("stream", [False, True])
async def test_native_tool_calls_and_reasoning_round_trip(client, fake, dialect, stream):
    raw_args = '{"command":  "echo hi"}'  # odd spacing: must survive byte for byte where the dialect allows
    fake.push(
        Reply(
            reasoning="I should run it",
            content="Running.",
            tool_calls=[ToolCall("bash", raw_args, "call_77")],
        )
    )
    tools = {
        "anthropic": [
            {
                "name": "bash",
                "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
            }
        ],
        "chat": [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}],
        "responses": [{"type": "function", "name": "bash", "parameters": {"type": "object"}}],
    }[dialect]
    first = await client.post(ROUTES[dialect], json=body_for(dialect, stream, tools=tools))
    assert first.status_code == 200
    if dialect == "anthropic":
        message = (
            anthropic_stream(first.text) if stream else anthropic.types.Message.model_validate(first.json())
        )
        assert [b.type for b in message.content] == ["thinking", "text", "tool_use"]
        assert message.content[0].thinking == "I should run it" and message.stop_reason == "tool_use"
        follow = [
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": message.content[2].id, "content": "hi"}],
            },
        ]
        second = body_for(dialect, stream, tools=tools, messages=ANTHROPIC["messages"] + follow)
    elif dialect == "chat":
        completion = (
            chat_stream(first.text)
            if stream
            else openai.types.chat.ChatCompletion.model_validate(first.json())
        )
        call = completion.choices[0].message.tool_calls[0]
        assert call.function.arguments == raw_args and completion.choices[0].finish_reason == "tool_calls"
        assistant = {
            "role": "assistant",
            "content": completion.choices[0].message.content,
            "tool_calls": [call.model_dump()],
        }
        assistant["reasoning_content"] = "I should run it"
        follow = [assistant, {"role": "tool", "tool_call_id": call.id, "content": "hi"}]
        second = body_for(dialect, stream, tools=tools, messages=CHAT["messages"] + follow)
    else:
        response = (
            responses_stream(first.text)
            if stream
            else openai.types.responses.Response.model_validate(first.json())
        )
        assert [o.type for o in response.output] == ["reasoning", "message", "function_call"]
        call = response.output[2]
        assert call.arguments == raw_args
        items = [o.model_dump(exclude_none=True) for o in response.output]
        second = body_for(dialect, stream, tools=tools, input=[{"role": "user", "content": "hi"}, *items,
                          {"type": "function_call_output", "call_id": call.call_id, "output": "hi"}])  # fmt: skip
    fake.push(Reply(content="It printed hi."))
    assert (await client.post(ROUTES[dialect], json=second)).status_code == 200
    upstream = fake.requests[-1]["messages"]
    assistant, tool = upstream[-2], upstream[-1]
    assert (
        assistant["tool_calls"][0]["id"] == "call_77" and assistant["reasoning_content"] == "I should run it"
    )
    if (
        dialect != "anthropic"
    ):  # Anthropic's tool_use.input is an object: the exact bytes come back via the ledger
        assert assistant["tool_calls"][0]["function"]["arguments"] == raw_args
    assert tool == {"role": "tool", "tool_call_id": "call_77", "content": "hi"}


async def test_small_models_map_to_small_model(make_client, fake):
    client = make_client(small_model="kimi-small")
    await client.post("/v1/messages", json={**ANTHROPIC, "model": "claude-haiku-4-5"})
    await client.post("/v1/messages", json=ANTHROPIC)
    assert [r["model"] for r in fake.requests] == ["kimi-small", "kimi-linear"]


async def test_client_model_name_is_echoed_not_the_engines(client):
    response = await client.post("/v1/chat/completions", json={**CHAT, "model": "my-alias"})
    assert response.json()["model"] == "my-alias"


# ---------------------------------------------------------------------------------------------
# count_tokens


async def test_count_tokens_uses_the_engines_tokenizer(client, fake):
    response = await client.post("/v1/messages/count_tokens", json=ANTHROPIC)
    assert response.status_code == 200
    assert anthropic.types.MessageTokensCount.model_validate(response.json()).input_tokens >= 1
    assert fake.tokenize_requests and fake.tokenize_requests[0]["messages"] == [
        {"role": "user", "content": "hi"}
    ]


async def test_count_tokens_uses_llama_cpp_template_and_tokenize():
    fake = FakeUpstream(tokenizer="llama.cpp")
    app = create_app(Config(upstream="http://fake/v1"), upstream_transport=httpx.ASGITransport(fake))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://k3") as client:
        body = {**ANTHROPIC, "messages": [{"role": "user", "content": "x" * 400}]}
        for _ in range(2):
            response = await client.post("/v1/messages/count_tokens", json=body)
            assert response.json() == {"input_tokens": len("<user>" + "x" * 400) // 4}
    assert app.state.k3.upstream.tokenizer == "llama.cpp"
    # learned once: the second count skips the vLLM probe
    assert [("content" in r, "messages" in r) for r in fake.tokenize_requests] == [
        (False, True), (False, True), (True, False), (False, True), (True, False),
    ]  # fmt: skip


async def test_count_tokens_estimates_without_a_tokenizer_and_never_fails_on_odd_bodies():
    fake = FakeUpstream(tokenizer=None)
    app = create_app(Config(upstream="http://fake/v1"), upstream_transport=httpx.ASGITransport(fake))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://k3") as client:
        long = {**ANTHROPIC, "messages": [{"role": "user", "content": "word " * 400}]}
        estimate = (await client.post("/v1/messages/count_tokens", json=long)).json()["input_tokens"]
        assert 400 <= estimate <= 600  # 2000 characters / 4, plus the message overhead
        for odd in (
            {},
            {"tools": 5},
            {"system": 7, "messages": [{"role": "user", "content": None}]},
            {"messages": {"a": 1}},
        ):
            response = await client.post("/v1/messages/count_tokens", json=odd)
            assert response.status_code == 200 and response.json()["input_tokens"] >= 1
        assert (await client.post("/v1/messages/count_tokens", content=b"{bad")).status_code == 400


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/responses", {"model": "m", "input": "hi"}),
        (
            "/v1/chat/completions",
            {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
        ),
    ],
)
async def test_the_field_an_engine_error_blames_reaches_openai_clients(client, fake, path, body):
    fake.push(Reply(status=400, error="temperature must be at most 2", param="temperature"))
    response = await client.post(path, json=body)
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == "temperature"
    assert error["message"] == "temperature must be at most 2"
