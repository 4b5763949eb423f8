"""Translating an engine's streamed deltas into canonical events, for each tool-call format (and the
`--tool-parser` that reads it) and each place an engine carries reasoning. One round is one whole
reply; `deltas` in the receipt gives the per-delta cost (median / deltas)."""

from __future__ import annotations

import pytest

from benchmarks.conftest import case
from k3.ir import ReasoningEnd, TextDelta, ToolCallEnd
from k3.pipeline import Translator, make_text_parser
from k3.testing.fake_upstream import FakeUpstream, Reply, ToolCall

TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command",
          "parameters": {"type": "object", "properties": {"command": {}, "timeout": {}}}}}]  # fmt: skip
REASONING = "The user wants the failing test fixed. First find which test fails, then read its source. " * 3
ANSWER = "The failure is in the tokenizer round trip; I will run the one test to see the traceback now. " * 3
CALL = ToolCall(
    "bash", '{"command": "pytest -q tests/k3/test_k3_pipeline.py -k round_trip", "timeout": 120000}'
)
PAYLOAD = {"model": "kimi-linear", "messages": [{"role": "user", "content": "fix it"}], "tools": TOOLS}

# tool format the engine writes -> the --tool-parser that reads it (native calls need none)
TOOL_FORMATS = {"native": "passthrough", "kimi_k3": "kimi_k3", "kimi": "kimi", "hermes": "hermes",
                "json": "json", "pythonic": "pythonic"}  # fmt: skip
# where the engine puts reasoning -> (--reasoning-field, --tool-parser)
REASONING_KEYS = {"reasoning_content": ("reasoning_content", "passthrough"),
                  "reasoning": ("reasoning", "passthrough"), "think": ("think", "passthrough"),
                  "kimi_k3": ("kimi_k3", "kimi_k3")}  # fmt: skip


def _translate(chunks, parser: str, field: str):
    translator = Translator(make_text_parser(parser, field, lambda: TOOLS))
    events = [e for chunk in chunks for e in translator.feed(chunk)]
    return events + translator.finish()


def _run(benchmark, name: str, reply: Reply, parser: str, field: str, **config):
    chunks = FakeUpstream().chunks(PAYLOAD, reply)
    events = _translate(chunks, parser, field)
    calls = [e for e in events if isinstance(e, ToolCallEnd)]
    assert [(c.name, c.arguments) for c in calls] == [(t.name, t.arguments) for t in reply.tool_calls]
    assert any(isinstance(e, ReasoningEnd) for e in events) == bool(reply.reasoning)
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == reply.content
    case(benchmark, name, area="k3", parser=parser, reasoning_field=field, deltas=len(chunks), **config)
    benchmark(_translate, chunks, parser, field)


@pytest.mark.parametrize("tool_format", TOOL_FORMATS)
def test_tool_call_deltas(benchmark, tool_format):
    text_only_calls = tool_format in ("json", "pythonic")  # these formats are the call list alone
    reply = Reply(reasoning=REASONING, content="" if text_only_calls else ANSWER, tool_calls=[CALL],
                  tool_format=tool_format)  # fmt: skip
    _run(benchmark, f"k3.deltas.tools.{tool_format}", reply, TOOL_FORMATS[tool_format], "reasoning_content",
         tool_format=tool_format)  # fmt: skip


@pytest.mark.parametrize("key", REASONING_KEYS)
def test_reasoning_deltas(benchmark, key):
    field, parser = REASONING_KEYS[key]
    reply = Reply(reasoning=REASONING, content=ANSWER, reasoning_key=key)
    _run(benchmark, f"k3.deltas.reasoning.{key}", reply, parser, field, reasoning_key=key)
