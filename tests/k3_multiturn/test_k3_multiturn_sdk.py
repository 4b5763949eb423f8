"""Multi-turn tool conversations through k3 with the official SDKs, for every dialect, streaming
and not, every tool format and every reasoning field: the engine's second request must carry the
original reasoning (in the configured field) and the tool arguments byte for byte."""

from __future__ import annotations

import httpx
import pytest
from conversation import ARGUMENTS, CHAT_TOOL, CONVERSATIONS, REASONING, RESULT

from k3.testing.fake_upstream import Reply, ToolCall, model_text
from k3.tools import ToolCall as ParsedCall
from k3.tools import make_parser

# (how the engine writes tool calls, --reasoning-field, where the engine puts reasoning)
CASES = [
    ("native", "reasoning_content", "reasoning_content"),
    ("kimi", "reasoning", "reasoning"),
    ("hermes", "think", "think"),
    ("kimi_k3", "kimi_k3", "kimi_k3"),
    ("json", "none", "reasoning_content"),
    ("pythonic", "auto", "think"),
    ("native", "auto", "reasoning"),
]
CLIENT_ID_PREFIX = {
    "anthropic": "toolu_",
    "responses": "call_",
    "chat": "",
}  # plain engine ids pass Chat as they are


def engine_arguments(reply: Reply) -> str:
    """The argument string the engine's text gives (the raw JSON, except pythonic's literals)."""
    if reply.tool_format == "native":
        return reply.tool_calls[0].arguments
    parser = make_parser(reply.tool_format, [CHAT_TOOL])
    events = parser.feed(model_text(Reply(tool_calls=reply.tool_calls, tool_format=reply.tool_format)))
    return next(e for e in events + parser.finish() if isinstance(e, ParsedCall)).arguments


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("dialect", list(CONVERSATIONS))
@pytest.mark.parametrize(("tool_format", "field", "engine_key"), CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_second_turn_restores_reasoning_and_exact_arguments(
    engine, proxy, dialect, stream, tool_format, field, engine_key
):
    base = proxy(tool_parser=None if tool_format == "native" else tool_format, reasoning_field=field)
    content = "" if tool_format in ("json", "pythonic") else "Let me look."
    first = Reply(
        content=content,
        reasoning=REASONING,
        reasoning_key=engine_key,
        tool_calls=[ToolCall("read_file", ARGUMENTS, id="call_up1")],
        tool_format=tool_format,
        chunk_chars=5,
    )
    engine.push(first, Reply(content="Done."))

    seen = CONVERSATIONS[dialect](base, stream)

    # Turn 1 reached the client in its own form.
    assert seen.arguments == {"path": "src/ä.py", "limit": 2}
    assert seen.reasoning == REASONING
    if dialect != "chat":
        assert seen.signature and seen.signature.startswith("k3s1.")
    assert seen.call_id.startswith(CLIENT_ID_PREFIX[dialect])
    if tool_format == "native":
        assert seen.upstream_call_id == "call_up1"
    elif tool_format == "kimi":
        assert seen.upstream_call_id == "functions.read_file:0"  # K2's own header is the id
        assert "functions." not in seen.call_id  # the client sees a proxy id, never K2's own

    # Turn 2 gave the engine back its own message.
    assert len(engine.requests) == 2
    messages = engine.requests[1]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[2] == {"role": "tool", "tool_call_id": seen.upstream_call_id, "content": RESULT}
    call = {"id": seen.upstream_call_id, "type": "function"}
    call["function"] = {"name": "read_file", "arguments": engine_arguments(first)}
    expected = {"role": "assistant", "content": content, "tool_calls": [call]}
    sent_in = engine_key if field == "auto" else field
    if sent_in in ("reasoning_content", "kimi_k3"):
        expected["reasoning_content"] = REASONING
    elif sent_in == "reasoning":
        expected["reasoning"] = REASONING
    elif sent_in == "think":
        expected["content"] = f"<think>{REASONING}</think>{content}"
    assert messages[1] == expected


def test_stats_report_the_ledger_and_the_reasoning_fields_seen(engine, proxy):
    base = proxy(reasoning_field="auto", show_reasoning=False)
    for key in ("reasoning", "think"):
        engine.push(
            Reply(
                content="Let me look.",
                reasoning=REASONING,
                reasoning_key=key,
                tool_calls=[ToolCall("read_file", ARGUMENTS)],
            ),
            Reply(content="Done."),
        )
        seen = CONVERSATIONS["anthropic"](base, stream=True)
        assert seen.reasoning == "" and seen.signature is None  # hidden, yet restored below
        assert engine.requests[-1]["messages"][1]["tool_calls"][0]["function"]["arguments"] == ARGUMENTS
    stats = httpx.get(f"{base}/k3/stats", timeout=10).json()
    assert stats["by_preset"] == {"anthropic": 4}
    assert stats["reasoning_fields"] == {"anthropic": {"reasoning": 1, "think": 1}}
    ledger = stats["ledger"]
    assert ledger["entries"] == 2 and ledger["fingerprint_hits"] == 2 and ledger["hits"] == 0
    assert ledger["rejected_signatures"] == 0
