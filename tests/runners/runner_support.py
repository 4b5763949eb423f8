"""A runner command run in-process, as the runner tests run them."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from harness.receipt import load_receipt, receipt_paths
from runners.cli import main


def run_for_receipts(args: list[str], results: Path) -> list[dict]:
    """Run `python -m runners ARGS` with receipts under `results` and no regeneration; it must succeed
    (else its output is the failure); the receipts it wrote."""
    result = CliRunner().invoke(main, [*args, "--results", str(results), "--no-regenerate"])
    assert result.exit_code == 0, result.output
    return [load_receipt(p) for p in receipt_paths(results)]
