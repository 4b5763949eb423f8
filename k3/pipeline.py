"""Upstream OpenAI-Chat chunks -> the canonical event stream (see k3.ir for the contract).

The engine's streamed `content` text goes through exactly one text parser per turn, built by
`make_text_parser` from the k3.tools parsers (`--tool-parser`), wrapped in a `ThinkSplitter` when
the engine writes reasoning inline (`--reasoning-field think` or `auto`). A parser returns
`Text`, `Reasoning` and complete `ToolCall` events; the pipeline turns each call into
ToolCallStart/ToolCallDelta/ToolCallEnd with its own index, closes open reasoning before visible
output, and upgrades a plain `stop` to `tool_calls`. Native `tool_calls` deltas from the engine
are folded by `k3.tools.native.NativeToolCalls` (its rules: ids, split or repeated names, items
without an index) whatever the parser; the pipeline streams each call once it has a name and
arguments, one call at a time (more of a call after the next one started is a 502).
`reasoning_content` and `reasoning` delta keys are always read.

Reasoning segments close in one place, `Translator._close_reasoning`, which asks the optional
`sign` callback for the segment's signature (Anthropic signature, Responses encrypted_content).

A non-streaming upstream reply is first turned into one synthetic chunk
(`completion_to_chunk`), so both modes run through the same code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from k3 import ir
from k3.errors import ProxyError
from k3.reasoning.fingerprint import visible_text
from k3.tokens import rough_tokens
from k3.tools import Parser, Reasoning, Text, ThinkSplitter, make_parser
from k3.tools.ids import new_call_id
from k3.tools.native import NativeToolCalls
from k3.tools.passthrough import PassthroughParser


def make_text_parser(
    tool_parser: str, reasoning_field: str, tools: Callable[[], list[dict]] | None = None
) -> Parser:
    """A fresh parser for one turn. `tools` gives the request's OpenAI-Chat tool definitions
    (only the `json` and `pythonic` parsers read them, so they are built only then)."""
    parser = make_parser(
        tool_parser, tools() if tools is not None and tool_parser in ("json", "pythonic") else None
    )
    if reasoning_field in ("think", "auto"):
        parser = ThinkSplitter(parser)
    return parser


_FINISH = {
    "stop": "stop",
    "eos": "stop",
    "end_turn": "stop",
    "length": "length",
    "max_tokens": "length",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "tool_use": "tool_calls",
    "content_filter": "content_filter",
}


class _Emission:
    """How far one native call has reached the client."""

    __slots__ = ("sent", "index", "started", "closed")

    def __init__(self) -> None:
        self.sent = 0  # how many argument pieces were already emitted
        self.index = -1  # our output index, assigned at start
        self.started = False
        self.closed = False


def completion_to_chunk(completion: dict[str, Any]) -> dict[str, Any]:
    """A non-streaming chat.completion as one streaming-shaped chunk (message -> delta)."""
    choices = completion.get("choices")
    chunk: dict[str, Any] = {"usage": completion.get("usage")}
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        choice = choices[0]
        message = choice.get("message")
        delta = dict(message) if isinstance(message, dict) else {}
        calls = delta.get("tool_calls")
        if isinstance(calls, list):
            delta["tool_calls"] = [
                {**call, "index": call.get("index", i)}
                for i, call in enumerate(calls)
                if isinstance(call, dict)
            ]
        chunk["choices"] = [
            {
                "index": 0,
                "delta": delta,
                "finish_reason": choice.get("finish_reason"),
                "stop_reason": choice.get("stop_reason"),
            }
        ]
    return chunk


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def parse_usage(raw: dict[str, Any]) -> ir.Usage:
    prompt = raw.get("prompt_tokens", raw.get("input_tokens"))
    completion = raw.get("completion_tokens", raw.get("output_tokens"))
    prompt_details = raw.get("prompt_tokens_details")
    completion_details = raw.get("completion_tokens_details")
    return ir.Usage(
        input_tokens=_int(prompt),
        output_tokens=_int(completion),
        cached_input_tokens=_int(prompt_details.get("cached_tokens"))
        if isinstance(prompt_details, dict)
        else 0,
        reasoning_tokens=_int(completion_details.get("reasoning_tokens"))
        if isinstance(completion_details, dict)
        else 0,
    )


class Translator:
    """Stateful, one per turn: `feed(chunk)` for each upstream chunk, then `finish()` once."""

    def __init__(
        self,
        parser: Parser,
        stop: list[str] | None = None,
        input_estimate: int = 0,
        sign: Callable[[str], str] | None = None,
        parser_field: str = "think",
    ):
        self._parser = parser
        self._plain = type(parser) is PassthroughParser  # content is all visible text: no parser call
        self._sign = sign
        self._parser_field = parser_field  # what reasoning found in the text is called
        self.reasoning_field: str | None = None  # where this reply's reasoning came from (for auto / stats)
        self._stop = stop or ()
        self._input_estimate = input_estimate
        self._reasoning: list[str] | None = None  # the open reasoning segment
        self._native = NativeToolCalls()  # the folding rules (k3.tools.native)
        self._emitted: dict[int, _Emission] = {}  # per folded call, keyed like the fold
        self._active: int | None = None  # the native call whose deltas stream now
        self._next_index = 0
        self._usage: ir.Usage | None = None
        self.usage: ir.Usage | None = None  # the reply's, as finish() reported it
        self._finish_reason: str | None = None
        self._stop_sequence: str | None = None
        self.tool_calls = 0  # calls announced so far
        self._chars = 0  # visible + reasoning characters, for the usage estimate

    # -- upstream side -------------------------------------------------------------------------

    def feed(self, chunk: dict[str, Any]) -> list[ir.Event]:
        out: list[ir.Event] = []
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self._usage = parse_usage(usage)
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices:
            return out
        choice = choices[0]
        if not isinstance(choice, dict):
            return out
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            delta = choice.get("message")
        if isinstance(delta, dict):
            reasoning = delta.get("reasoning_content")
            key = "reasoning_content"
            if not reasoning:
                reasoning, key = delta.get("reasoning"), "reasoning"
            if reasoning and isinstance(reasoning, str):
                if self.reasoning_field is None:
                    self.reasoning_field = key
                self._close_active(out)
                self._reason(reasoning, out)
            content = delta.get("content")
            if content:
                text = visible_text(content)
                if text:
                    if self._plain:
                        self._visible(text, out)
                    else:
                        self._apply(self._parser.feed(text), out)
            calls = delta.get("tool_calls")
            if calls and isinstance(calls, list):
                for fragment in calls:
                    self._native_fragment(fragment, out)
        reason = choice.get("finish_reason")
        if reason and isinstance(reason, str):
            self._finish_reason = reason
            stop_reason = choice.get("stop_reason")
            if isinstance(stop_reason, str) and stop_reason in self._stop:
                self._stop_sequence = stop_reason
        return out

    def finish(self) -> list[ir.Event]:
        out: list[ir.Event] = []
        self._apply(self._parser.finish(), out)
        self._close_reasoning(out)
        self._close_active(out)
        for key, emission in self._emitted.items():
            # A call the engine never named cannot be run: dropped.
            if not emission.closed and self._native[key].name:
                self._start(key, out)
                self._close(key, out)
        stop: ir.StopReason = _FINISH.get(self._finish_reason or "stop", "stop")  # type: ignore[assignment]
        if self.tool_calls and stop == "stop":
            stop = "tool_calls"
        usage = self._usage
        if usage is None:  # the engine sent none: a documented chars/4 estimate
            usage = ir.Usage(
                input_tokens=self._input_estimate,
                output_tokens=rough_tokens(self._chars) if self._chars else 0,
            )
        self.usage = usage
        out.append(ir.Finish(stop, usage, self._stop_sequence if stop == "stop" else None))
        return out

    # -- helpers --------------------------------------------------------------------------------

    def _reason(self, text: str, out: list[ir.Event]) -> None:
        if self._reasoning is None:
            self._reasoning = []
        self._reasoning.append(text)
        self._chars += len(text)
        out.append(ir.ReasoningDelta(text))

    def _close_reasoning(self, out: list[ir.Event]) -> None:
        if self._reasoning is not None:
            text = "".join(self._reasoning)
            out.append(ir.ReasoningEnd(text, self._sign(text) if self._sign is not None else None))
            self._reasoning = None

    def _visible(self, text: str, out: list[ir.Event]) -> None:
        self._close_active(out)
        self._close_reasoning(out)
        self._chars += len(text)
        out.append(ir.TextDelta(text))

    def _apply(self, events: list[Any], out: list[ir.Event]) -> None:
        for event in events:
            if isinstance(event, Text):
                if event.text:
                    self._visible(event.text, out)
            elif isinstance(event, Reasoning):
                if event.text:
                    if self.reasoning_field is None:
                        self.reasoning_field = self._parser_field
                    self._close_active(out)
                    self._reason(event.text, out)
            else:
                self._close_active(out)
                self._close_reasoning(out)
                index = self._next_index
                self._next_index += 1
                self.tool_calls += 1
                self._chars += len(event.arguments)
                call_id = event.id or new_call_id()
                out.append(ir.ToolCallStart(index, call_id, event.name))
                if event.arguments:
                    out.append(ir.ToolCallDelta(index, event.arguments))
                out.append(ir.ToolCallEnd(index, call_id, event.name, event.arguments))

    def _native_fragment(self, fragment: object, out: list[ir.Event]) -> None:
        key = self._native.fold(fragment)
        if key is None:
            return
        emission = self._emitted.setdefault(key, _Emission())
        if emission.closed:
            raise ProxyError(
                502,
                f"upstream sent more of tool call {key} after starting another one",
                code="upstream_protocol",
            )
        if key != self._active:
            call = self._native[key]
            if not call.name or not call.arguments:
                return  # hold the start until the name is whole and arguments have begun
            self._close_active(out)
            self._close_reasoning(out)
            self._start(key, out)
            self._active = key
        self._send_arguments(key, out)

    def _start(self, key: int, out: list[ir.Event]) -> None:
        emission = self._emitted[key]
        if emission.started:
            return
        emission.started = True
        emission.index = self._next_index
        self._next_index += 1
        self.tool_calls += 1
        call = self._native[key]
        out.append(ir.ToolCallStart(emission.index, call.mint_id(), call.name))

    def _send_arguments(self, key: int, out: list[ir.Event]) -> None:
        emission, pieces = self._emitted[key], self._native[key].arguments
        if emission.sent < len(pieces):
            text = "".join(pieces[emission.sent :])
            self._chars += len(text)
            out.append(ir.ToolCallDelta(emission.index, text))
            emission.sent = len(pieces)

    def _close(self, key: int, out: list[ir.Event]) -> None:
        self._send_arguments(key, out)
        emission, call = self._emitted[key], self._native[key]
        emission.closed = True
        out.append(ir.ToolCallEnd(emission.index, call.id, call.name, "".join(call.arguments)))

    def _close_active(self, out: list[ir.Event]) -> None:
        if self._active is not None:
            self._close(self._active, out)
            self._active = None


class Collector:
    """Folds the event stream into a CanonicalResponse (JSON egress). Parts keep stream order."""

    __slots__ = ("parts", "_text", "finish")

    def __init__(self) -> None:
        self.parts: list[ir.Part] = []
        self._text: list[str] = []
        self.finish: ir.Finish | None = None

    def add(self, event: ir.Event) -> None:
        if isinstance(event, ir.TextDelta):
            self._text.append(event.text)
        elif isinstance(event, ir.ReasoningDelta):
            self._flush_text()
        elif isinstance(event, ir.ReasoningEnd):
            self.parts.append(ir.ReasoningPart(event.text, event.signature))
        elif isinstance(event, ir.ToolCallEnd):
            self._flush_text()
            self.parts.append(ir.ToolCallPart(event.id, event.name, event.arguments))
        elif isinstance(event, ir.Finish):
            self._flush_text()
            self.finish = event

    def _flush_text(self) -> None:
        if self._text:
            self.parts.append(ir.TextPart("".join(self._text)))
            self._text = []

    def response(self) -> ir.CanonicalResponse:
        finish = self.finish or ir.Finish("stop", ir.Usage())
        return ir.CanonicalResponse(self.parts, finish.stop_reason, finish.usage, finish.stop_sequence)
