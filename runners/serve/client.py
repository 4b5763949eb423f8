"""One streamed turn against an endpoint, timed at every server-sent event.

Each `data:` line is one event, stamped with `time.perf_counter()` when the client has read it; only
events that carry text (a `Piece`) are kept as chunks. Any failure (a refused connection, a non-200
status, an error inside the stream, a stream that stops before its end) makes the turn an error, kept
with its message and never timed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import httpx
import orjson

from runners.serve import dialects
from runners.serve.dialects import Piece, Usage

# Response headers that say nothing about the server (they change with every answer).
VOLATILE_HEADERS = {"date", "content-length", "set-cookie", "transfer-encoding", "connection", "keep-alive"}


@dataclass
class StreamedTurn:
    """What one request saw: its timestamps (perf_counter seconds), text chunks, usage and outcome."""

    start: float
    end: float = 0.0
    status: int = 0
    error: str | None = None
    chunks: list[tuple[float, list[Piece]]] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None


def server_headers(response: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in sorted(response.headers.items()) if k.lower() not in VOLATILE_HEADERS}


def _merge(old: Usage, new: Usage) -> Usage:
    return Usage(
        new.input_tokens if new.input_tokens is not None else old.input_tokens,
        new.output_tokens if new.output_tokens is not None else old.output_tokens,
    )


async def stream_turn(client: httpx.AsyncClient, url: str, dialect: str, body: bytes,
                      headers: dict[str, str]) -> StreamedTurn:  # fmt: skip
    """POST one streamed request and read it to its end."""
    turn = StreamedTurn(start=time.perf_counter())
    try:
        async with client.stream("POST", url, content=body, headers=headers) as response:
            turn.status, turn.headers = response.status_code, server_headers(response)
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                turn.error = f"HTTP {response.status_code}: {text[:200]}"
            else:
                await _read_events(response, dialect, turn)
    except (httpx.HTTPError, OSError) as exc:
        turn.error = f"{type(exc).__name__}: {exc}"[:300]
    turn.end = time.perf_counter()
    return turn


async def _read_events(response: httpx.Response, dialect: str, turn: StreamedTurn) -> None:
    ended = False
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        now = time.perf_counter()
        data = line[5:].strip()
        if data == "[DONE]":
            ended = True
            break
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError:
            turn.error = f"not JSON in the stream: {data[:120]}"
            return
        if not isinstance(event, dict):
            continue
        if message := dialects.error(dialect, event):
            turn.error = f"stream error: {message[:200]}"
            return
        if found := dialects.pieces(dialect, event):
            turn.chunks.append((now, found))
        if counted := dialects.usage(dialect, event):
            turn.usage = _merge(turn.usage, counted)
        if dialects.finished(dialect, event):
            ended = True
    if not ended:
        turn.error = "the stream ended before its final event"
