"""Inline reasoning: `<think>…</think>` inside the content (`--reasoning-field think`).

`ThinkSplitter` is itself a parser: think blocks become Reasoning and the visible rest goes
through an inner tool parser, so `ThinkSplitter(make_parser("hermes"))` handles both. Tags are
never shown, even when split across chunks; a stray `</think>` (or a nested `<think>`) is
dropped. If the engine's prompt already opened the block (a template ending in `<think>`), pass
`start_in_think=True`.
"""

from __future__ import annotations

from k3.tools.events import Event, Reasoning
from k3.tools.passthrough import PassthroughParser
from k3.tools.scan import find_first, held_suffix

OPEN, CLOSE = "<think>", "</think>"
TAGS = (OPEN, CLOSE)


class ThinkSplitter:
    def __init__(self, inner=None, *, start_in_think: bool = False) -> None:
        self._inner = inner if inner is not None else PassthroughParser()
        self._buf = ""
        self._thinking = start_in_think

    def feed(self, chunk: str) -> list[Event]:
        self._buf += chunk
        out: list[Event] = []
        while True:
            pos, tag = find_first(self._buf, TAGS)
            if pos == -1:
                cut = len(self._buf) - held_suffix(self._buf, TAGS)
                self._route(out, self._buf[:cut])
                self._buf = self._buf[cut:]
                return out
            self._route(out, self._buf[:pos])
            self._buf = self._buf[pos + len(tag) :]
            self._thinking = tag == OPEN

    def finish(self) -> list[Event]:
        out: list[Event] = []
        self._route(out, self._buf)
        self._buf = ""
        out.extend(self._inner.finish())
        return out

    def _route(self, out: list[Event], text: str) -> None:
        if not text:
            return
        if self._thinking:
            out.append(Reasoning(text))
        else:
            out.extend(self._inner.feed(text))
