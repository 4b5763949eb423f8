"""Upstream OpenAI-Chat chunks -> the canonical event stream (see k3.ir for the contract).

The engine's streamed `content` text goes through exactly one text parser per turn, built by
`make_text_parser` from the k3.tools parsers (`--tool-parser`), wrapped in a `ThinkSplitter` when
the engine writes reasoning inline (`--reasoning-field think` or `auto`). A parser returns
`Text`, `Reasoning` and complete `ToolCall` events; the pipeline turns each call into
ToolCallStart/ToolCallDelta/ToolCallEnd with its own index, closes open reasoning before visible
output, and upgrades a plain `stop` to `tool_calls`. Native `tool_calls` deltas from the engine
(streamed arguments, parallel calls, interleaved indices) are handled here whatever the parser.
`reasoning_content` and `reasoning` delta keys are always read.

Reasoning segments close in one place, `Translator._close_reasoning`, which asks the optional
`sign` callback for the segment's signature (Anthropic signature, Responses encrypted_content).

A non-streaming upstream reply is first turned into one synthetic chunk
(`completion_to_chunk`), so both modes run through the same code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from k3.errors import ProxyError
from k3.ir import (
    CanonicalResponse,
    Event,
    Finish,
    Part,
    ReasoningDelta,
    ReasoningEnd,
    ReasoningPart,
    StopReason,
    TextDelta,
    TextPart,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallPart,
    ToolCallStart,
    Usage,
)
from k3.reasoning.fingerprint import visible_text
from k3.tools import Parser, Reasoning, Text, ThinkSplitter, make_parser
from k3.tools.ids import new_call_id
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


class _NativeCall:
    __slots__ = ("id", "name", "args", "sent", "index", "started", "closed")

    def __init__(self) -> None:
        self.id = ""
        self.name = ""
        self.args: list[str] = []
        self.sent = 0  # how many fragments of `args` were already emitted
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


def parse_usage(raw: dict[str, Any]) -> Usage:
    prompt = raw.get("prompt_tokens", raw.get("input_tokens"))
    completion = raw.get("completion_tokens", raw.get("output_tokens"))
    prompt_details = raw.get("prompt_tokens_details")
    completion_details = raw.get("completion_tokens_details")
    return Usage(
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
        parser_vehicle: str = "think",
    ):
        self._parser = parser
        self._plain = type(parser) is PassthroughParser  # content is all visible text: no parser call
        self._sign = sign
        self._parser_vehicle = parser_vehicle  # what reasoning found in the text is called
        self.vehicle: str | None = None  # where this reply's reasoning came from (for auto / stats)
        self._stop = stop or ()
        self._input_estimate = input_estimate
        self._reasoning: list[str] | None = None  # the open reasoning segment
        self._calls: dict[int, _NativeCall] = {}
        self._active: _NativeCall | None = None  # the native call whose deltas stream now
        self._next_index = 0
        self._usage: Usage | None = None
        self._finish_reason: str | None = None
        self._stop_sequence: str | None = None
        self.tool_calls = 0  # calls announced so far
        self._chars = 0  # visible + reasoning characters, for the usage estimate

    # -- upstream side -------------------------------------------------------------------------

    def feed(self, chunk: dict[str, Any]) -> list[Event]:
        out: list[Event] = []
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
                if self.vehicle is None:
                    self.vehicle = key
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
                    if isinstance(fragment, dict):
                        self._native(fragment, out)
        reason = choice.get("finish_reason")
        if reason and isinstance(reason, str):
            self._finish_reason = reason
            stop_reason = choice.get("stop_reason")
            if isinstance(stop_reason, str) and stop_reason in self._stop:
                self._stop_sequence = stop_reason
        return out

    def finish(self) -> list[Event]:
        out: list[Event] = []
        self._apply(self._parser.finish(), out)
        self._close_reasoning(out)
        self._close_active(out)
        for call in self._calls.values():
            if not call.closed and call.name:  # a call the engine never named cannot be run: dropped
                self._start(call, out)
                self._close(call, out)
        stop: StopReason = _FINISH.get(self._finish_reason or "stop", "stop")  # type: ignore[assignment]
        if self.tool_calls and stop == "stop":
            stop = "tool_calls"
        usage = self._usage
        if usage is None:  # the engine sent none: a documented chars/4 estimate
            usage = Usage(
                input_tokens=self._input_estimate,
                output_tokens=max(1, self._chars // 4) if self._chars else 0,
            )
        out.append(Finish(stop, usage, self._stop_sequence if stop == "stop" else None))
        return out

    # -- helpers --------------------------------------------------------------------------------

    def _reason(self, text: str, out: list[Event]) -> None:
        if self._reasoning is None:
            self._reasoning = []
        self._reasoning.append(text)
        self._chars += len(text)
        out.append(ReasoningDelta(text))

    def _close_reasoning(self, out: list[Event]) -> None:
        if self._reasoning is not None:
            text = "".join(self._reasoning)
            out.append(ReasoningEnd(text, self._sign(text) if self._sign is not None else None))
            self._reasoning = None

    def _visible(self, text: str, out: list[Event]) -> None:
        self._close_active(out)
        self._close_reasoning(out)
        self._chars += len(text)
        out.append(TextDelta(text))

    def _apply(self, events: list[Any], out: list[Event]) -> None:
        for event in events:
            if isinstance(event, Text):
                if event.text:
                    self._visible(event.text, out)
            elif isinstance(event, Reasoning):
                if event.text:
                    if self.vehicle is None:
                        self.vehicle = self._parser_vehicle
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
                out.append(ToolCallStart(index, call_id, event.name))
                if event.arguments:
                    out.append(ToolCallDelta(index, event.arguments))
                out.append(ToolCallEnd(index, call_id, event.name, event.arguments))

    def _native(self, fragment: dict[str, Any], out: list[Event]) -> None:
        key = fragment.get("index")
        if not isinstance(key, int) or isinstance(key, bool):
            # No index: a fragment with a new id opens a call, one without continues the last.
            continues = self._calls and not fragment.get("id")
            key = next(reversed(self._calls)) if continues else max(self._calls, default=-1) + 1
        call = self._calls.get(key)
        if call is None:
            call = self._calls[key] = _NativeCall()
        elif call.closed:
            raise ProxyError(
                502,
                f"upstream sent more of tool call {key} after starting another one",
                code="upstream_protocol",
            )
        call_id = fragment.get("id")
        if isinstance(call_id, str) and call_id and not call.started:
            call.id = call_id
        function = fragment.get("function")
        if isinstance(function, dict):
            name = function.get("name")
            # Names may arrive split; some engines repeat the whole name on every delta.
            if isinstance(name, str) and name and not call.started and name != call.name:
                call.name += name
            args = function.get("arguments")
            if isinstance(args, str) and args:
                call.args.append(args)
                self._chars += len(args)
            elif isinstance(args, dict):  # a few engines send an object; keep it as JSON text
                call.args.append(orjson.dumps(args).decode())
        if call is not self._active:
            if not call.name or not call.args:
                return  # hold the start until the name is whole and arguments have begun
            self._close_active(out)
            self._close_reasoning(out)
            self._start(call, out)
            self._active = call
        if call.sent < len(call.args):
            out.append(ToolCallDelta(call.index, "".join(call.args[call.sent :])))
            call.sent = len(call.args)

    def _start(self, call: _NativeCall, out: list[Event]) -> None:
        if call.started:
            return
        call.started = True
        call.index = self._next_index
        self._next_index += 1
        self.tool_calls += 1
        if not call.id:
            call.id = new_call_id()
        out.append(ToolCallStart(call.index, call.id, call.name))

    def _close(self, call: _NativeCall, out: list[Event]) -> None:
        if call.sent < len(call.args):
            out.append(ToolCallDelta(call.index, "".join(call.args[call.sent :])))
            call.sent = len(call.args)
        call.closed = True
        out.append(ToolCallEnd(call.index, call.id, call.name, "".join(call.args)))

    def _close_active(self, out: list[Event]) -> None:
        if self._active is not None:
            self._close(self._active, out)
            self._active = None


class Collector:
    """Folds the event stream into a CanonicalResponse (JSON egress). Parts keep stream order."""

    __slots__ = ("parts", "_text", "finish")

    def __init__(self) -> None:
        self.parts: list[Part] = []
        self._text: list[str] = []
        self.finish: Finish | None = None

    def add(self, event: Event) -> None:
        if isinstance(event, TextDelta):
            self._text.append(event.text)
        elif isinstance(event, ReasoningDelta):
            self._flush_text()
        elif isinstance(event, ReasoningEnd):
            self.parts.append(ReasoningPart(event.text, event.signature))
        elif isinstance(event, ToolCallEnd):
            self._flush_text()
            self.parts.append(ToolCallPart(event.id, event.name, event.arguments))
        elif isinstance(event, Finish):
            self._flush_text()
            self.finish = event

    def _flush_text(self) -> None:
        if self._text:
            self.parts.append(TextPart("".join(self._text)))
            self._text = []

    def response(self) -> CanonicalResponse:
        finish = self.finish or Finish("stop", Usage())
        return CanonicalResponse(self.parts, finish.stop_reason, finish.usage, finish.stop_sequence)
