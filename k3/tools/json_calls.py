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

from k3.tools.arguments import JSON_ERRORS, call_from_members, parse_members
from k3.tools.events import Event, Text, ToolCall
from k3.tools.ids import new_call_id
from k3.tools.schemas import parameter_names

FENCE = "```"
_FENCE_LINE = re.compile(r"```[\w+.-]*[ \t]*\r?\n")
_FENCE_LINE_PREFIX = re.compile(r"```[\w+.-]*[ \t]*\r?")
_WS = re.compile(r"[ \t\n\r]*")


def _parse_calls(text: str, known: dict[str, list[str]]) -> list[tuple[str, str]] | None:
    """[(name, arguments)] when `text` is exactly one call object or a non-empty list of them."""
    try:
        if text.startswith("{"):
            members, end = parse_members(text, 0)
            items, pos = [call_from_members(members)], end
        else:
            items, pos = [], _WS.match(text, 1).end()
            while True:
                members, end = parse_members(text, pos)
                items.append(call_from_members(members))
                pos = _WS.match(text, end).end()
                if text[pos : pos + 1] == "]":
                    pos += 1
                    break
                if text[pos : pos + 1] != ",":
                    return None
                pos = _WS.match(text, pos + 1).end()
    except JSON_ERRORS:
        return None
    if pos != len(text) or not all(items):
        return None
    if known and any(name not in known for name, _ in items):
        return None
    return items


class JsonCallParser:
    def __init__(self, tools: list[dict] | None = None) -> None:
        self._known = parameter_names(tools)
        self._buf = ""
        self._state = "lead"  # lead | value | tail | text
        self._fenced = False
        self._start = 0  # where the JSON value begins in the buffer
        self._pos = 0  # how far the value has been scanned
        self._depth = 0
        self._in_string = False
        self._escaped = False
        self._calls: list[tuple[str, str]] = []

    def feed(self, chunk: str) -> list[Event]:
        if self._state == "text":
            return [Text(chunk)] if chunk else []
        self._buf += chunk
        return self._advance()

    def finish(self) -> list[Event]:
        out = self._advance()
        if self._state == "tail":
            out.extend(ToolCall(new_call_id(), name, args) for name, args in self._calls)
        elif self._state != "text" and self._buf:
            out.append(Text(self._buf))
        self._buf, self._state = "", "text"
        return out

    def _latch_text(self) -> list[Event]:
        out = [Text(self._buf)] if self._buf else []
        self._buf, self._state = "", "text"
        return out

    def _advance(self) -> list[Event]:
        if self._state == "lead":
            self._lead()
        if self._state == "value":
            self._scan_value()
        if self._state == "tail":
            self._check_tail()
        return self._latch_text() if self._state == "latch" else []

    def _lead(self) -> None:
        start = _WS.match(self._buf).end()
        rest = self._buf[start:]
        if not rest or FENCE.startswith(rest):
            return  # still undecided (a one- or two-backtick prefix may become a fence)
        if rest[0] in "{[":
            self._state, self._start, self._pos = "value", start, start
            return
        if rest.startswith(FENCE):
            line = _FENCE_LINE.match(rest)
            if line is None:
                if not _FENCE_LINE_PREFIX.fullmatch(rest):
                    self._state = "latch"
                return
            body = _WS.match(rest, line.end()).end()
            if body == len(rest):
                return
            if rest[body] in "{[":
                self._fenced = True
                self._state, self._start, self._pos = "value", start + body, start + body
                return
        self._state = "latch"

    def _scan_value(self) -> None:
        """Track nesting incrementally; when the top-level value closes, decide call or text."""
        buf = self._buf
        for pos in range(self._pos, len(buf)):
            char = buf[pos]
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
                    calls = _parse_calls(buf[self._start : pos + 1], self._known)
                    self._state = "tail" if calls else "latch"
                    self._calls, self._pos = calls or [], pos + 1
                    return
        self._pos = len(buf)

    def _check_tail(self) -> None:
        tail = self._buf[self._pos :].lstrip()
        if not tail:
            return
        if self._fenced and (FENCE.startswith(tail) or (tail.startswith(FENCE) and not tail[3:].strip())):
            return
        self._state = "latch"
