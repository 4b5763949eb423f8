"""Server-sent events: encode frames for clients, decode the upstream's `data:` stream."""

from __future__ import annotations

from typing import Any

import orjson

DONE = b"data: [DONE]\n\n"
COMMENT_KEEPALIVE = b": keep-alive\n\n"


_EVENT_HEADS: dict[str, bytes] = {}  # event name -> its `event:` line and `data: ` (a few dozen names)


def _head(event: str) -> bytes:
    head = _EVENT_HEADS.get(event)
    if head is None:
        head = _EVENT_HEADS[event] = b"event: " + event.encode() + b"\ndata: "
    return head


def named(event: str, data: Any) -> bytes:
    """`event: NAME` + `data: JSON` frame (Anthropic and Responses)."""
    return b"".join([_head(event), orjson.dumps(data), b"\n\n"])


def typed(event: str, fields: dict[str, Any], sequence_number: int) -> bytes:
    """A Responses frame: `{"type": event, **fields, "sequence_number": n}`, spliced as bytes
    rather than built as one more dict. `fields` must not be empty."""
    body = orjson.dumps(fields)
    return b"".join([_head(event), b'{"type":"', event.encode(), b'",', body[1:-1],
                     b',"sequence_number":', str(sequence_number).encode(), b"}\n\n"])  # fmt: skip


def unnamed(data: Any) -> bytes:
    """`data: JSON` frame (Chat Completions)."""
    return b"data: " + orjson.dumps(data) + b"\n\n"


class SSEDecoder:
    """Incremental decoder of an upstream SSE body into the payloads of its `data:` fields.

    Comments (`:`), `event:`/`id:`/`retry:` fields and blank keep-alives are skipped. A payload
    spread over several `data:` lines is joined with newlines, as the SSE spec says. Only
    complete events are returned; a partial trailing line waits for the next feed.
    """

    __slots__ = ("_buffer", "_data")

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[bytes] = []

    def feed(self, chunk: bytes) -> list[bytes]:
        buffer = self._buffer + chunk if self._buffer else chunk
        if self._data or b"\r" in buffer:
            return self._lines(buffer)
        # Fast path for what engines send: events of one `data: ` line each. The first event
        # of any other shape hands it and the rest to the line parser.
        events = buffer.split(b"\n\n")
        tail = events.pop()
        out: list[bytes] = []
        for i, event in enumerate(events):
            if event[:6] != b"data: " or b"\n" in event:
                return out + self._lines(b"\n\n".join([*events[i:], tail]))
            out.append(event[6:])
        self._buffer = tail
        return out

    def _lines(self, buffer: bytes) -> list[bytes]:
        lines = buffer.split(b"\n")
        self._buffer = lines.pop()
        out: list[bytes] = []
        for line in lines:
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                if self._data:
                    out.append(b"\n".join(self._data))
                    self._data = []
            elif line.startswith(b"data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(b" ") else value)
        return out

    def finish(self) -> list[bytes]:
        """Flush a final event the upstream did not terminate with a blank line."""
        tail = self.feed(b"\n\n") if self._buffer or self._data else []
        self._buffer = b""
        return tail
