"""No text parsing: the engine parses tool calls itself (native `tool_calls`)."""

from __future__ import annotations

from k3.tools.events import Event, Text


class PassthroughParser:
    def feed(self, chunk: str) -> list[Event]:
        return [Text(chunk)] if chunk else []

    def finish(self) -> list[Event]:
        return []
