import os
import subprocess
import sys

from click.testing import CliRunner

from harness import figures
from harness.hardware import REPO_ROOT
from harness.receipt import load_receipt, receipt_paths
from runners.cli import main
from runners.kernels import last_level_cache_bytes

OPS = "route_combine,w16a16_gemv"


def _receipts(results):
    return {r["name"]: r for r in (load_receipt(p) for p in receipt_paths(results))}


def test_cpu_run_times_every_variant_and_marks_the_interpreter_not_comparable(tmp_path):
    # The root conftest set TRITON_INTERPRET=1 before triton was imported, so this runs in-process.
    result = CliRunner().invoke(
        main,
        ["kernels", "--device", "cpu", "--ops", OPS, "--repeats", "2", "--copy-mib", "8",
         "--results", str(tmp_path), "--no-regenerate"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    receipts = _receipts(tmp_path)
    copy = receipts.pop("cpu_copy@8MiB")
    assert copy["derived"]["copy_bandwidth_gbs"] > 0 and copy["units"]["copy_gbs"] == "GB/s"
    variants = {(r["config"]["op"], r["config"]["variant"]) for r in receipts.values()}
    assert variants == {("route_combine", "reference"), ("route_combine", "triton"),
                        ("w16a16_gemv", "reference"), ("w16a16_gemv", "triton"), ("w16a16_gemv", "native"),
                        ("w16a16_gemv", "cpp")}  # fmt: skip
    for r in receipts.values():
        cfg, derived = r["config"], r["derived"]
        interpreted = cfg["variant"] == "triton"
        assert cfg["comparable"] is not interpreted and cfg["interpreted"] is interpreted
        assert ("interpreter" in r["notes"]) is interpreted and "not comparable" in r["notes"]
        expected = {"reference": True} if cfg["variant"] == "reference" else {"passed": True}
        assert {k: v for k, v in cfg["equivalence"].items() if k in expected} == expected
        assert len(r["samples"]["time_ms"]) == 2 and min(r["samples"]["time_ms"]) > 0
        assert derived["copy_bandwidth_gbs"] == copy["derived"]["copy_bandwidth_gbs"]
        assert derived["fraction_of_copy"] == derived["achieved_gbs"] / derived["copy_bandwidth_gbs"] > 0
        assert cfg["shape"]["B"] == 1 and cfg["preset"] == "tiny"
    bars = figures.build_all(tmp_path)["kernel_bandwidth"]["bars"]  # the interpreted runs are left out
    assert sorted(b["label"] for b in bars) == ["route_combine.reference experts_combine_B1",
                                                "w16a16_gemv.cpp lm_head_B1",
                                                "w16a16_gemv.cpp router_logits_B1",
                                                "w16a16_gemv.native lm_head_B1",
                                                "w16a16_gemv.native router_logits_B1",
                                                "w16a16_gemv.reference lm_head_B1",
                                                "w16a16_gemv.reference router_logits_B1"]  # fmt: skip


def test_without_the_interpreter_variable_the_cli_runs_the_work_in_a_child(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-m", "runners", "kernels", "--device", "cpu", "--ops", "route_combine",
         "--repeats", "1", "--copy-mib", "8", "--results", str(tmp_path), "--no-regenerate"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    receipts = _receipts(tmp_path)
    assert receipts["route_combine.triton@experts_combine_B1:B1xS3xN128"]["config"]["interpreted"] is True


def test_unknown_operations_are_refused(tmp_path):
    result = CliRunner().invoke(main, ["kernels", "--ops", "w4a16_gemv,nope", "--results", str(tmp_path)])
    assert result.exit_code == 2 and "unknown operations ['nope']" in result.output


def test_last_level_cache_is_read():
    assert last_level_cache_bytes() >= 1 << 20
