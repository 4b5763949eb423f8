"""Statistical verdicts (bootstrap CI of the ratio of medians) and re-running the claim a receipt records."""

import random
import sys
import textwrap

import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.receipt import load_receipt, receipt_paths, write_receipt
from harness.reproduce import CannotRerun, rerun_argv
from harness.stats import compare_samples, reproduction_tolerance, verdict
from tests.harness.conftest import HARDWARE


def noisy(center, n=40, spread=0.3, seed=0):
    rng = random.Random(seed)
    return [center * (1 + rng.uniform(-spread, spread)) for _ in range(n)]


def test_a_real_shift_is_significant_and_noise_is_not():
    base = noisy(1.0, seed=1)
    assert compare_samples(base, noisy(2.0, seed=2)).direction(higher_is_better=False) == "worse"
    assert compare_samples(base, noisy(2.0, seed=2)).direction(higher_is_better=True) == "better"
    same = compare_samples(base, noisy(1.0, seed=3))
    assert same.low < 1 < same.high and same.direction(False) == "no significant change"
    assert compare_samples(base, noisy(1.0, seed=3)) == same  # fixed resampling seed: same verdict


def test_a_regression_counts_only_beyond_the_allowance_and_outside_the_interval():
    few_old, few_new = [1.0, 0.5, 1.5], [1.3, 0.6, 2.0]  # +30% in medians, intervals overlapping widely
    assert not verdict(1.0, 1.3, 10, False, few_old, few_new).regressed
    assert verdict(1.0, 1.3, 10, False).regressed  # without samples: the percentage alone
    assert not verdict(1.0, 1.3, 50, False, [1.0] * 5, [1.3] * 5).regressed  # within the allowance
    assert verdict(1.0, 1.3, 10, False, [1.0] * 5, [1.3] * 5).regressed


def test_compare_reports_the_interval_for_sampled_metrics(make_receipt):
    base = make_receipt(name="b", samples={"ms": [1.0, 0.5, 1.5]}, units={"ms": "ms"})
    new = make_receipt(name="n", samples={"ms": [1.3, 0.6, 2.0]}, units={"ms": "ms"})
    args = ["compare", str(base), str(new), "--metric", "summary.ms.median", "--max-regression", "10"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0 and "95% CI [" in result.output and "no significant change" in result.output


def test_tolerance_comes_from_the_old_receipts_spread():
    assert reproduction_tolerance({"median": 10.0, "p10": 8.0, "p90": 13.0}) == 5.0
    assert reproduction_tolerance({"median": 10.0, "p10": 10.0, "p90": 10.0}) == pytest.approx(0.2)


@pytest.mark.parametrize(
    ("command", "tail"),
    [
        (["/work/main/runners/__main__.py", "decode", "--no-regenerate"], ["-m", "runners", "decode", "--no-regenerate"]),
        (["/work/venv/bin/python", "-m", "runners", "kernels"], ["-m", "runners", "kernels"]),
        (["/usr/local/bin/kimi-harness", "selfcheck"], ["-m", "harness", "selfcheck"]),
    ],
)  # fmt: skip
def test_a_recorded_command_runs_again_with_this_python(command, tail):
    assert rerun_argv(command) == [sys.executable, *tail]


def test_a_command_that_cannot_be_rerun_is_refused():
    with pytest.raises(CannotRerun, match="cannot tell"):
        rerun_argv(["test"])


RUNNER = '''
    """A deterministic stand-in for a runner: writes one receipt with fixed samples."""
    import sys
    from pathlib import Path

    from harness.receipt import write_receipt

    results = Path(sys.argv[sys.argv.index("--results") + 1])
    write_receipt("demo", "probe", config={"size": 1}, samples={"ms": [1.0, 1.1, 1.2]}, units={"ms": "ms"},
                  results_dir=results, command=sys.argv)
'''


@pytest.mark.parametrize(("recorded", "reproduced"), [([1.0, 1.1, 1.2], True), ([5.0, 5.1, 5.2], False)])
def test_reproduce_reruns_the_recorded_command_and_judges_the_medians(tmp_path, recorded, reproduced):
    (tmp_path / "demo_runner.py").write_text(textwrap.dedent(RUNNER))
    results = tmp_path / "results"
    old = write_receipt(
        "demo", "probe", config={"size": 1}, samples={"ms": recorded}, units={"ms": "ms"}, results_dir=results,
        hardware=HARDWARE | {"hardware_id": "elsewhere"},
        command=["/usr/bin/python3", "-m", "demo_runner", "--results", str(results)],
    )  # fmt: skip
    result = CliRunner().invoke(main, ["reproduce", str(old), "--root", str(tmp_path)])
    assert "was measured on elsewhere" in result.output
    assert len(receipt_paths(results)) == 2
    assert result.exit_code == (0 if reproduced else 1), result.output
    assert ("ms: was 1.1, now 1.1" in result.output) == reproduced
    assert ("NOT reproduced" in result.output) != reproduced


def test_audit_lists_which_readme_numbers_are_reproduced(tmp_path, make_receipt):
    claim = make_receipt(name="claim", samples={"encode_us": [1.0, 1.1, 1.2]})
    config = load_receipt(claim)["config"]
    again = write_receipt(
        "harness", "claim", config=config, samples={"encode_us": [1.05, 1.1, 1.15]}, units={"encode_us": "µs"},
        results_dir=make_receipt.results, hardware=HARDWARE, command=["test"],
    )  # fmt: skip
    lone = make_receipt(name="lone", samples={"encode_us": [2.0, 2.0]})
    rel = {p: p.relative_to(make_receipt.results).as_posix() for p in (claim, lone)}
    (tmp_path / "README.md").write_text(
        f"a 1.1 µs <!-- receipt: {rel[claim]}#summary.encode_us.median -->\n"
        f"b 2.0 µs <!-- receipt: {rel[lone]}#summary.encode_us.median -->\n"
    )
    result = CliRunner().invoke(main, ["audit", "--reproduced", "--root", str(tmp_path)])
    assert result.exit_code == 0
    first, second = result.output.splitlines()
    assert (
        first.startswith("README.md:1: 1.1")
        and again.name in first
        and "reproduced on cpu-2c-Test-CPU" in first
    )
    assert (
        second.startswith("README.md:2: 2.0") and "no passing reproduction on cpu-2c-Test-CPU yet" in second
    )


def test_a_base_at_or_below_zero_gives_the_percentage_only():
    with pytest.raises(ValueError, match="positive base"):
        compare_samples([-1.0, -0.5, 0.2], [1.0, 1.1, 1.2])
    assert verdict(0.5, 1.0, 10, False, [-1.0, -0.5, 0.2], [1.0, 1.1, 1.2]).comparison is None
