"""After a runner writes receipts: regenerate everything derived from them."""

from pathlib import Path

import click

from harness.audit import sync_document
from harness.figures import FIGURES_DIR, write_all
from harness.hardware import REPO_ROOT
from harness.receipt import RESULTS_DIR
from harness.report import write_report


def regenerate(results_dir: Path | None = None) -> None:
    """RESULTS.md, the figures and the receipt-marked numbers in README.md and docs/*.md.

    Receipts written elsewhere than the repository's results/ (a scratch run) only get their own report
    and figures next to them: the project's docs describe the project's receipts.
    """
    results_dir = Path(results_dir or RESULTS_DIR)
    ours = results_dir.resolve() == RESULTS_DIR.resolve()
    click.echo(f"wrote {write_report(results_dir)}")
    figures_dir = FIGURES_DIR if ours else results_dir / "figures"
    click.echo(f"wrote {len(write_all(results_dir, figures_dir))} figure files in {figures_dir}")
    if ours:
        for doc in (REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))):
            changed = sync_document(doc, results_dir)
            if changed:
                click.echo(f"updated {changed} receipt-marked number(s) in {doc.relative_to(REPO_ROOT)}")
