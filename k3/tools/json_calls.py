"""The whole reply is a JSON tool call, or a list of them, optionally in a code fence.

    {"name": "get_weather", "arguments": {"city": "Beijing"}}
    ```json
    [{"name": "a", "arguments": {}}, {"name": "b", "parameters": {"x": 1}}]
    ```

A reply that starts any other way is streamed as text at once. A JSON value is buffered until
it closes; if it is not a call (or a call list) the reply latches to text there and then. A call
is only emitted at finish, because anything but whitespace (or the closing fence) after it makes
the whole reply text. Argument strings are the model's raw JSON bytes. When the request declares
tools, only their names count as calls.
"""

from __future__ import annotations

import re

from k3.tools.arguments import JSON_ERRORS, call_from_members, parse_members, skip_ws
from k3.tools.events import Event, Text, ToolCall
from k3.tools.ids import new_call_id
from k3.tools.schemas import parameter_names

FENCE = "```"
_FENCE_LINE = re.compile(r"```[\w+.-]*[ \t]*\r?\n")
_FENCE_LINE_PREFIX = re.compile(r"```[\w+.-]*[ \t]*\r?")


def _parse_calls(text: str, known: dict[str, list[str]]) -> list[tuple[str, str]] | None:
    """[(name, arguments)] when `text` is exactly one call object or a non-empty list of them."""
    try:
        if text.startswith("{"):
            members, end = parse_members(text, 0)
            items, pos = [call_from_members(members)], end
        else:
            items, pos = [], skip_ws(text, 1)
            while True:
                members, end = parse_members(text, pos)
                items.append(call_from_members(members))
                pos = skip_ws(text, end)
                if text[pos : pos + 1] == "]":
                    pos += 1
                    break
                if text[pos : pos + 1] != ",":
                    return None
                pos = skip_ws(text, pos + 1)
    except JSON_ERRORS:
        return None
    calls = [item for item in items if item is not None]
    if pos != len(text) or len(calls) != len(items):
        return None
    if known and any(name not in known for name, _ in calls):
        return None
    return calls


class JsonCallParser:
    def __init__(self, tools: list[dict] | None = None) -> None:
        self._known = parameter_names(tools)
        self._state = "lead"  # lead | value | tail | text
        self._lead = ""  # undecided opening: whitespace, maybe a fence line
        self._value: list[str] = []  # the JSON value so far
        self._tail = ""  # after the value: whitespace, maybe the closing fence
        self._fenced = False
        self._depth = 0
        self._in_string = False
        self._escaped = False
        self._calls: list[tuple[str, str]] = []

    def feed(self, chunk: str) -> list[Event]:
        if self._state == "text":
            return [Text(chunk)] if chunk else []
        if self._state == "lead":
            self._lead += chunk
            chunk = self._decide_lead()
        if self._state == "value":
            chunk = self._scan_value(chunk)
        self._tail += chunk  # empty unless the value has closed
        if self._state == "tail" and not self._tail_ok():
            self._state = "latch"
        return self._latch_text() if self._state == "latch" else []

    def finish(self) -> list[Event]:
        state, held = self._state, self._held()
        self._state, self._lead, self._value, self._tail = "text", "", [], ""
        if state == "tail":
            return [ToolCall(new_call_id(), name, args) for name, args in self._calls]
        return [Text(held)] if held else []

    def _held(self) -> str:
        return self._lead + "".join(self._value) + self._tail

    def _latch_text(self) -> list[Event]:
        held = self._held()
        self._state, self._lead, self._value, self._tail = "text", "", [], ""
        return [Text(held)] if held else []

    def _decide_lead(self) -> str:
        """Classify the opening; returns the text that belongs to the JSON value, if one started."""
        lead = self._lead
        start = skip_ws(lead)
        rest = lead[start:]
        if not rest or FENCE.startswith(rest):
            return ""  # still undecided (a one- or two-backtick prefix may become a fence)
        if rest.startswith(FENCE):
            line = _FENCE_LINE.match(rest)
            if line is None:
                if not _FENCE_LINE_PREFIX.fullmatch(rest):
                    self._state = "latch"
                return ""
            start = skip_ws(lead, start + line.end())
            if start == len(lead):
                return ""
            self._fenced = True
        if lead[start] not in "{[":
            self._state = "latch"
            return ""
        self._state, self._lead = "value", lead[:start]
        return lead[start:]

    def _scan_value(self, chunk: str) -> str:
        """Track nesting incrementally; when the top-level value closes, decide call or text.

        Returns the part of `chunk` after the value.
        """
        for pos, char in enumerate(chunk):
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif char == "\\":
                    self._escaped = True
                elif char == '"':
                    self._in_string = False
            elif char == '"':
                self._in_string = True
            elif char in "{[":
                self._depth += 1
            elif char in "}]":
                self._depth -= 1
                if self._depth == 0:
                    self._value.append(chunk[: pos + 1])
                    self._calls = _parse_calls("".join(self._value), self._known) or []
                    self._state = "tail" if self._calls else "latch"
                    return chunk[pos + 1 :]
        self._value.append(chunk)
        return ""

    def _tail_ok(self) -> bool:
        tail = self._tail.lstrip()
        if not tail:
            return True
        return self._fenced and (FENCE.startswith(tail) or (tail.startswith(FENCE) and not tail[3:].strip()))
