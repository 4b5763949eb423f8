"""The three events every text parser emits, and the merge rule that makes chunkings comparable."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Text:
    """Visible answer text."""

    text: str


@dataclass(frozen=True, slots=True)
class Reasoning:
    """Model reasoning (a think channel or inline `<think>` block)."""

    text: str


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One complete tool call; `arguments` is the JSON argument string (raw bytes where the format has them)."""

    id: str
    name: str
    arguments: str


Event = Text | Reasoning | ToolCall


class Parser(Protocol):
    """Incremental parser: feed model text piece by piece, then finish once."""

    def feed(self, chunk: str) -> list[Event]: ...

    def finish(self) -> list[Event]: ...


class TokenStreamParser:
    """Base of the control-token parsers: text arrives in `_buf`, `_drain` emits what is complete
    (keeping a possible token start), and at the end `_flush` shows what the stream left unfinished."""

    _buf: str

    def feed(self, chunk: str) -> list[Event]:
        self._buf += chunk
        out: list[Event] = []
        self._drain(out)
        return out

    def finish(self) -> list[Event]:
        out: list[Event] = []
        self._drain(out)
        self._flush(out)
        return out

    def _drain(self, out: list[Event]) -> None:
        raise NotImplementedError

    def _flush(self, out: list[Event]) -> None:
        raise NotImplementedError


def merge_events(events: list[Event]) -> list[Event]:
    """Join adjacent Text (and adjacent Reasoning) events and drop empty ones.

    Chunking may split text anywhere, so two event lists describe the same output when their
    merged forms are equal.
    """
    merged: list[Event] = []
    for event in events:
        if isinstance(event, Text | Reasoning):
            if not event.text:
                continue
            if merged and type(merged[-1]) is type(event):
                merged[-1] = type(event)(merged[-1].text + event.text)
                continue
        merged.append(event)
    return merged
