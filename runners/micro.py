"""`python -m runners micro` and `micro-gate`: the pytest-benchmark microbenchmarks as receipts, and the
CI gate that compares a short run of them with the committed receipts (method in docs/METHODS.md).

`micro` runs benchmarks/ in `--runs` separate pytest processes (a fresh interpreter each, so the
run-to-run noise is measured, not only the round-to-round one), imports the JSON of all runs as one
`micro` receipt per case (harness.microbench) and regenerates RESULTS.md and the figures.

`micro-gate` runs the k3 cases briefly in `--runs` separate runs and compares each with the newest
committed receipt of the same case and machine. Each side is summed up by its best run's median
(other work on a machine only adds time), and the machine factor — the median over all cases of
now / baseline — is divided out, so a machine that is slower as a whole today fails nothing. A case
regresses when both hold:
- its growth beyond the machine factor exceeds the allowance `max(--floor, --noise-factor × spread)`,
  spread being the larger of the baseline's and this run's `run_spread_pct` (how far apart the medians
  of repeated runs lie on that machine);
- a one-sided Mann-Whitney test on the raw samples (the new ones divided by the machine factor) says
  the new times are larger (p < --alpha).
No committed baseline for this machine: the gate says so and passes.
"""

from __future__ import annotations

import math
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import click

from harness.hardware import REPO_ROOT
from harness.receipt import RESULTS_DIR
from runners.options import results_option
from runners.outcome import report

BENCH_DIR = REPO_ROOT / "benchmarks"
GATED = "k3"  # the gate's cases: k3's own code on a turn's path (names k3.turn.*, k3.deltas.*)
BASELINE_COMMAND = "nox -s bench-micro"


# Each round lasts at least this long (pytest-benchmark calls the case as often as that takes): far
# shorter than a scheduler time slice, so on a busy machine most rounds run unpreempted and the median
# stays the cost of the code (rounds of 2 ms read several times slower under load), yet long enough
# that --max-time gives hundreds of rounds per case, not a hundred thousand: a receipt stays small.
MIN_ROUND_S = 0.0001


def run_benchmarks(
    out_dir: Path, runs: int, max_time: float, min_rounds: int, select: str | None
) -> list[Path]:
    """`runs` separate pytest-benchmark runs of benchmarks/ (optionally `-k select`), JSON with raw data."""
    paths = []
    for i in range(runs):
        path = out_dir / f"run{i + 1}.json"
        cmd = [sys.executable, "-m", "pytest", str(BENCH_DIR), "-q", "-p", "no:cacheprovider",
               f"--benchmark-json={path}", "--benchmark-save-data", f"--benchmark-max-time={max_time}",
               f"--benchmark-min-rounds={min_rounds}", f"--benchmark-min-time={MIN_ROUND_S}",
               "--benchmark-warmup=on", "--benchmark-warmup-iterations=1000",
               "--benchmark-columns=median,iqr,rounds"]  # fmt: skip
        if select:
            cmd += ["-k", select]
        click.echo(f"run {i + 1}/{runs}: {' '.join(cmd[2:])}", err=True)
        if subprocess.run(cmd, cwd=REPO_ROOT).returncode != 0:
            raise click.ClickException(f"the benchmarks failed (run {i + 1}); see pytest's output above")
        paths.append(path)
    return paths


@click.command("micro")
@click.option("--runs", type=click.IntRange(1), default=3, show_default=True,
              help="Separate pytest runs; their spread is the run-to-run noise the gate allows for.")  # fmt: skip
@click.option("--max-time", type=click.FloatRange(0, min_open=True), default=0.05, show_default=True,
              help="Seconds pytest-benchmark spends on each case per run (more rounds: tighter medians).")  # fmt: skip
@click.option("--min-rounds", type=click.IntRange(1), default=20, show_default=True,
              help="Fewest rounds pytest-benchmark times of each case per run, however long they take.")  # fmt: skip
@click.option("-k", "select", default=None, help="pytest -k expression to run some cases only (e.g. k3).")
@results_option
@click.option("--no-regenerate", is_flag=True, help="Write receipts only; skip RESULTS.md and figures.")
def micro_command(runs, max_time, min_rounds, select, results, no_regenerate) -> None:
    """Microbenchmarks of k3's turn steps and the engine's per-token host work, as `micro` receipts."""
    from harness.microbench import BenchmarkJSONError, import_benchmark
    from runners.regenerate import regenerate

    with tempfile.TemporaryDirectory() as scratch:
        paths = run_benchmarks(Path(scratch), runs, max_time, min_rounds, select)
        try:
            written = import_benchmark(paths, results)
        except BenchmarkJSONError as exc:  # e.g. a commit made between two runs
            raise click.ClickException(str(exc)) from None
    report(written)
    if not no_regenerate:
        regenerate(results)


# -- the verdict ------------------------------------------------------------------------------------


def mann_whitney_greater(new: list[float], old: list[float]) -> float:
    """One-sided p-value that `new` is stochastically larger than `old` (normal approximation with the
    tie correction; the samples here are hundreds of rounds, far beyond where it is accurate)."""
    n1, n2 = len(new), len(old)
    pooled = sorted([(v, 0) for v in new] + [(v, 1) for v in old])
    ranks_new, ties, i = 0.0, 0.0, 0
    while i < len(pooled):
        j = i
        while j < len(pooled) and pooled[j][0] == pooled[i][0]:
            j += 1
        rank = (i + j + 1) / 2  # mean of ranks i+1 .. j
        ranks_new += rank * sum(1 for _, group in pooled[i:j] if group == 0)
        ties += (j - i) ** 3 - (j - i)
        i = j
    u = ranks_new - n1 * (n1 + 1) / 2
    n = n1 + n2
    variance = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1)))
    if variance <= 0:
        return 1.0
    z = (u - n1 * n2 / 2 - 0.5) / math.sqrt(variance)  # continuity-corrected
    return 0.5 * math.erfc(z / math.sqrt(2))


@dataclass(frozen=True)
class Verdict:
    name: str
    old_us: float  # best run median of the baseline
    new_us: float  # best run median now
    growth_pct: float  # after dividing out the machine factor
    allowance_pct: float
    p_value: float
    regressed: bool

    def line(self) -> str:
        state = "REGRESSED" if self.regressed else "ok"
        return (f"{self.name}: baseline {self.old_us:.4g} µs, now {self.new_us:.4g} µs "
                f"({self.growth_pct:+.1f}% beyond the machine factor, allowed +{self.allowance_pct:.0f}%, "
                f"p={self.p_value:.2g}) — {state}")  # fmt: skip


def machine_factor(pairs: list[tuple[float, float]]) -> float:
    """How much slower this machine runs now than when the baselines were measured: the median over the
    cases of (best run median now / baseline's). A slowdown of k3's code shows in some cases; one that
    shows in most of them at once is the machine (the `proxy-gate` end-to-end cases watch k3 as a whole)."""
    return statistics.median(new / old for old, new in pairs)


def judge(name: str, old: list[float], old_us: float, new: list[float], new_us: float, spread_pct: float,
          factor: float, floor_pct: float, noise_factor: float, alpha: float) -> Verdict:  # fmt: skip
    """Whether the case is slower than its baseline beyond the measured noise (the module docstring)."""
    growth = 100 * (new_us / (old_us * factor) - 1)
    allowance = max(floor_pct, noise_factor * spread_pct)
    p = mann_whitney_greater([t / factor for t in new], old)
    return Verdict(name, old_us, new_us, growth, allowance, p, growth > allowance and p < alpha)


def _best(receipt: dict) -> float:
    return receipt["derived"].get("best_run_median_us", receipt["summary"]["call_us"]["median"])


@click.command("micro-gate")
@click.option("--floor", "floor_pct", type=click.FloatRange(0), default=30.0, show_default=True,
              help="Smallest allowed growth of a case's median, in percent (docs/METHODS.md says how it was chosen).")  # fmt: skip
@click.option("--noise-factor", type=click.FloatRange(0), default=1.0, show_default=True,
              help="The allowance is at least this many times the run-to-run spread of the medians.")  # fmt: skip
@click.option("--alpha", type=click.FloatRange(0, 1), default=0.001, show_default=True,
              help="A growth counts only when the Mann-Whitney test's one-sided p-value is below this.")  # fmt: skip
@click.option("--runs", type=click.IntRange(2), default=3, show_default=True,
              help="Separate runs of the cases; each case is judged on its best run.")  # fmt: skip
@click.option("--max-time", type=click.FloatRange(0, min_open=True), default=0.05, show_default=True,
              help="Seconds per case per run.")  # fmt: skip
@click.option("--results", type=click.Path(path_type=Path), default=RESULTS_DIR,
              show_default="results/ of this checkout", help="Where the committed baseline receipts are.")  # fmt: skip
@click.option("--confirm", type=click.IntRange(0), default=2, show_default=True,
              help="Measure the cases that regressed again this many times; one fails only if it regresses every time.")  # fmt: skip
@click.option("--confirm-pause", type=click.FloatRange(0), default=20.0, show_default=True,
              help="Seconds to wait before each confirmation, so a passing burst of load is over.")  # fmt: skip
def micro_gate_command(floor_pct, noise_factor, alpha, runs, max_time, results, confirm, confirm_pause) -> None:  # fmt: skip
    """CI gate: a short run of the k3 microbenchmarks against the committed `micro` receipts."""
    from harness.hardware import describe
    from harness.microbench import SUITE
    from harness.report import load_frame, newest

    machine = describe()
    hardware_id, flags = machine["hardware_id"], machine["cpu"].get("vector_flags")
    frame = load_frame(results)
    if not frame.empty:
        # Only baselines of a CPU with the same vector extensions: one hardware id can name CPUs with and
        # without AVX-512, and the cases' relative costs differ between them (measured: one k3 case 1.6x
        # beyond the machine factor on a CPU without AVX-512, on the same code).
        same_kind = frame.receipt.map(lambda r: r["hardware"]["cpu"].get("vector_flags") == flags)
        frame = newest(frame[(frame.suite == SUITE) & (frame.hardware_id == hardware_id) & same_kind])
        frame = frame[frame.name.str.startswith(GATED)]
    if frame.empty:
        click.echo(f"micro gate: skipped — no committed {SUITE} receipts of the {GATED} cases for {hardware_id} "
                   f"with vector extensions {flags} in {results}; produce them on a quiet machine with "
                   f"`{BASELINE_COMMAND}` and commit them")  # fmt: skip
        return
    baselines = {row.name: row.receipt for row in frame.itertuples()}
    verdicts = _measure_and_judge(baselines, runs, max_time, floor_pct, noise_factor, alpha)
    if not verdicts:
        click.echo("micro gate: none of the committed cases ran; nothing to compare")
        return
    for verdict in verdicts:
        click.echo(verdict.line())
    suspects = [v.name for v in verdicts if v.regressed]
    # A burst of load on a shared machine can slow a case for the whole ~20 s of the runs; a slowdown of
    # the code is still there minutes later. A case fails only when every confirmation round agrees.
    for attempt in range(1, confirm + 1):
        if not suspects:
            break
        click.echo(
            f"confirming {', '.join(suspects)} ({attempt}/{confirm}) after a {confirm_pause:g} s pause"
        )
        time.sleep(confirm_pause)
        again = {
            v.name: v for v in _measure_and_judge(baselines, runs, max_time, floor_pct, noise_factor, alpha)
        }
        for name in suspects:
            if name in again:
                click.echo(f"  {again[name].line()}")
        suspects = [name for name in suspects if name in again and again[name].regressed]
    if suspects:
        raise click.ClickException(
            f"k3 microbenchmarks regressed beyond the measured noise: {', '.join(suspects)}"
        )
    click.echo(f"micro gate: {len(verdicts)} case(s) within their allowance")


def _measure_and_judge(baselines: dict[str, dict], runs: int, max_time: float, floor_pct: float,
                       noise_factor: float, alpha: float) -> list[Verdict]:  # fmt: skip
    """One measurement of the gated cases (`runs` separate runs) judged against their baselines."""
    from harness.microbench import BenchmarkJSONError, read_runs, receipts_from_runs

    with tempfile.TemporaryDirectory() as scratch:
        paths = run_benchmarks(Path(scratch), runs, max_time, 20, GATED)
        try:
            fresh = receipts_from_runs(read_runs(paths))
        except BenchmarkJSONError as exc:  # e.g. the checkout changed between two runs
            raise click.ClickException(str(exc)) from None
    for receipt in fresh:
        if receipt["name"] not in baselines:
            click.echo(f"{receipt['name']}: no baseline receipt yet — not gated")
    pairs = [(baselines[r["name"]], r) for r in fresh if r["name"] in baselines]
    if not pairs:
        return []
    factor = machine_factor([(_best(base), _best(new)) for base, new in pairs])
    click.echo(f"machine factor (median over the cases of now / baseline): {factor:.3f}")
    verdicts = []
    for base, new in pairs:
        spread = max(base["derived"].get("run_spread_pct", 0.0), new["derived"]["run_spread_pct"])
        verdicts.append(judge(new["name"], base["samples"]["call_us"], _best(base), new["samples"]["call_us"],
                              _best(new), spread, factor, floor_pct, noise_factor, alpha))  # fmt: skip
    return verdicts
