"""The microbenchmark gate: its statistics on planted data, and the command end to end with the
benchmark run replaced by planted pytest-benchmark JSON."""

from __future__ import annotations

import json
import math
import random
import re
import statistics

import pytest
from click.testing import CliRunner

import runners.micro as micro
from harness.receipt import write_receipt
from runners.micro import judge, machine_factor, mann_whitney_greater

HARDWARE = {"hardware_id": "cpu-2c-Gate-CPU", "gpus": [], "cpu": {"model": "Gate CPU", "logical_cores": 2},
            "git": {"commit": "0" * 40, "dirty": False}}  # fmt: skip
GATE = {"floor_pct": 30.0, "noise_factor": 1.0, "alpha": 0.001}  # the defaults


def timings(rng: random.Random, median_us: float, n: int = 400) -> list[float]:
    """Skewed like real round times: a lognormal body and a few slow outliers (GC, preemption)."""
    return [median_us * rng.lognormvariate(0, 0.05) * (rng.uniform(2, 20) if rng.random() < 0.02 else 1)
            for _ in range(n)]  # fmt: skip


def test_mann_whitney_agrees_with_counting_pairs():
    rng = random.Random(1)
    new, old = [rng.gauss(1.1, 0.3) for _ in range(60)], [rng.gauss(1.0, 0.3) for _ in range(50)]
    u = sum((a > b) + 0.5 * (a == b) for a in new for b in old)
    z = (u - 60 * 50 / 2 - 0.5) / (60 * 50 * (60 + 50 + 1) / 12) ** 0.5
    assert mann_whitney_greater(new, old) == pytest.approx(0.5 * math.erfc(z / math.sqrt(2)))
    assert mann_whitney_greater([2.0] * 30, [1.0] * 30) < 1e-9
    assert mann_whitney_greater([1.0] * 30, [2.0] * 30) > 0.999
    assert mann_whitney_greater([1.0] * 30, [1.0] * 30) > 0.5  # all ties: no evidence either way


def _judge(name, old, new, spread_pct=2.0, factor=1.0):
    return judge(name, old, statistics.median(old), new, statistics.median(new), spread_pct, factor, **GATE)


@pytest.mark.parametrize("seed", range(5))
def test_same_code_passes_and_a_planted_slowdown_fails(seed):
    rng = random.Random(seed)
    base = timings(rng, 20.0)
    assert not _judge("same", base, timings(rng, 20.0)).regressed
    assert not _judge("noise", base, timings(rng, 24.0)).regressed  # within the floor
    slower = _judge("slower", base, timings(rng, 40.0))
    assert slower.regressed and slower.growth_pct == pytest.approx(100, abs=5)


def test_the_allowance_widens_with_the_measured_run_spread():
    rng = random.Random(7)
    base, new = timings(rng, 20.0), timings(rng, 30.0)
    assert _judge("quiet", base, new, spread_pct=5.0).regressed  # +50% against a 30% allowance
    noisy = _judge("noisy", base, new, spread_pct=75.0)  # runs 75% apart: 75% allowed
    assert noisy.allowance_pct == 75.0 and not noisy.regressed


def test_a_machine_slower_as_a_whole_fails_nothing_but_one_slower_step_still_fails():
    rng = random.Random(9)
    base, loaded = timings(rng, 20.0), timings(rng, 34.0)  # every case 1.7x slower: the machine
    assert _judge("loaded", base, loaded).regressed  # what the factor is there to prevent
    assert not _judge("loaded", base, loaded, factor=1.7).regressed
    assert _judge("step", base, timings(rng, 70.0), factor=1.7).regressed  # 3.5x: 2x beyond the machine
    assert machine_factor([(10.0, 17.0), (20.0, 34.0), (5.0, 8.5), (8.0, 30.0)]) == pytest.approx(1.7)


def test_a_large_growth_on_few_overlapping_samples_is_not_called_a_regression():
    rng = random.Random(3)
    base = [rng.uniform(10, 60) for _ in range(6)]
    assert not _judge("few", base, [v * 1.4 for v in base], spread_pct=0.0).regressed  # p is not small


def _bench_json(path, cases: dict[str, list[float]], commit_id: str = "1" * 40) -> None:
    benchmarks = [{"name": name, "fullname": f"benchmarks/test_x.py::{name}", "extra_info": {"case": name},
                   "options": {}, "stats": {"data": [t / 1e6 for t in data], "rounds": len(data), "iterations": 1}}
                  for name, data in cases.items()]  # fmt: skip
    machine = {"local_kimi": {k: v for k, v in HARDWARE.items() if k != "git"}}
    commit = {"id": commit_id, "dirty": False}
    path.write_text(json.dumps({"machine_info": machine, "commit_info": commit, "benchmarks": benchmarks,
                                "datetime": "2026-12-01T12:00:00+00:00", "version": "5.1.0"}))  # fmt: skip


@pytest.fixture
def gate(tmp_path, monkeypatch):
    """Runs `micro-gate` against baselines in tmp_path/results, the benchmark run replaced by `fresh`."""
    monkeypatch.setattr("harness.hardware.describe", lambda: dict(HARDWARE))
    results = tmp_path / "results"
    measurements: list[dict[str, float]] = []  # case -> median µs, one dict per measurement; the last repeats
    calls = []

    def fake_run(out_dir, runs, max_time, min_rounds, select):
        assert select == "k3" and runs == 3
        fresh = measurements[min(len(calls), len(measurements) - 1)]
        calls.append(fresh)
        rng = random.Random(11 + len(calls))
        paths = []
        for i in range(runs):
            paths.append(out_dir / f"run{i}.json")
            _bench_json(paths[-1], {name: timings(rng, median) for name, median in fresh.items()})
        return paths

    monkeypatch.setattr(micro, "run_benchmarks", fake_run)

    def run(baselines: dict[str, float], now: dict[str, float], *later: dict[str, float]):
        rng = random.Random(5)
        for name, median in baselines.items():
            write_receipt("micro", name, config={}, samples={"call_us": timings(rng, median)},
                          units={"call_us": "µs"}, derived={"run_spread_pct": 2.0}, results_dir=results,
                          hardware=HARDWARE, command=["test"])  # fmt: skip
        measurements[:] = [now, *later]
        calls.clear()
        result = CliRunner().invoke(
            micro.micro_gate_command, ["--results", str(results), "--confirm-pause", "0"]
        )
        result.measurements = len(calls)
        return result

    return run


CASES = {"k3.turn.chat.parse": 6.0, "k3.turn.chat.ingress": 11.0, "k3.turn.chat.encode": 13.0}


def test_the_gate_passes_on_unchanged_code(gate):
    same = gate(CASES, CASES)
    assert same.exit_code == 0, same.output
    assert "3 case(s) within their allowance" in same.output


def test_the_gate_passes_on_a_machine_slower_as_a_whole(gate):
    result = gate(CASES, {name: 1.8 * median for name, median in CASES.items()})
    assert result.exit_code == 0, result.output
    factor = re.search(
        r"machine factor \(median over the cases of now / baseline\): ([0-9.]+)", result.output
    )
    assert float(factor.group(1)) == pytest.approx(1.8, abs=0.05)


def test_the_gate_fails_and_names_the_regressed_case(gate):
    result = gate(CASES, CASES | {"k3.turn.chat.encode": 26.0})
    assert result.exit_code == 1
    assert "k3.turn.chat.encode: baseline" in result.output and "REGRESSED" in result.output
    assert "regressed beyond the measured noise: k3.turn.chat.encode" in result.output


def test_a_regression_that_is_gone_on_confirmation_passes(gate):
    burst = CASES | {"k3.turn.chat.encode": 26.0}  # one case slow while the machine had a burst of load
    result = gate(CASES, burst, CASES)
    assert result.exit_code == 0, result.output
    assert result.measurements == 2 and "confirming k3.turn.chat.encode (1/2)" in result.output


def test_a_regression_still_there_on_every_confirmation_fails(gate):
    slower = CASES | {"k3.turn.chat.encode": 26.0}
    result = gate(CASES, slower, slower, slower, CASES)  # gone only after the second confirmation: too late
    assert result.exit_code == 1
    assert result.measurements == 3 and "confirming k3.turn.chat.encode (2/2)" in result.output


def test_only_cases_flagged_first_can_fail_a_confirmation(gate):
    # a case that is fine at first and slow on confirmation is a burst during the confirmation
    result = gate(CASES, CASES | {"k3.turn.chat.encode": 26.0}, CASES | {"k3.turn.chat.parse": 12.0})
    assert result.exit_code == 0, result.output


def test_a_new_case_without_a_baseline_is_reported_not_gated(gate):
    result = gate(CASES, CASES | {"k3.turn.chat.new": 50.0})
    assert result.exit_code == 0, result.output
    assert "k3.turn.chat.new: no baseline receipt yet" in result.output


def test_without_committed_baselines_the_gate_skips_and_says_how_to_make_them(tmp_path, monkeypatch):
    monkeypatch.setattr(micro, "run_benchmarks", lambda *a: pytest.fail("nothing to compare: must not run"))
    result = CliRunner().invoke(micro.micro_gate_command, ["--results", str(tmp_path / "none")])
    assert result.exit_code == 0, result.output
    assert "skipped" in result.output and "nox -s bench-micro" in result.output


def test_runs_of_another_checkout_fail_the_gate_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.setattr("harness.hardware.describe", lambda: dict(HARDWARE))
    results = tmp_path / "results"
    write_receipt("micro", "k3.turn.chat.parse", config={}, samples={"call_us": [6.0] * 50}, units={"call_us": "µs"},
                  results_dir=results, hardware=HARDWARE, command=["test"])  # fmt: skip

    def fake_run(out_dir, runs, max_time, min_rounds, select):
        paths = [out_dir / f"run{i}.json" for i in range(runs)]
        for i, path in enumerate(paths):  # a commit landed between two runs
            _bench_json(path, {"k3.turn.chat.parse": [6.0] * 50}, commit_id=str(i) * 40)
        return paths

    monkeypatch.setattr(micro, "run_benchmarks", fake_run)
    result = CliRunner().invoke(micro.micro_gate_command, ["--results", str(results)])
    assert result.exit_code == 1 and "another machine or commit" in result.output


def test_baselines_of_a_cpu_with_other_vector_extensions_are_not_compared(tmp_path, monkeypatch):
    """Same hardware id, no AVX-512 here and AVX-512 in the baseline: the gate skips rather than judge."""
    results = tmp_path / "results"
    baseline_cpu = {**HARDWARE["cpu"], "vector_flags": ["avx2", "fma", "avx512f"]}
    write_receipt("micro", "k3.turn.chat.parse", config={}, samples={"call_us": [6.0] * 50}, units={"call_us": "µs"},
                  results_dir=results, hardware={**HARDWARE, "cpu": baseline_cpu}, command=["test"])  # fmt: skip
    here = {**HARDWARE, "cpu": {**HARDWARE["cpu"], "vector_flags": ["avx2", "fma"]}}
    monkeypatch.setattr("harness.hardware.describe", lambda: dict(here))
    monkeypatch.setattr(micro, "run_benchmarks", lambda *a: pytest.fail("measured against another CPU kind"))
    result = CliRunner().invoke(micro.micro_gate_command, ["--results", str(results)])
    assert result.exit_code == 0, result.output
    assert "skipped" in result.output and "['avx2', 'fma']" in result.output
