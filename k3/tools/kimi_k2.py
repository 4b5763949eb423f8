"""Kimi K2 control tokens (also what Kimi-Linear emits):

    <|tool_calls_section_begin|>
    <|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city":"Beijing"}<|tool_call_end|>
    <|tool_calls_section_end|>

The section wrapper is optional. The call header (`functions.NAME:IDX`) is K2's own tool-call id:
it becomes the call id, so the restored upstream message renders exactly as the model wrote it.
Control tokens are never shown: stray ones are dropped, and an unfinished call degrades to its
header and arguments as plain text.
"""

from __future__ import annotations

import re

from common.scan import find_first, held_suffix
from k3.tools.arguments import coerce_raw
from k3.tools.events import Event, Text, TokenStreamParser, ToolCall
from k3.tools.ids import new_call_id

SECTION_BEGIN = ("<|tool_calls_section_begin|>", "<|tool_call_section_begin|>")
SECTION_END = ("<|tool_calls_section_end|>", "<|tool_call_section_end|>")
CALL_BEGIN = "<|tool_call_begin|>"
ARG_BEGIN = "<|tool_call_argument_begin|>"
CALL_END = "<|tool_call_end|>"
TOKENS = (*SECTION_BEGIN, *SECTION_END, CALL_BEGIN, ARG_BEGIN, CALL_END)

_HEADER = re.compile(r"(?P<prefix>functions?\.)?(?P<name>[^\s:]+)(?::(?P<index>\d+))?")


class KimiK2Parser(TokenStreamParser):
    def __init__(self) -> None:
        self._buf = ""
        self._state = "text"  # text | section | header | args
        self._in_section = False
        self._prose_run = False  # the current run between section tokens has shown prose
        self._header = ""
        self._body: list[str] = []  # text of the call part being read (header or arguments)
        self._ids: set[str] = set()

    def _flush(self, out: list[Event]) -> None:
        rest = "".join(self._body) + self._buf
        if self._state in ("text", "section"):
            self._show_run(out, rest)
        else:
            out.append(Text(rest if self._state == "header" else self._header + rest))
        self._buf, self._body, self._state = "", [], "text"

    def _drain(self, out: list[Event]) -> None:
        while True:
            pos, tok = find_first(self._buf, TOKENS)
            if pos == -1:
                cut = len(self._buf) - held_suffix(self._buf, TOKENS)
                if self._state in ("header", "args"):
                    self._body.append(self._buf[:cut])  # only a possible token start stays in the buffer
                elif not self._show_run(out, self._buf[:cut], partial=True):
                    return
                self._buf = self._buf[cut:]
                return
            before = "".join(self._body) + self._buf[:pos]
            self._body, self._buf = [], self._buf[pos + len(tok) :]
            self._on_token(out, before, tok)

    def _show_run(self, out: list[Event], text: str, partial: bool = False) -> bool:
        """Emit outside-call text; returns False when it must stay buffered.

        Inside a section a whitespace-only run between tokens is formatting and is dropped, so
        whitespace is held until the run proves to contain prose.
        """
        if self._state == "section" and not self._prose_run:
            if not text.strip():
                return not partial  # dropped once the run ends, kept buffered until then
            self._prose_run = True
        if text:
            out.append(Text(text))
        return True

    def _on_token(self, out: list[Event], before: str, tok: str) -> None:
        state = self._state
        if state in ("text", "section"):
            self._show_run(out, before)
            self._prose_run = False
            if tok == CALL_BEGIN:
                self._state = "header"
            elif tok in SECTION_BEGIN:
                self._state, self._in_section = "section", True
            elif tok in SECTION_END:
                self._state, self._in_section = "text", False
            # a stray ARG_BEGIN / CALL_END outside a call is dropped
            return
        if state == "header" and tok == ARG_BEGIN:
            self._header, self._state = before, "args"
            return
        if state == "args" and tok == CALL_END:
            call = self._call(self._header, before)
            self._state = "section" if self._in_section else "text"
            out.append(call or Text(self._header + before))
            return
        # The call was cut short by another token: show what it had, then handle the token.
        out.append(Text(before if state == "header" else self._header + before))
        self._state = "section" if self._in_section else "text"
        self._on_token(out, "", tok)

    def _call(self, header: str, arguments: str) -> ToolCall | None:
        head = header.strip()
        match = _HEADER.fullmatch(head)
        name = match["name"] if match else head
        if not name:
            return None
        call_id = head if match and match["prefix"] and match["index"] else new_call_id()
        if call_id in self._ids:
            call_id = new_call_id()
        self._ids.add(call_id)
        return ToolCall(call_id, name, coerce_raw(arguments))
