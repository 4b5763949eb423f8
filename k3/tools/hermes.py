"""Hermes / Qwen style: `<tool_call>{"name": …, "arguments": {…}}</tool_call>` anywhere in the text.

The tags are ordinary text here: a call whose body is not a valid call object is shown verbatim,
tags included, so the user sees what the model wrote.
"""

from __future__ import annotations

from common.scan import find_first, held_suffix
from k3.tools.arguments import JSON_ERRORS, call_from_members, parse_members
from k3.tools.events import Event, Text, ToolCall
from k3.tools.ids import new_call_id

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
        self._buf = ""  # unsearched text (outside a call) or a possible tag start (inside one)
        self._body: list[str] = []  # the open call's text so far
        self._in_call = False

    def feed(self, chunk: str) -> list[Event]:
        self._buf += chunk
        return self._drain()

    def finish(self) -> list[Event]:
        out = self._drain()
        rest = (OPEN + "".join(self._body) if self._in_call else "") + self._buf
        if rest:
            out.append(Text(rest))
        self._buf, self._body, self._in_call = "", [], False
        return out

    def _drain(self) -> list[Event]:
        out: list[Event] = []
        while True:
            tokens = _IN_CALL if self._in_call else (OPEN,)
            pos, tok = find_first(self._buf, tokens)
            if pos == -1:
                cut = len(self._buf) - held_suffix(self._buf, tokens)
                if cut and self._in_call:
                    self._body.append(self._buf[:cut])
                elif cut:
                    out.append(Text(self._buf[:cut]))
                self._buf = self._buf[cut:]
                return out
            before, self._buf = self._buf[:pos], self._buf[pos + len(tok) :]
            if not self._in_call:
                if before:
                    out.append(Text(before))
                self._in_call = True
                continue
            body, self._body = "".join(self._body) + before, []
            if tok == OPEN:  # a new call opens before this one closed: this one was just text
                out.append(Text(OPEN + body))
                continue
            self._in_call = False
            call = parse_call_body(body)
            out.append(ToolCall(new_call_id(), *call) if call else Text(OPEN + body + CLOSE))
