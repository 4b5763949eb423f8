"""Click option shapes the command lines (engine, runners) repeat, spelled once."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import click


def count_option(*decls: str, default: int, help: str, minimum: int = 1) -> Callable[[Any], Any]:
    """A whole-number option of at least `minimum` with a default shown in --help."""
    return click.option(*decls, type=click.IntRange(minimum), default=default, show_default=True, help=help)


def text_option(*decls: str, default: str, help: str) -> Callable[[Any], Any]:
    """A text option with a default shown in --help."""
    return click.option(*decls, default=default, show_default=True, help=help)


def float_option(
    *decls: str, default: float, help: str, minimum: float | None = None, above: bool = False
) -> Callable[[Any], Any]:
    """A decimal option with a default shown in --help; with `minimum`, at least that (`above`: more)."""
    kind = float if minimum is None else click.FloatRange(minimum, min_open=above)
    return click.option(*decls, type=kind, default=default, show_default=True, help=help)


@contextmanager
def reported_as_click_errors(*errors: type[Exception]) -> Iterator[None]:
    """Show one of these errors as a ClickException (its message, exit 1), not a traceback."""
    try:
        yield
    except errors as exc:
        raise click.ClickException(str(exc)) from None
