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


DEFAULT_MAX_LINE = 8 << 20  # bytes; real chunks are a few KiB, a whole tool call in one chunk rarely 1 MiB


class LineTooLong(ValueError):
    """An SSE line longer than the decoder's cap (a broken or hostile upstream)."""

    def __init__(self, limit: int):
        super().__init__(f"an SSE line exceeds the {limit}-byte limit")
        self.limit = limit


class SSEDecoder:
    """Incremental decoder of an upstream SSE body into the payloads of its `data:` fields.

    Comments (`:`), `event:`/`id:`/`retry:` fields and blank keep-alives are skipped. A payload
    spread over several `data:` lines is joined with newlines, as the SSE spec says. Only
    complete events are returned; a partial trailing line waits for the next feed.

    Linear time: reads without a newline are only queued, and what is kept between feeds is at
    most one partial line, so every byte is joined and split a bounded number of times however
    the upstream cuts its body (`scanned` counts the bytes handed to the splitter). A line over
    `max_line` bytes raises LineTooLong.
    """

    __slots__ = ("_tail", "_queued", "_line", "_data", "_crlf", "max_line", "scanned")

    def __init__(self, max_line: int = DEFAULT_MAX_LINE) -> None:
        self._tail = b""  # the partial line left by the last split
        self._queued: list[bytes] = []  # reads since then that held no newline
        self._line = 0  # bytes of the partial line: tail plus queued
        self._data: list[bytes] = []
        self._crlf = False  # a `\r` was seen: every later read takes the line parser
        self.max_line = max_line
        self.scanned = 0

    def feed(self, chunk: bytes) -> list[bytes]:
        if b"\r" in chunk:
            self._crlf = True
        if b"\n" not in chunk:
            self._line += len(chunk)
            if self._line > self.max_line:
                raise LineTooLong(self.max_line)
            if chunk:
                self._queued.append(chunk)
            return []
        if self._tail or self._queued:
            buffer = b"".join([self._tail, *self._queued, chunk])
            self._queued = []
        else:
            buffer = chunk
        self.scanned += len(buffer)
        if self._data or self._crlf:
            return self._lines(buffer)
        # Fast path for what engines send: events of one `data: ` line each. The first event
        # of any other shape hands it and the rest to the line parser.
        events = buffer.split(b"\n\n")
        tail = events.pop()
        out: list[bytes] = []
        for i, event in enumerate(events):
            if event[:6] != b"data: " or b"\n" in event:
                return out + self._lines(b"\n\n".join([*events[i:], tail]))
            if len(event) > self.max_line:
                raise LineTooLong(self.max_line)
            out.append(event[6:])
        if b"\n" in tail:  # an event of several lines is under way: only its last line may wait
            return out + self._lines(tail)
        self._keep(tail)
        return out

    def _keep(self, tail: bytes) -> None:
        if len(tail) > self.max_line:
            raise LineTooLong(self.max_line)
        self._tail = tail
        self._line = len(tail)

    def _lines(self, buffer: bytes) -> list[bytes]:
        lines = buffer.split(b"\n")
        self._keep(lines.pop())
        out: list[bytes] = []
        for line in lines:
            if len(line) > self.max_line:
                raise LineTooLong(self.max_line)
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
        pending = self._tail or self._queued or self._data
        tail = self.feed(b"\n\n") if pending else []
        self._tail = b""
        self._line = 0
        return tail
