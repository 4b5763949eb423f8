"""The scripted engine (the fake engine's replies, played by the conformance upstream): its text formats are
what k3's parsers read, and it answers like an engine."""

import httpx
import orjson
import pytest

from common.listen import serve_in_thread
from k3.testing.fake_upstream import Reply, model_text
from k3.testing.fake_upstream import ToolCall as Call
from k3.tools import Reasoning, Text, ThinkSplitter, ToolCall, make_parser, merge_events
from runners.conformance.upstream import SIDE_ANSWER, ScriptedUpstream

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "shell",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]
CALL = Call("shell", '{"command":  "cat marker.txt"}', id="call_x")


def parse(parser, text: str, size: int = 5):
    events = []
    for i in range(0, len(text), size):
        events += parser.feed(text[i : i + size])
    return merge_events(events + parser.finish())


@pytest.mark.parametrize("fmt", ["kimi_k3", "kimi", "hermes", "json"])
def test_text_formats_parse_back_to_the_same_call_bytes(fmt):
    text = "" if fmt == "json" else "Reading."
    reply = Reply(content=text, tool_calls=[CALL], tool_format=fmt)
    events = parse(make_parser(fmt, TOOLS), model_text(reply))
    calls = [e for e in events if isinstance(e, ToolCall)]
    assert [(c.name, c.arguments) for c in calls] == [("shell", CALL.arguments)]
    assert [e.text for e in events if isinstance(e, Text)] == ([text] if text else [])
    assert CALL.arguments in model_text(reply)


def test_pythonic_format_carries_the_values():
    reply = Reply(tool_calls=[CALL], tool_format="pythonic")
    [call] = parse(make_parser("pythonic", TOOLS), model_text(reply))
    assert orjson.loads(call.arguments) == orjson.loads(CALL.arguments)


def test_kimi_k2_ids_and_native_ids_are_the_engines():
    assert Reply(tool_calls=[CALL], tool_format="kimi").expected_call_id(0) == "functions.shell:0"
    assert Reply(tool_calls=[CALL]).expected_call_id(0) == "call_x"
    assert Reply(tool_calls=[CALL], tool_format="hermes").expected_call_id(0) is None


def test_reasoning_in_the_text_fields():
    k3 = Reply(
        content="Hi.", reasoning="R <1>", tool_calls=[CALL], tool_format="kimi_k3", reasoning_key="kimi_k3"
    )
    events = parse(make_parser("kimi_k3"), model_text(k3))
    assert events[:2] == [Reasoning("R <1>"), Text("Hi.")]
    think = Reply(content="Hi.", reasoning="R <1>", reasoning_key="think")
    assert parse(ThinkSplitter(), model_text(think)) == [Reasoning("R <1>"), Text("Hi.")]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"tool_format": "nope"},
        {"tool_format": "json", "content": "x", "tool_calls": [CALL]},
        {"tool_format": "pythonic", "content": "x", "tool_calls": [CALL]},
    ],
)
def test_impossible_replies_are_refused(kwargs):
    with pytest.raises(ValueError):
        Reply(**kwargs)


@pytest.fixture
def engine():
    upstream = ScriptedUpstream()
    with serve_in_thread(upstream.app) as root, httpx.Client(base_url=root, timeout=10) as client:
        yield upstream, client


def sse(response) -> list[dict]:
    frames = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    assert frames[-1] == "[DONE]"
    return [orjson.loads(f) for f in frames[:-1]]


def test_streamed_turn_has_reasoning_text_and_call_deltas(engine):
    upstream, client = engine
    upstream.play([Reply(content="Reading the file.", reasoning="Think first.", tool_calls=[CALL])])
    body = {"model": "m", "messages": [], "stream": True, "stream_options": {"include_usage": True}}
    chunks = sse(client.post("/v1/chat/completions", json=body))
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Think first."
    assert "".join(d.get("content") or "" for d in deltas) == "Reading the file."
    pieces = [t for d in deltas for t in d.get("tool_calls", [])]
    assert pieces[0]["id"] == "call_x" and pieces[0]["function"]["name"] == "shell"
    assert "".join(p["function"]["arguments"] for p in pieces) == CALL.arguments
    assert len(pieces) > 2  # arguments arrive in several slices
    assert (
        chunks[-2]["choices"][0]["finish_reason"] == "tool_calls" and chunks[-1]["usage"]["total_tokens"] > 0
    )
    [exchange] = upstream.agent_requests()
    assert exchange.turn == 0 and exchange.body == body and upstream.unplayed() == 0


def test_json_turn_side_requests_and_an_exhausted_script(engine):
    upstream, client = engine
    upstream.play([Reply(content="first", reasoning="r", reasoning_key="reasoning")], side_when_no_tools=True)
    side = client.post("/v1/chat/completions", json={"messages": []}).json()
    assert side["choices"][0]["message"]["content"] == SIDE_ANSWER
    turn = client.post("/v1/chat/completions", json={"messages": [], "tools": TOOLS}).json()
    assert turn["choices"][0]["message"] == {"role": "assistant", "content": "first", "reasoning": "r"}
    extra = client.post("/v1/chat/completions", json={"messages": [], "tools": TOOLS})
    assert extra.status_code == 400 and "unexpected agent request #2" in extra.json()["error"]["message"]
    assert [(e.kind, e.turn) for e in upstream.exchanges] == [("side", None), ("agent", 0), ("agent", None)]


def test_error_replies_models_tokenize_and_unknown_routes(engine):
    upstream, client = engine
    upstream.play([Reply(error="engine broke", status=503)])
    failed = client.post("/v1/chat/completions", json={"messages": [], "stream": True})
    assert failed.status_code == 503 and failed.json()["error"]["message"] == "engine broke"
    assert client.get("/v1/models").json()["data"][0]["id"] == upstream.model
    assert (
        client.post("/tokenize", json={"messages": [{"role": "user", "content": "x" * 400}]}).json()["count"]
        > 1
    )
    assert client.get("/v2/nothing").status_code == 404
    assert [e.kind for e in upstream.exchanges] == ["agent", "models", "tokenize", "unknown"]


def test_a_client_retrying_a_scripted_failure_gets_the_same_failure_for_the_same_turn(engine):
    upstream, client = engine
    upstream.play([Reply(error="engine broke", status=400)])
    for _ in range(2):
        failed = client.post("/v1/chat/completions", json={"messages": [], "tools": TOOLS})
        assert failed.status_code == 400 and failed.json()["error"]["message"] == "engine broke"
    assert [(e.kind, e.turn) for e in upstream.exchanges] == [("agent", 0), ("agent", 0)]
