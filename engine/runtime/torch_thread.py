"""The one thread that runs a process's torch work while other threads serve it.

libgomp gives every thread that starts a parallel region a pool of worker threads of its own. With two
such threads (the engine loaded on the main thread, the scheduler's loop on another), the pools' workers
outnumber the CPUs of a small machine, so libgomp stops spinning between regions and every region pays a
wake-up: on 2 cores, the compiled CPU decode step ran several times slower on the scheduler's thread
than on the thread that loaded the model (by hand, not a receipt). A server that loads, warms up and
serves on this one thread keeps a single pool.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


class TorchThread:
    """A daemon thread that runs the callables given to it, one after another, in order."""

    def __init__(self, name: str = "torch"):
        self._tasks: queue.SimpleQueue[tuple[Future, Callable[..., Any], tuple, dict] | None] = (
            queue.SimpleQueue()
        )
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while (task := self._tasks.get()) is not None:
            future, fn, args, kwargs = task
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as e:  # the caller's to handle, on its own thread
                    future.set_exception(e)

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        self._tasks.put((future, fn, args, kwargs))
        return future

    def call(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run `fn` on the thread and return its result; its exception is raised here."""
        return self.submit(fn, *args, **kwargs).result()

    def close(self) -> None:
        """End the thread once the callables already given have run."""
        self._tasks.put(None)
