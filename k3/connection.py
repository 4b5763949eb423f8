"""The client side of one ASGI request: reading the body, JSON answers, the SSE writer with its
keep-alives, and the watch for a client that hangs up."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Protocol

from k3.cancel import may_cancel

log = logging.getLogger("k3")

Scope = MutableMapping[str, Any]  # the ASGI types, as Starlette and httpx spell them
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

WATCH_AFTER = 0.05  # the LateStart tick: turns shorter than this never start their watchers

_JSON_HEADERS = [(b"content-type", b"application/json")]
SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


def headers_of(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}


async def send_json(
    send: Send, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    headers = [*_JSON_HEADERS, (b"content-length", str(len(body)).encode())]
    if extra:
        headers.extend(extra)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class ClientGone(Exception):
    """The client hung up before its request body was read."""


class SSEWriter:
    """The single writer of one SSE response: commits the 200 once, then writes frames. A timer
    (not a task; armed by `start`, which LateStart calls only for streams that outlive a tick)
    writes a keep-alive frame after `interval` seconds without output, committing the 200 first
    if no event came yet."""

    __slots__ = (
        "_send",
        "_start",
        "_headers",
        "_lock",
        "_frame",
        "_interval",
        "_timer",
        "_ping",
        "_armed",
        "committed",
        "closed",
        "last",
    )

    def __init__(
        self, send: Send, start: bytes, headers: list[tuple[bytes, bytes]], keepalive: bytes, interval: float
    ):
        self._send = send
        self._start = start  # the dialect's opening frames, written with the first bytes
        self._headers = headers
        self._lock = asyncio.Lock()
        self._frame = keepalive
        self._interval = interval
        self._timer: asyncio.TimerHandle | None = None
        self._ping: asyncio.Future[None] | None = None
        self._armed = True  # until disarm(): start() may still arm the timer
        self.committed = False
        self.closed = False
        self.last = time.monotonic()

    async def _commit(self, data: bytes) -> bytes:
        """Send the 200 if not yet sent; -> the bytes to write next (the dialect's opening frames
        go out with the first data, in one write, so the client wakes once for both)."""
        if self.committed:
            return data
        self.committed = True
        await self._send({"type": "http.response.start", "status": 200, "headers": self._headers})
        return self._start + data

    async def write(self, data: bytes) -> None:
        async with self._lock:
            if self.closed:
                return
            data = await self._commit(data)
            if data:
                await self._send({"type": "http.response.body", "body": data, "more_body": True})
            self.last = time.monotonic()

    async def close(self, data: bytes = b"") -> None:
        async with self._lock:
            if self.closed:
                return
            self.closed = True
            data = await self._commit(data)
            await self._send({"type": "http.response.body", "body": data, "more_body": False})

    def start(self) -> None:
        """Arm the keep-alive timer (LateStart calls this for streams that outlive a tick)."""
        if self._armed:
            idle = time.monotonic() - self.last
            self._timer = asyncio.get_running_loop().call_later(max(0.0, self._interval - idle), self._tick)

    def disarm(self) -> None:
        self._armed = False
        if self._timer is not None:
            self._timer.cancel()
        if self._ping is not None:
            self._ping.cancel()

    def _tick(self) -> None:
        idle = time.monotonic() - self.last
        if idle >= self._interval:
            if self._ping is None or self._ping.done():
                self._ping = asyncio.ensure_future(self._keepalive())
            idle = 0.0
        self._timer = asyncio.get_running_loop().call_later(self._interval - idle, self._tick)

    async def _keepalive(self) -> None:
        try:
            await self.write(self._frame)
        except Exception:  # the client is gone: the turn itself notices and ends
            log.debug("keep-alive write failed", exc_info=True)


class Hangup:
    """Watches for the client hanging up and then cancels the turn's task (closing the upstream
    request with it). Started by the server's `LateStart`, so short turns never pay for it.

    The turn calls `stop()` before its last write: once a response is complete, the server's
    `receive()` answers `http.disconnect` (uvicorn does), which is not a hang-up. A hang-up that
    comes while the turn closes its engine response is noted but does not cancel (k3.cancel)."""

    __slots__ = ("_task", "_receive", "_watcher", "finished", "hung_up")

    def __init__(self, task: asyncio.Task[Any], receive: Receive):
        self._task = task
        self._receive = receive
        self._watcher: asyncio.Future[None] | None = None
        self.finished = False
        self.hung_up = False

    def start(self) -> None:
        if not self.finished and self._watcher is None:
            self._watcher = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                if not self.finished:
                    self.hung_up = True
                    if may_cancel(self._task):
                        self._task.cancel()
                return

    def stop(self) -> None:
        self.finished = True
        if self._watcher is not None:
            self._watcher.cancel()


class Startable(Protocol):
    def start(self) -> None: ...


class LateStart:
    """Starts what only long turns need (the hang-up watch, the keep-alive timer) for the turns
    that run past one tick: one timer for the whole server instead of a timer per turn, which
    costs a short turn more than its translation. Every WATCH_AFTER seconds it starts whatever
    was already waiting at the previous tick, so a start comes one to two periods in. The timer
    runs only while something waits; waiting costs two set operations."""

    __slots__ = ("_loop", "_timer", "_young", "_old")

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._young: set[Startable] = set()  # arrived since the last tick
        self._old: set[Startable] = set()  # were waiting at the last tick

    def add(self, item: Startable) -> None:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a new event loop (tests): the old one's turns are gone
            self._loop, self._timer = loop, None
            self._young, self._old = set(), set()
        self._young.add(item)
        if self._timer is None:
            self._timer = loop.call_later(WATCH_AFTER, self._tick)

    def discard(self, item: Startable) -> None:
        self._young.discard(item)
        self._old.discard(item)

    def _tick(self) -> None:
        for item in self._old:
            item.start()
        self._old, self._young = self._young, set()
        loop = self._loop
        self._timer = loop.call_later(WATCH_AFTER, self._tick) if self._old and loop is not None else None
