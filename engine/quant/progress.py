"""Progress reporting for long jobs: a factory ``progress(label, total)`` returning a context manager whose
value has ``update(n)``. ``click.progressbar(length=total, label=label)`` fits; :func:`no_progress` is silent."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

ProgressFactory = Callable[[str, int], contextlib.AbstractContextManager]


class _Silent:
    def update(self, n: int) -> None:
        pass


def no_progress(label: str, total: int) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext(_Silent())
