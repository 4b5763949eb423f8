"""Faults reported in the client's own dialect: nothing bad from the engine passes as a success.

The upstream's SSE (line cap, linear decoding, bad JSON, a missing finish_reason), its 429s,
deep client JSON, credentials in --upstream, and SIGTERM during a stream.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import orjson
import pytest
from k3_helpers import anthropic_stream, sse_frames

from k3.app import MAX_JSON_DEPTH, ORJSON_MAX_DEPTH, create_app, nests_deeper
from k3.config import Config
from k3.sse import LineTooLong, SSEDecoder
from k3.testing.fake_upstream import Reply

REPO = Path(__file__).resolve().parents[2]
ROUTES = {"anthropic": "/v1/messages", "chat": "/v1/chat/completions", "responses": "/v1/responses"}
BODIES = {
    "anthropic": {
        "model": "claude-sonnet-4-6",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "hi"}],
    },
    "chat": {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]},
    "responses": {"model": "gpt-5", "input": "hi"},
}
DIALECTS = list(ROUTES)


def body_for(dialect: str, stream: bool = False, **extra: object) -> dict:
    return {**BODIES[dialect], "stream": stream, **extra}


def chunk(delta: dict, finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return (
        b"data: "
        + orjson.dumps({"id": "c", "object": "chat.completion.chunk", "choices": [choice]})
        + b"\n\n"
    )


FIRST = chunk({"role": "assistant", "content": "partial "})
FINISH = chunk({}, "stop") + b"data: [DONE]\n\n"


def error_ending(dialect: str, text: str) -> str:
    """The message of the error event a stream ends with; fails if it reports success anywhere."""
    frames = [f for f in sse_frames(text) if f[0] != ":"]
    names = [name for name, _ in frames]
    if dialect == "anthropic":
        assert names[-1] == "error" and "message_stop" not in names and "message_delta" not in names
        return frames[-1][1]["error"]["message"]
    if dialect == "chat":
        assert frames[-1] == (None, "[DONE]") and "error" in frames[-2][1]
        finishes = [c["finish_reason"] for _, c in frames[:-2] for c in c.get("choices", [])]
        assert not any(finishes), "a finish chunk before the error"
        return frames[-2][1]["error"]["message"]
    assert names[-2:] == ["error", "response.failed"]
    assert "response.completed" not in names and "response.incomplete" not in names
    return frames[-1][1]["response"]["error"]["message"]


# ---------------------------------------------------------------------------------------------
# The SSE decoder: linear work, a line cap


@pytest.mark.parametrize(
    "event",
    [
        b"data: " + b"x" * (1 << 20) + b"\n\n",  # one long line: the engines' shape
        b"".join(b"data: " + b"y" * 4000 + b"\r\n" for _ in range(256)) + b"\r\n",  # many lines, CRLF
    ],
    ids=["one-line", "multi-line-crlf"],
)
@pytest.mark.parametrize("piece", [1000, 4096])
def test_sse_decoder_work_is_linear_in_a_long_event_fed_in_small_pieces(event, piece):
    decoder = SSEDecoder(max_line=2 << 20)
    out = []
    for i in range(0, len(event), piece):
        out += decoder.feed(event[i : i + piece])
    assert len(out) == 1 and len(out[0]) > 1 << 20 - 1
    # Each byte reaches the splitter a bounded number of times: re-splitting the whole buffer on
    # every read (the old decoder) hands it len(event) ** 2 / (2 * piece) bytes, ~500x more here.
    assert decoder.scanned <= 2 * len(event) + piece


def test_sse_decoder_caps_the_line_length_however_the_line_arrives():
    for pieces in (
        [b"data: " + b"x" * 200],
        [b"data: ", *[b"x" * 10] * 20],
        [b"data: " + b"x" * 200 + b"\n\n"],
    ):
        decoder = SSEDecoder(max_line=100)
        with pytest.raises(LineTooLong):
            for piece in pieces:
                decoder.feed(piece)
    decoder = SSEDecoder(max_line=100)
    assert decoder.feed(b"data: " + b"x" * 94 + b"\n\n") == [b"x" * 94]  # 100 bytes: at the cap
    assert SSEDecoder().max_line >= 4 << 20  # the default is far above any real chunk


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_an_sse_line_over_the_cap_ends_the_stream_with_an_error_event(
    make_streaming_client, live, dialect
):
    fake, _ = live
    line = [b"data: ", *[b"x" * 256] * 20]  # read by read, as a real socket delivers it
    fake.push(Reply(raw=[FIRST, *line, b"\n\n", FINISH], delay=0.005))
    client = make_streaming_client(max_sse_line_bytes=1024)
    response = await client.post(ROUTES[dialect], json=body_for(dialect, True))
    assert response.status_code == 200
    assert "1024-byte limit" in error_ending(dialect, response.text)
    # Before the first event, the same fault is a plain 502 in the dialect.
    fake.push(Reply(raw=[b"data: " + b"x" * 5000 + b"\n\n", FINISH]))
    response = await client.post(ROUTES[dialect], json=body_for(dialect, True))
    assert response.status_code == 502 and "1024-byte limit" in response.text


# ---------------------------------------------------------------------------------------------
# Bad upstream data is an error, not a shorter success

CUT = chunk({"content": "lost half"})[:20] + b"\n\n"  # a chunk cut in half
BAD_STREAMS = {
    "garbage": ([FIRST, b"data: garbage\n\n", FINISH], "not a JSON object"),
    "cut-chunk": ([FIRST, CUT, FINISH], "not a JSON object"),
    "not-an-object": ([FIRST, b"data: [1, 2]\n\n", FINISH], "not a JSON object"),
    "done-without-finish": ([FIRST, b"data: [DONE]\n\n"], "without a finish_reason"),
}


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("case", list(BAD_STREAMS))
async def test_bad_upstream_sse_ends_the_stream_with_an_error_event(client, fake, dialect, case):
    raw, message = BAD_STREAMS[case]
    fake.push(Reply(raw=raw))
    response = await client.post(ROUTES[dialect], json=body_for(dialect, True))
    assert response.status_code == 200
    assert message in error_ending(dialect, response.text)


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("raw", [b'{"choices": [{"message": {"content": "cut', b"garbage", b"[1]"])
async def test_an_invalid_upstream_json_body_is_a_502_in_the_dialect(client, fake, dialect, raw):
    fake.push(Reply(raw=[raw]))
    response = await client.post(ROUTES[dialect], json=body_for(dialect))
    assert response.status_code == 502
    body = response.json()
    message = body["error"]["message"]
    assert (body.get("type") == "error") == (dialect == "anthropic")
    assert "not JSON" in message or "not an object" in message


# ---------------------------------------------------------------------------------------------
# Upstream 429: when to retry reaches the client


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("stream", [False, True])
async def test_an_upstream_429_passes_its_retry_after_through(client, fake, dialect, stream):
    fake.push(
        Reply(status=429, error="too many requests", headers={"Retry-After": "7", "retry-after-ms": "7000"})
    )
    response = await client.post(ROUTES[dialect], json=body_for(dialect, stream))
    assert response.status_code == 429
    assert response.headers["retry-after"] == "7" and response.headers["retry-after-ms"] == "7000"
    body = response.json()
    error = body["error"]
    assert error["type"] == "rate_limit_error" and (body.get("type") == "error") == (dialect == "anthropic")
    assert error["message"] == "too many requests (retry after 7)"


# ---------------------------------------------------------------------------------------------
# Deep JSON: refused before the engine is called


def nested(depth: int) -> object:
    """`depth` objects, one inside the other."""
    value: object = "leaf"
    for _ in range(depth):
        value = {"k": value}
    return value


def test_orjson_writes_exactly_the_depth_k3_assumes():
    orjson.dumps(nested(ORJSON_MAX_DEPTH))
    with pytest.raises(orjson.JSONEncodeError):
        orjson.dumps(nested(ORJSON_MAX_DEPTH + 1))
    assert not nests_deeper(nested(10), 10) and nests_deeper(nested(11), 10)
    assert not nests_deeper([[1, {"a": []}], "x"], 4) and nests_deeper([[1, {"a": []}], "x"], 3)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("dialect", "field"),
    [
        ("responses", "tool_choice"),
        ("responses", "metadata"),
        ("anthropic", "metadata"),
        ("chat", "metadata"),
    ],
)
@pytest.mark.parametrize("depth", [130, 254, 300])
async def test_json_nested_too_deep_is_a_400_before_the_engine_is_called(
    client, fake, dialect, field, stream, depth
):
    response = await client.post(ROUTES[dialect], json=body_for(dialect, stream, **{field: nested(depth)}))
    assert response.status_code == 400 and response.headers["content-type"] == "application/json"
    assert "nests deeper than 128" in response.json()["error"]["message"]
    assert fake.requests == []


async def test_json_nested_to_the_limit_is_served(client, fake):
    # The body object is level 1; Responses echoes metadata back inside its envelope.
    response = await client.post(
        ROUTES["responses"], json=body_for("responses", True, metadata=nested(MAX_JSON_DEPTH - 1))
    )
    assert response.status_code == 200 and response.text.rstrip().endswith("}")
    assert "response.completed" in response.text and len(fake.requests) == 1


# ---------------------------------------------------------------------------------------------
# Credentials in --upstream and keys: never shown


async def test_upstream_credentials_are_sent_as_basic_auth_and_never_shown(make_client, fake):
    client = make_client(upstream="http://alice:s3cr%40t@fake/v1", api_key="k")
    assert (
        await client.post(ROUTES["chat"], json=body_for("chat"), headers={"x-api-key": "k"})
    ).status_code == 200
    assert fake.request_headers[-1]["authorization"] == "Basic YWxpY2U6czNjckB0"  # alice:s3cr@t
    health = await client.get("/health", headers={"x-api-key": "k"})
    assert health.json()["upstream"] == "http://fake/v1"
    # An unreachable upstream's error names the URL, without its credentials.
    dead = create_app(Config(upstream="http://alice:s3cret@127.0.0.1:1/v1", connect_timeout=2))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(dead), base_url="http://k3") as http:
        for dialect in DIALECTS:
            for stream in (False, True):
                response = await http.post(ROUTES[dialect], json=body_for(dialect, stream))
                assert response.status_code == 502 and "127.0.0.1:1" in response.text
                assert "s3cret" not in response.text and "alice" not in response.text
        health = await http.get("/health")
        assert health.json() == {"status": "degraded"}


# ---------------------------------------------------------------------------------------------
# `k3 serve` as a process: SIGTERM mid-stream, and what it prints


@contextmanager
def k3_serve(*args: str) -> Iterator[tuple[subprocess.Popen[str], str, list[str]]]:
    """`k3 serve --port 0 ARGS` from this checkout: (the process, its base URL, its banner lines)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "k3", "serve", "--port", "0", *args]
    process = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        banner: list[str] = []
        while not banner or not banner[-1].startswith("k3 listening on "):
            line = process.stdout.readline()  # type: ignore[union-attr]
            assert line, f"k3 serve exited: {process.communicate(timeout=10)}"
            banner.append(line.strip())
        yield process, banner[-1].removeprefix("k3 listening on "), banner
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=10)


async def test_sigterm_drains_streams_then_ends_the_rest_with_an_error_event(live, tmp_path):
    fake, engine = live
    engine = engine.replace("http://", "http://alice:s3cret@")
    fake.push(
        Reply(reasoning="a long think", content="x" * 400, chunk_chars=4, delay=0.05),  # ~5 s
        Reply(reasoning="a short think", content="quick answer", chunk_chars=4, delay=0.1),  # ~0.8 s
        Reply(content="a slow JSON answer", delay=5.0),
    )
    ledger = tmp_path / "ledger.db"
    args = ["--upstream", engine, "--api-key", "topsecret-key", "--upstream-api-key", "engine-key-xyz"]
    args += ["--ledger", str(ledger)]
    args += ["--state-dir", str(tmp_path / "state"), "--shutdown-grace", "1.5", "--log-level", "debug"]
    with k3_serve(*args) as (process, base, banner):
        auth = {"x-api-key": "topsecret-key"}
        async with httpx.AsyncClient(base_url=base, headers=auth, timeout=30) as http:
            request = body_for("anthropic", True)
            async with http.stream("POST", ROUTES["anthropic"], json=request) as long:
                long_pieces = long.aiter_bytes()
                long_text = await anext(long_pieces)  # under way
                async with http.stream("POST", ROUTES["anthropic"], json=request) as short:
                    short_pieces = short.aiter_bytes()
                    short_text = await anext(short_pieces)
                    slow = asyncio.ensure_future(http.post(ROUTES["chat"], json=body_for("chat")))
                    while len(fake.requests) < 3:
                        await asyncio.sleep(0.01)
                    process.send_signal(signal.SIGTERM)
                    short_text += b"".join([piece async for piece in short_pieces])
                long_text += b"".join([piece async for piece in long_pieces])
            slow_json = await slow
        out, err = process.communicate(timeout=20)
    assert process.returncode in (0, -signal.SIGTERM), err  # uvicorn re-raises the signal once done
    # The short turn finished within the grace: a whole message the SDK accepts.
    message = anthropic_stream(short_text.decode())
    assert message.stop_reason == "end_turn" and message.content[-1].text == "quick answer"
    # The long one was ended with an error event of its dialect, not a cut body.
    assert "shutting down" in error_ending("anthropic", long_text.decode())
    assert slow_json.status_code == 503 and "shutting down" in slow_json.json()["error"]["message"]
    assert "Traceback" not in err and "ProgrammingError" not in err and "Exception in ASGI" not in err
    # The finished turn's reasoning was written before the ledger closed; the cut one's was not.
    with sqlite3.connect(ledger) as db:
        assert db.execute("SELECT COUNT(*) FROM entries").fetchone() == (1,)
    # Neither the upstream's credentials nor the client key appear in anything k3 printed.
    printed = "\n".join(banner) + out + err
    assert "127.0.0.1" in printed and "s3cret" not in printed and "alice" not in printed
    assert "topsecret-key" not in printed and "engine-key-xyz" not in printed
