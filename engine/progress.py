"""Progress bars for long CLI work (click's), shown on stderr or not at all."""

from __future__ import annotations

import sys
from collections.abc import Iterable

import click


class _Sink:
    def write(self, _text: str) -> None:
        pass

    def flush(self) -> None:
        pass


def progress_bar(iterable: Iterable | None = None, *, length: int | None = None, label: str, show: bool):
    """click.progressbar on stderr when `show`, otherwise the same object drawing nowhere."""
    return click.progressbar(iterable, length=length, label=label, file=sys.stderr if show else _Sink())
