"""Hermes / Qwen style: `<tool_call>{"name": …, "arguments": {…}}</tool_call>` anywhere in the text.

The tags are ordinary text here: a call whose body is not a valid call object is shown verbatim,
tags included, so the user sees what the model wrote.
"""

from __future__ import annotations

from k3.tools.arguments import JSON_ERRORS, call_from_members, parse_members
from k3.tools.events import Event, Text, ToolCall
from k3.tools.ids import new_call_id
from k3.tools.scan import find_first, held_suffix, rescan_from

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_IN_CALL = (CLOSE, OPEN)


def parse_call_body(body: str) -> tuple[str, str] | None:
    """(name, arguments) from the JSON between the tags, or None if it is not a call."""
    text = body.strip()
    try:
        members, end = parse_members(text, 0)
    except JSON_ERRORS:
        return None
    return call_from_members(members) if end == len(text) else None


class HermesParser:
    def __init__(self) -> None:
        self._buf = ""
        self._in_call = False
        self._scanned = 0  # how far the open call's body has been searched

    def feed(self, chunk: str) -> list[Event]:
        self._buf += chunk
        return self._drain()

    def finish(self) -> list[Event]:
        out = self._drain()
        if self._buf or self._in_call:
            out.append(Text((OPEN if self._in_call else "") + self._buf))
        self._buf, self._in_call = "", False
        return out

    def _drain(self) -> list[Event]:
        out: list[Event] = []
        while True:
            if not self._in_call:
                pos = self._buf.find(OPEN)
                if pos == -1:
                    keep = held_suffix(self._buf, (OPEN,))
                    if len(self._buf) > keep:
                        out.append(Text(self._buf[: len(self._buf) - keep]))
                        self._buf = self._buf[len(self._buf) - keep :]
                    return out
                if pos:
                    out.append(Text(self._buf[:pos]))
                self._buf, self._in_call, self._scanned = self._buf[pos + len(OPEN) :], True, 0
                continue
            pos, tok = find_first(self._buf, _IN_CALL, self._scanned)
            if pos == -1:
                self._scanned = rescan_from(len(self._buf), _IN_CALL)
                return out
            body, self._buf, self._in_call = self._buf[:pos], self._buf[pos:], False
            if tok == OPEN:  # a new call opens before this one closed: this one was just text
                out.append(Text(OPEN + body))
                continue
            self._buf = self._buf[len(CLOSE) :]
            call = parse_call_body(body)
            out.append(ToolCall(new_call_id(), *call) if call else Text(OPEN + body + CLOSE))
