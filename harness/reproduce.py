"""Re-running a claim: the command a receipt records, run again, and whether its medians agree.

A receipt records `sys.argv` of the run that wrote it (`.../runners/__main__.py decode ...`,
`python -m runners kernels`). `rerun_argv` turns that into a command for this checkout and interpreter;
`reproduce` runs it, finds the new receipt of the same name and judges every metric both receipts sampled
against the old receipt's spread (`harness.stats.reproduction_tolerance`). `reproductions` finds, among receipts already written, the ones that
reproduce a given receipt (same suite, name, hardware and configuration, from a clean tree).
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from harness.receipt import is_dirty, load_receipt, receipt_paths
from harness.stats import reproduction_tolerance

# Console scripts a receipt's argv[0] may name, and the module each one runs.
SCRIPTS = {"kimi-harness": "harness", "kimi-engine": "engine", "k3": "k3"}


class CannotRerun(ValueError):
    """The recorded command is not one this checkout can run again."""


def rerun_argv(command: list[str]) -> list[str]:
    """The recorded command as `<this python> -m <package> ARGS`, so it runs this checkout's code."""
    if not command:
        raise CannotRerun("the receipt records no command")
    head = Path(command[0])
    if head.name.startswith("python") and command[1:2] == ["-m"] and len(command) > 2:
        return [sys.executable, "-m", *command[2:]]
    if head.name == "__main__.py":
        return [sys.executable, "-m", head.parent.name, *command[1:]]
    if head.name in SCRIPTS:
        return [sys.executable, "-m", SCRIPTS[head.name], *command[1:]]
    raise CannotRerun(f"cannot tell how to re-run {command!r}")


@dataclass(frozen=True)
class MetricCheck:
    metric: str
    old_median: float
    new_median: float
    tolerance: float

    @property
    def passed(self) -> bool:
        return abs(self.new_median - self.old_median) <= self.tolerance

    def __str__(self) -> str:
        verdict = "reproduced" if self.passed else "NOT reproduced"
        return (f"{self.metric}: was {self.old_median:.6g}, now {self.new_median:.6g} "
                f"(tolerance ±{self.tolerance:.3g}) — {verdict}")  # fmt: skip


def check(old: dict, new: dict) -> list[MetricCheck]:
    """Every metric both receipts sampled, the new median against the old receipt's spread."""
    return [
        MetricCheck(metric, stats["median"], new["summary"][metric]["median"], reproduction_tolerance(stats))
        for metric, stats in sorted(old["summary"].items())
        if metric in new["summary"]
    ]


def same_claim(a: dict, b: dict) -> bool:
    """Two receipts measure the same thing: suite, name, hardware and configuration."""
    return (a["suite"], a["name"], a["hardware"]["hardware_id"], a["config"]) == (
        b["suite"], b["name"], b["hardware"]["hardware_id"], b["config"])  # fmt: skip


def reproductions(receipt: dict, results_dir: Path) -> list[tuple[Path, list[MetricCheck]]]:
    """Other clean receipts of the same claim whose medians all lie within the older one's spread."""
    found = []
    for path in receipt_paths(results_dir):
        other = load_receipt(path)
        if other["id"] == receipt["id"] or is_dirty(other) or not same_claim(receipt, other):
            continue
        old, new = sorted((receipt, other), key=lambda r: r["created"])
        checks = check(old, new)
        if checks and all(c.passed for c in checks):
            found.append((path, checks))
    return found


def run_again(receipt: dict, root: Path, results_dir: Path) -> Path:
    """Run the receipt's command in `root`, writing into `results_dir`; the new receipt of the same name."""
    argv = rerun_argv(receipt["command"])
    if results_dir.resolve() != (root / "results").resolve():
        argv += ["--results", str(results_dir)]
    before = set(receipt_paths(results_dir))
    code = subprocess.run(argv, cwd=root).returncode
    if code != 0:
        raise RuntimeError(f"{' '.join(argv)} exited with {code}")
    fresh = [p for p in receipt_paths(results_dir) if p not in before]
    named = [p for p in fresh if load_receipt(p)["name"] == receipt["name"]]
    if not named:
        raise RuntimeError(f"{' '.join(argv)} wrote no receipt named {receipt['name']!r}")
    return max(named, key=lambda p: load_receipt(p)["created"])
