"""Graceful shutdown: the turns in flight may finish for a grace period; the rest then end with an
error in their own dialect (an error event, not a cut chunked body), and only after every turn has
ended does the app close the upstream pool and the reasoning ledger."""

from __future__ import annotations

import asyncio
import socket

import uvicorn

SETTLE = 3.0  # seconds the turns cut at the grace's end get to write their error and finish


class Drain:
    """The turn tasks in flight; `run` is the shutdown's drain, `ended` tells a turn that the
    cancellation it got is the shutdown's (end with an error), not its client's hang-up."""

    __slots__ = ("_turns", "_cut")

    def __init__(self) -> None:
        self._turns: set[asyncio.Task[None]] = set()
        self._cut: set[asyncio.Task[None]] = set()  # cancelled by the shutdown

    def enter(self, task: asyncio.Task[None]) -> None:
        self._turns.add(task)

    def leave(self, task: asyncio.Task[None]) -> None:
        self._turns.discard(task)
        self._cut.discard(task)

    def ended(self, task: asyncio.Task[None] | None) -> bool:
        """True (and the cancellation withdrawn, so the turn can still write) when the shutdown
        cancelled `task`; its cancellation then becomes an error the turn reports."""
        if task is None or task not in self._cut:
            return False
        self._cut.discard(task)
        task.uncancel()
        return True

    async def run(self, grace: float) -> None:
        """Wait up to `grace` seconds for the turns in flight, then cut the rest and wait for them
        to end (up to SETTLE seconds more)."""
        if self._turns:
            await asyncio.wait(set(self._turns), timeout=grace)
        if self._turns:
            self._cut = set(self._turns)
            for task in self._cut:
                task.cancel()
        await self.idle(SETTLE)

    async def idle(self, timeout: float) -> None:
        """Until no turn is in flight (at most `timeout` seconds)."""
        if self._turns:
            await asyncio.wait(set(self._turns), timeout=timeout)


class DrainingServer(uvicorn.Server):
    """uvicorn, whose shutdown (SIGTERM, Ctrl-C) stops accepting connections and then lets k3
    drain its turns, instead of cancelling whatever still runs after its own timeout."""

    def __init__(self, config: uvicorn.Config, drain: Drain, grace: float):
        config.timeout_graceful_shutdown = int(grace + SETTLE) + 1  # k3's drain ends first
        super().__init__(config)
        self._drain = drain
        self._grace = grace

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        stopping = asyncio.ensure_future(super().shutdown(sockets))  # closes the listeners first
        try:
            await self._drain.run(self._grace)
        finally:
            await stopping
