"""Helpers of the runner tests: a runner command run in-process; a checkpoint's shard digest."""

from __future__ import annotations

import hashlib
import json
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


def shards_sha256(checkpoint: Path) -> str:
    """sha256 of a sharded checkpoint's shard files in name order, read from its index (independently of
    engine/model/loading.py's digest)."""
    index = json.loads((checkpoint / "model.safetensors.index.json").read_text())
    digest = hashlib.sha256()
    for shard in sorted(set(index["weight_map"].values())):
        digest.update((checkpoint / shard).read_bytes())
    return digest.hexdigest()
