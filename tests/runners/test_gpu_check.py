"""`python -m runners gpu-check`: the one prepared GPU run, tested as a dry run on the CPU."""

import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from harness.receipt import load_receipt

REPO = Path(__file__).resolve().parents[2]
# What the GPU image lacks: importing any of them there fails, so here they are made to fail too.
ABSENT_ON_DEVICE = ("orjson", "starlette", "uvicorn", "httptools", "uvloop", "k3")
SAFE_NAME = re.compile(r"[A-Za-z0-9._-]+")


def _device_like_env(tmp_path: Path) -> dict:
    """PYTHONPATH with a sitecustomize that blocks ABSENT_ON_DEVICE in every process (the steps' too)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        f"import sys\nfor name in {ABSENT_ON_DEVICE!r}:\n    sys.modules[name] = None\n"
    )
    clean = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "KIMI_KERNELS")}
    return {**clean, "PYTHONPATH": os.pathsep.join([str(REPO), str(site)])}


@pytest.mark.slow
def test_dry_run_without_k3_dependencies_leaves_two_transfer_safe_files(tmp_path):
    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, "-m", "runners", "gpu-check", "--dry-run", "--out", str(out)],
        cwd=REPO, env=_device_like_env(tmp_path), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    files = sorted(p.relative_to(out) for p in out.rglob("*"))
    assert [str(f) for f in files] == ["gpu-check-receipts.tar", "gpu-check-summary.txt"]
    summary = (out / "gpu-check-summary.txt").read_text()
    for step in ("copy", "kernels", "decode", "prefill", "count"):
        assert f"{step}: passed" in summary
    with tarfile.open(out / "gpu-check-receipts.tar") as tar:
        names = tar.getnames()
        tar.extractall(tmp_path / "back", filter="data")
    assert "log.txt" in names
    receipts = [load_receipt(p) for p in (tmp_path / "back" / "results").rglob("*.json")]
    suites = {r["suite"] for r in receipts}
    assert suites == {"kernels", "decode", "kernel-count"}
    assert all(SAFE_NAME.fullmatch(Path(n).name) for n in names)
    # One denominator: every kernel receipt quotes the copy receipt's bandwidth.
    (copy,) = [r for r in receipts if r["name"].startswith("device_copy")]
    timed = [r for r in receipts if "fraction_of_copy" in r["derived"]]
    assert timed and {r["derived"]["copy_bandwidth_gbs"] for r in timed} == {
        copy["derived"]["copy_bandwidth_gbs"]
    }
    decode = [r for r in receipts if r["suite"] == "decode"]
    assert sorted(r["config"]["context"] for r in decode) == [17, 64]
    assert all(r["samples"]["copy_gbs"] == copy["samples"]["copy_gbs"] for r in decode)


def test_without_a_gpu_the_run_stops_at_the_first_step_and_says_why(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, "-m", "runners", "gpu-check", "--out", str(out)],
        cwd=REPO, env=_device_like_env(tmp_path), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode != 0
    assert "copy: FAILED (exit 2)" in (out / "gpu-check-summary.txt").read_text()
    assert "needs an NVIDIA GPU" in run.stderr
