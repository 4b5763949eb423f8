"""`kimi-harness`: receipts, RESULTS.md, figures, the audit, regression comparison and re-runs.

Every command works on the checkout it is run in (the git top level of the current directory); `--root`
names another one. `--results` / `--out` override single directories inside it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from common.click_options import reported_as_click_errors
from harness.hardware import describe

ROOT_HELP = "The checkout to work on [default: the git top level of the current directory]."


def root_option(command):
    return click.option(
        "--root", type=click.Path(path_type=Path, file_okay=False, exists=True), help=ROOT_HELP
    )(command)


def results_option(command):
    return click.option(
        "--results", type=click.Path(path_type=Path), help="The receipts directory [default: ROOT/results]."
    )(command)


def resolve_root(root: Path | None) -> Path:
    from harness.checkout import NotACheckout, checkout_root

    if root is not None:
        return root.resolve()
    try:
        return checkout_root()
    except NotACheckout as exc:
        raise click.UsageError(str(exc)) from None


def resolve_results(root: Path | None, results: Path | None) -> Path:
    return results if results is not None else resolve_root(root) / "results"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="local-kimi", prog_name="kimi-harness", message="%(prog)s %(version)s")
def main() -> None:
    """Evidence tools: every number the project shows comes from a receipt these commands check."""


@main.command("describe")
def describe_cmd() -> None:
    """Print this machine's hardware descriptor (what every receipt records) as JSON."""
    click.echo(json.dumps(describe(), indent=2))


@main.command()
@root_option
@results_option
def report(root: Path | None, results: Path | None) -> None:
    """Regenerate results/RESULTS.md from the receipts."""
    from harness.report import write_report

    click.echo(f"wrote {write_report(resolve_results(root, results))}")


@main.command()
@root_option
@results_option
@click.option(
    "--out", type=click.Path(path_type=Path), help="Where the figures go [default: ROOT/docs/figures]."
)
def figures(root: Path | None, results: Path | None, out: Path | None) -> None:
    """Regenerate every figure (PNG + PDF + JSON data) from the receipts.

    USE_TEX=1 renders the text through LaTeX (needs a TeX install); otherwise Computer Modern via
    matplotlib's mathtext. `python scripts/make_figures.py` runs this same command.
    """
    from harness.figures import write_all

    out = out if out is not None else resolve_root(root) / "docs" / "figures"
    with reported_as_click_errors(RuntimeError):  # USE_TEX=1 without a LaTeX install
        written = write_all(resolve_results(root, results), out)
    for path in written:
        click.echo(f"wrote {path}")


@main.command()
@root_option
@click.option(
    "--reproduced",
    is_flag=True,
    help="Instead of auditing, list which receipt-backed numbers in README.md have a passing reproduction "
    "(another clean receipt of the same configuration on the same hardware).",
)
def audit(root: Path | None, reproduced: bool) -> None:
    """Check receipts, RESULTS.md, figures and every measured number in README.md and docs/*.md.

    Exits 1 with one line per finding; see harness/audit.py for the finding kinds and the marker syntax.
    """
    from harness.audit import reproduced_claims, run_audit

    root = resolve_root(root)
    if reproduced:
        for line in reproduced_claims(root):
            click.echo(line)
        return
    findings = run_audit(root)
    for finding in findings:
        click.echo(str(finding))
    if findings:
        click.echo(f"audit: {len(findings)} finding(s) in {root}", err=True)
        sys.exit(1)
    click.echo(f"audit: clean ({root})")


@main.command("sync-docs")
@click.argument("docs", nargs=-1, type=click.Path(path_type=Path, exists=True, dir_okay=False))
@root_option
@results_option
def sync_docs(docs: tuple[Path, ...], root: Path | None, results: Path | None) -> None:
    """Rewrite every receipt-marked number in DOCS (default README.md, docs/*.md) from its receipt."""
    from harness.audit import sync_document

    base = resolve_root(root)
    targets = docs or (base / "README.md", *sorted((base / "docs").glob("*.md")))
    for doc in targets:
        if doc.exists():
            click.echo(f"{doc}: {sync_document(doc, resolve_results(root, results))} number(s) updated")


@main.command("import-benchmark")
@click.argument(
    "files", nargs=-1, required=True, type=click.Path(path_type=Path, exists=True, dir_okay=False)
)
@root_option
@results_option
def import_benchmark_cmd(files: tuple[Path, ...], root: Path | None, results: Path | None) -> None:
    """Turn pytest-benchmark's JSON (FILES, from --benchmark-json with --benchmark-save-data) into receipts.

    One receipt per case in suite `micro`: the raw per-call round times as samples (µs), the case's
    extra_info as its configuration, machine_info and commit_info as its hardware and commit. Several
    files of repeated runs of the same cases make one receipt per case, with the spread of the runs'
    medians (`run_spread_pct`, the run-to-run noise the CI gate allows for).
    Run `kimi-harness report` and `kimi-harness figures` afterwards (`nox -s bench-micro` does it all).
    """
    from harness.microbench import BenchmarkJSONError, import_benchmark

    with reported_as_click_errors(BenchmarkJSONError):
        written = import_benchmark(list(files), resolve_results(root, results))
    for path in written:
        click.echo(f"wrote {path}")
    click.echo(f"imported {len(written)} case(s) from {len(files)} file(s)")


@main.command()
@click.argument("base")
@click.argument("new")
@click.option(
    "--metric", required=True, help="Dotted field, e.g. summary.overhead_ms.median or derived.ratio."
)
@click.option(
    "--max-regression", "max_regression", type=float, required=True, help="Allowed regression in percent."
)
@click.option("--higher-is-better/--lower-is-better", default=False, show_default=True,
              help="Which direction of the metric is an improvement (latencies: lower).")  # fmt: skip
@root_option
@click.option("--results", type=click.Path(path_type=Path), help="Where `latest:` receipts are looked up.")
def compare(
    base: str,
    new: str,
    metric: str,
    max_regression: float,
    higher_is_better: bool,
    root: Path | None,
    results: Path | None,
) -> None:
    """Compare one metric of two receipts; exit 1 when NEW regresses on BASE beyond the allowance.

    BASE and NEW are receipt files, or `latest:SUITE/HARDWARE_ID/NAME` (newest receipt of that name).
    For a `summary.METRIC.*` field the raw samples also give a statistical verdict (bootstrap 95% CI of
    the ratio of medians): a regression counts only when it exceeds the allowance AND the interval lies
    wholly on the worse side of 1. A derived field has no samples and is judged by the percentage alone.
    """
    from harness.receipt import load_receipt, resolve_field
    from harness.report import find_receipt
    from harness.stats import verdict

    def locate(spec: str) -> dict:
        path = (
            find_receipt(spec, resolve_results(root, results)) if spec.startswith("latest:") else Path(spec)
        )
        return load_receipt(path)

    with reported_as_click_errors(KeyError, TypeError, ValueError, FileNotFoundError):
        old, fresh = locate(base), locate(new)
        old_value, new_value = float(resolve_field(old, metric)), float(resolve_field(fresh, metric))
    if old_value == 0:
        raise click.ClickException(f"{metric} is 0 in {base}: no ratio can be formed")
    parts = metric.split(".")
    sampled = (
        parts[0] == "summary"
        and len(parts) > 1
        and parts[1] in old["samples"]
        and parts[1] in fresh["samples"]
    )
    samples = (old["samples"][parts[1]], fresh["samples"][parts[1]]) if sampled else ()
    result = verdict(old_value, new_value, max_regression, higher_is_better, *samples)
    click.echo(f"{metric}: {result}")
    if result.regressed:
        click.echo(f"{metric} regressed beyond the allowed {max_regression}%", err=True)
        sys.exit(1)


@main.command()
@click.argument(
    "receipts", nargs=-1, required=True, type=click.Path(path_type=Path, exists=True, dir_okay=False)
)
@root_option
@results_option
def reproduce(receipts: tuple[Path, ...], root: Path | None, results: Path | None) -> None:
    """Re-run the command each RECEIPT records and say whether the new medians reproduce it.

    The new receipt is written like any other (into ROOT/results unless --results). A metric reproduces
    when its new median lies within the old receipt's p10–p90 width (at least 2% of the median) of the
    old median. Exits 1 when any metric of any receipt does not reproduce.
    """
    from harness.receipt import load_receipt
    from harness.reproduce import CannotRerun, check, run_again

    base = resolve_root(root)
    out = resolve_results(root, results)
    failed = []
    for path in receipts:
        old = load_receipt(path)
        here = describe()["hardware_id"]
        if here != old["hardware"]["hardware_id"]:
            click.echo(f"note: {path.name} was measured on {old['hardware']['hardware_id']}, this is {here}")
        try:
            new_path = run_again(old, base, out)
        except (CannotRerun, RuntimeError) as exc:
            raise click.ClickException(f"{path}: {exc}") from None
        click.echo(f"{path.name} -> {new_path}")
        for result in check(old, load_receipt(new_path)):
            click.echo(f"  {result}")
            if not result.passed:
                failed.append(f"{path.name}:{result.metric}")
    if failed:
        click.echo(f"not reproduced: {', '.join(failed)}", err=True)
        sys.exit(1)


@main.command()
@click.option("--repeats", default=30, show_default=True, help="Samples per encoder.")
@root_option
@results_option
def selfcheck(repeats: int, root: Path | None, results: Path | None) -> None:
    """Write real receipts from a small measurement (event encoding cost) to prove the evidence path."""
    from harness.selfcheck import run_selfcheck

    for path in run_selfcheck(repeats=repeats, results_dir=resolve_results(root, results)):
        click.echo(f"wrote {path}")


@main.command("import-device")
@click.argument("tar_path", metavar="TAR", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@root_option
@results_option
def import_device(tar_path: Path, root: Path | None, results: Path | None) -> None:
    """Put the receipts of a GPU run (gpu-check's TAR) under RESULTS, each checked first, where report
    and audit find them. Then run `kimi-harness report` and `kimi-harness figures`."""
    from harness.import_device import import_device_tar
    from harness.receipt import ReceiptError

    with reported_as_click_errors(ReceiptError):
        written, present = import_device_tar(tar_path, resolve_results(root, results))
    for path in written:
        click.echo(f"imported {path}")
    click.echo(f"{len(written)} receipts imported, {len(present)} already there")


@main.command()
@root_option
def claims(root: Path | None) -> None:
    """Regenerate docs/CLAIMS.md: each published claim (harness/claims.py) against its computed ceiling.

    Exits 1 when a claim exceeds its ceiling without a stated reason, or a fit the plan contradicts
    (what `kimi-harness audit` refuses too).
    """
    from harness.claims import check_all, findings, write

    checks = check_all()
    click.echo(f"wrote {write(resolve_root(root), checks)}")
    problems = findings(checks)
    for claim_id, message in problems:
        click.echo(f"claim {claim_id}: {message}", err=True)
    if problems:
        sys.exit(1)


from harness.plan.cli import plan_command  # noqa: E402  (its own module; registered here)

main.add_command(plan_command)
