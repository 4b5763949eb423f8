"""Helpers shared by the k3.tools tests: run a parser over chunks and compare outputs."""

from __future__ import annotations

import re
from dataclasses import replace

from k3.tools import Event, ToolCall, merge_events

GENERATED_ID = re.compile(r"call_[0-9a-f]{24}")


def chunks_at(text: str, cuts: list[int]) -> list[str]:
    """Split `text` at the given positions (duplicates and out-of-range cuts ignored)."""
    points = [0, *sorted({c for c in cuts if 0 < c < len(text)}), len(text)]
    return [text[a:b] for a, b in zip(points, points[1:], strict=False) if b > a]


def normalise(events: list[Event]) -> list[Event]:
    """Merged events with freshly minted ids replaced by a placeholder (they are random)."""
    return [
        replace(e, id="call_*") if isinstance(e, ToolCall) and GENERATED_ID.fullmatch(e.id) else e
        for e in merge_events(events)
    ]


def run(parser, chunks: list[str]) -> list[Event]:
    events: list[Event] = []
    for chunk in chunks:
        events += parser.feed(chunk)
    return normalise(events + parser.finish())


def call(name: str, arguments: str, id: str = "call_*") -> ToolCall:
    return ToolCall(id, name, arguments)
