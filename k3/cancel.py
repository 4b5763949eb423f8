"""When a hang-up may cancel a turn.

A client that hangs up cancels its turn's task, which closes the engine request with it. But a
cancellation that lands while the turn is closing its engine response cuts that close short, and
an interrupted close leaves the engine connection checked out of the pool for good (256 of them
and k3 stops serving). So the closes run inside `closing()`, and a hang-up that comes meanwhile
does not cancel: the turn is ending anyway, and its last writes to a gone client are dropped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

_closing: set[asyncio.Task[object]] = set()  # tasks now closing an engine response


async def closing(close: Callable[[], Awaitable[None]]) -> None:
    """Run `close()` (an engine response's close) where no hang-up cancels it."""
    task = asyncio.current_task()
    assert task is not None
    _closing.add(task)
    try:
        await close()
    finally:
        _closing.discard(task)


def may_cancel(task: asyncio.Task[object]) -> bool:
    return task not in _closing
