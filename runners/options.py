"""Parsers for the runners' comma-list options, with errors that name what was expected."""

from __future__ import annotations

from pathlib import Path

import click

from harness.receipt import RESULTS_DIR

results_option = click.option(
    "--results",
    type=click.Path(path_type=Path, file_okay=False),
    default=RESULTS_DIR,
    show_default="results/ of this checkout",
    help="Directory the receipts are written under (SUITE/HARDWARE/...), and RESULTS.md regenerated from.",
)


def positive_ints(text: str) -> list[int]:
    """A click option's comma-separated positive whole numbers, or a clear BadParameter."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated whole numbers, got {text!r}") from None
    if not values or min(values) < 1:
        raise click.BadParameter(f"expected positive whole numbers, got {text!r}")
    return values


def chosen(text: str, choices: tuple[str, ...], option: str) -> list[str]:
    """A comma list of names, each one of `choices`, or a BadParameter naming the option and the choices."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in choices]
    if unknown or not names:
        raise click.BadParameter(
            f"unknown {', '.join(unknown) or 'empty list'}; choose from {', '.join(choices)}",
            param_hint=option,
        )
    return names
