"""Inline reasoning: `<think>…</think>` inside the content (`--reasoning-field think`).

`ThinkSplitter` is itself a parser: think blocks become Reasoning and the visible rest goes
through an inner tool parser, so `ThinkSplitter(make_parser("hermes"))` handles both. The tags are
found by `common.think.ThinkTags` (the engine's output text uses it too): never shown, even when split
across chunks; a stray `</think>` (or a nested `<think>`) is dropped. If the engine's prompt already
opened the block (a template ending in `<think>`), pass `start_in_think=True`.
"""

from __future__ import annotations

from common.think import ThinkTags
from k3.tools.events import Event, Reasoning
from k3.tools.passthrough import PassthroughParser


class ThinkSplitter:
    def __init__(self, inner=None, *, start_in_think: bool = False) -> None:
        self._inner = inner if inner is not None else PassthroughParser()
        self._tags = ThinkTags(start_in_think)

    def feed(self, chunk: str) -> list[Event]:
        return self._route(self._tags.feed(chunk))

    def finish(self) -> list[Event]:
        out = self._route(self._tags.finish())
        out.extend(self._inner.finish())
        return out

    def _route(self, pieces: list[tuple[bool, str]]) -> list[Event]:
        out: list[Event] = []
        for thinking, text in pieces:
            if thinking:
                out.append(Reasoning(text))
            else:
                out.extend(self._inner.feed(text))
        return out
