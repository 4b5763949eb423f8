"""After a runner writes receipts: regenerate everything derived from them."""

from pathlib import Path

import click

from harness.figures import write_all
from harness.report import write_report


def regenerate(results_dir: Path | None = None) -> None:
    click.echo(f"wrote {write_report(results_dir)}")
    click.echo(f"wrote {len(write_all(results_dir))} figure files")
