"""`kimi-harness`: receipts, RESULTS.md, figures, the audit and regression comparison."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from harness.hardware import REPO_ROOT, describe


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Evidence tools: every number the project shows comes from a receipt these commands check."""


@main.command("describe")
def describe_cmd() -> None:
    """Print this machine's hardware descriptor (what every receipt records) as JSON."""
    click.echo(json.dumps(describe(), indent=2))


@main.command()
@click.option("--results", type=click.Path(path_type=Path), default=REPO_ROOT / "results", show_default=True)
def report(results: Path) -> None:
    """Regenerate results/RESULTS.md from the receipts."""
    from harness.report import write_report

    click.echo(f"wrote {write_report(results)}")


@main.command()
@click.option("--results", type=click.Path(path_type=Path), default=REPO_ROOT / "results", show_default=True)
@click.option(
    "--out", type=click.Path(path_type=Path), default=REPO_ROOT / "docs" / "figures", show_default=True
)
def figures(results: Path, out: Path) -> None:
    """Regenerate every figure (PNG + PDF + JSON data) from the receipts."""
    from harness.figures import write_all

    for path in write_all(results, out):
        click.echo(f"wrote {path}")


@main.command()
@click.option(
    "--root", type=click.Path(path_type=Path, file_okay=False), default=REPO_ROOT, show_default=True
)
def audit(root: Path) -> None:
    """Check receipts, RESULTS.md, figures and every measured number in README.md and docs/*.md.

    Exits 1 with one line per finding; see harness/audit.py for the finding kinds and the marker syntax.
    """
    from harness.audit import run_audit

    findings = run_audit(root)
    for finding in findings:
        click.echo(str(finding))
    if findings:
        click.echo(f"audit: {len(findings)} finding(s)", err=True)
        sys.exit(1)
    click.echo("audit: clean")


@main.command("sync-docs")
@click.argument("docs", nargs=-1, type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("--results", type=click.Path(path_type=Path), default=REPO_ROOT / "results", show_default=True)
def sync_docs(docs: tuple[Path, ...], results: Path) -> None:
    """Rewrite every receipt-marked number in DOCS (default README.md, docs/*.md) from its receipt."""
    from harness.audit import sync_document

    targets = docs or (REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md")))
    for doc in targets:
        if doc.exists():
            click.echo(f"{doc}: {sync_document(doc, results)} number(s) updated")


@main.command()
@click.argument("base")
@click.argument("new")
@click.option(
    "--metric", required=True, help="Dotted field, e.g. summary.overhead_ms.median or derived.ratio."
)
@click.option(
    "--max-regression", "max_regression", type=float, required=True, help="Allowed regression in percent."
)
@click.option("--higher-is-better/--lower-is-better", default=False, show_default=True)
@click.option(
    "--results",
    type=click.Path(path_type=Path),
    default=REPO_ROOT / "results",
    show_default=True,
    help="Where `latest:` receipts are looked up.",
)
def compare(
    base: str, new: str, metric: str, max_regression: float, higher_is_better: bool, results: Path
) -> None:
    """Compare one metric of two receipts; exit 1 when NEW regresses on BASE by more than the allowance.

    BASE and NEW are receipt files, or `latest:SUITE/HARDWARE_ID/NAME` (newest receipt of that name in --results).
    """
    from harness.receipt import load_receipt, resolve_field
    from harness.report import find_receipt

    def locate(spec: str) -> Path:
        return find_receipt(spec, results) if spec.startswith("latest:") else Path(spec)

    try:
        old_value = float(resolve_field(load_receipt(locate(base)), metric))
        new_value = float(resolve_field(load_receipt(locate(new)), metric))
    except (KeyError, TypeError, ValueError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from None
    if old_value == 0:
        raise click.ClickException(f"{metric} is 0 in {base}: no ratio can be formed")
    ratio, regression = regression_pct(old_value, new_value, higher_is_better)
    click.echo(
        f"{metric}: base {old_value:.6g}, new {new_value:.6g}, ratio {ratio:.4f} ({regression:+.1f}% regression)"
    )
    if regression > max_regression:
        click.echo(f"regression of {regression:.1f}% exceeds the allowed {max_regression}%", err=True)
        sys.exit(1)


def regression_pct(old: float, new: float, higher_is_better: bool) -> tuple[float, float]:
    """(new/old, how many percent worse new is; negative when better)."""
    ratio = new / old
    return ratio, (1 - ratio if higher_is_better else ratio - 1) * 100


@main.command()
@click.option("--repeats", default=30, show_default=True, help="Samples per encoder.")
@click.option("--results", type=click.Path(path_type=Path), default=REPO_ROOT / "results", show_default=True)
def selfcheck(repeats: int, results: Path) -> None:
    """Write real receipts from a small measurement (event encoding cost) to prove the evidence path."""
    from harness.selfcheck import run_selfcheck

    for path in run_selfcheck(repeats=repeats, results_dir=results):
        click.echo(f"wrote {path}")


@main.command("import-device")
@click.argument("tar_path", metavar="TAR", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--results", type=click.Path(path_type=Path), default=REPO_ROOT / "results", show_default=True)
def import_device(tar_path: Path, results: Path) -> None:
    """Put the receipts of a GPU run (gpu-check's TAR) under RESULTS, each checked first, where report
    and audit find them. Then run `kimi-harness report` and `kimi-harness figures`."""
    from harness.import_device import import_device_tar
    from harness.receipt import ReceiptError

    try:
        written, present = import_device_tar(tar_path, results)
    except ReceiptError as exc:
        raise click.ClickException(str(exc)) from None
    for path in written:
        click.echo(f"imported {path}")
    click.echo(f"{len(written)} receipts imported, {len(present)} already there")
