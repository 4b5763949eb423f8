"""Progress reporting for long work: click's progress bars on stderr, or silence.

Two shapes of the same thing: `progress_bar(...)` wraps an iterable or a length directly, and a
`ProgressFactory` (`factory(label, total)` -> a context manager whose value has `update(n)`) lets library
code report progress without knowing whether a terminal is watching.
"""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Callable, Iterable

import click

ProgressFactory = Callable[[str, int], contextlib.AbstractContextManager]


class _Sink(io.StringIO):
    """A text stream that keeps nothing."""

    def write(self, _text: str) -> int:
        return 0


def progress_bar(
    iterable: Iterable | None = None, *, length: int | None = None, label: str, show: bool, **options
):
    """click.progressbar on stderr when `show`, otherwise the same object drawing nowhere; `options` go
    to click.progressbar (e.g. item_show_func)."""
    return click.progressbar(
        iterable, length=length, label=label, file=sys.stderr if show else _Sink(), **options
    )


def stderr_progress(label: str, total: int) -> contextlib.AbstractContextManager:
    """A `ProgressFactory` drawing a bar on stderr (for CLIs)."""
    return click.progressbar(length=max(total, 1), label=label.ljust(16), file=sys.stderr, show_pos=False)


def no_progress(label: str, total: int) -> contextlib.AbstractContextManager:
    """A `ProgressFactory` that reports nothing."""
    return progress_bar(length=max(total, 1), label=label, show=False)
