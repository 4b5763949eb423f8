"""The command-line tools around the kernels, run as a user would (fresh processes, no interpreter)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.kernel_tools.shapes import EDGE_SHAPES, kimi_shapes
from engine.kernel_tools.traffic import op_bytes, weight_bytes
from engine.model import preset
from runners import gpu_check

REPO = Path(__file__).resolve().parents[2]


def _run(*args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "KIMI_KERNELS")}
    return subprocess.run(
        [sys.executable, *args], cwd=REPO, env={**clean, **env}, capture_output=True, text=True, timeout=180
    )


def test_kernels_command_lists_defaults_and_explains_the_cpu():
    result = _run("-m", "engine", "kernels", "--device", "cpu")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("-> selected on cpu: reference (shipped default)") == 5  # 2 GEMV ops, 3 fused
    assert result.stdout.count("-> selected on cpu: int4pack (shipped default)") == 1
    assert (
        result.stdout.count("-> selected on cpu: cpp (shipped default)") == 5
    )  # dense + 2 INT4, 2 dense banks
    assert "default(cuda)" in result.stdout
    assert "set TRITON_INTERPRET=1 before triton is first imported" in result.stdout


def test_kernels_command_refuses_what_cannot_run():
    result = _run("-m", "engine", "kernels", "--device", "cpu", KIMI_KERNELS="w4a16_gemv=triton")
    assert result.returncode == 1
    assert "NOT RUNNABLE on cpu: w4a16_gemv=triton (KIMI_KERNELS) cannot run on cpu" in result.stdout
    interpreted = _run(
        "-m", "engine", "kernels", "--device", "cpu", KIMI_KERNELS="w4a16_gemv=triton", TRITON_INTERPRET="1"
    )
    assert interpreted.returncode == 0 and "selected on cpu: triton (KIMI_KERNELS)" in interpreted.stdout
    typo = _run("-m", "engine", "kernels", KIMI_KERNELS="w4a16_gemv=fast")
    assert typo.returncode == 1 and "no variant 'fast'" in typo.stderr


def test_full_size_shape_table_follows_the_config():
    shapes = kimi_shapes(preset("full"), batches=(1, 8))
    grouped = {s["name"]: s for s in shapes["w4a16_grouped_gemv"]}
    assert grouped["experts_gate_up_B1"] | {"name": None} == {
        "name": None, "B": 1, "S": 9, "E": 257, "N": 1024, "K": 2304, "group": 32,
    }  # fmt: skip
    assert grouped["experts_down_B8"]["per_slot"] and grouped["experts_down_B8"]["N"] == 2304
    dense = {s["name"]: (s["N"], s["K"]) for s in shapes["w4a16_gemv"]}
    assert dense["kda_qkv_B1"] == (4096, 2304) and dense["mla_kv_b_B1"] == (8192, 512)
    assert dense["lm_head_B8"] == (163840, 2304)
    assert set(EDGE_SHAPES) == set(shapes)


def test_byte_counts_are_compulsory_traffic():
    assert weight_bytes("int4", 1024, 2304, 32) == 1024 * 1152 + 1024 * 72 * 2
    shape = {"B": 1, "S": 9, "E": 257, "N": 1024, "K": 2304, "group": 32}
    assert (
        op_bytes("w4a16_grouped_gemv", shape)
        == 9 * weight_bytes("int4", 1024, 2304, 32) + 2304 * 2 + 9 * 4 + 9 * 1024 * 2
    )
    assert op_bytes("w4a16_grouped_gemv", shape, unique_experts=3) < op_bytes("w4a16_grouped_gemv", shape)
    assert op_bytes("w4a16_grouped_swiglu", shape) - op_bytes(
        "w4a16_grouped_gemv", shape
    ) == 9 * weight_bytes("int4", 1024, 2304, 32)
    head = {"B": 1, "N": 163840, "K": 2304, "out": "fp32"}
    assert op_bytes("w16a16_gemv", head) == 163840 * 2304 * 2 + 2304 * 2 + 163840 * 4
    with pytest.raises(ValueError):
        op_bytes("nope", head)


def test_gpu_check_plan_and_receipt_fields():
    checks, timed = gpu_check.plan(preset("full"), 32, (1,), ["w4a16_grouped_gemv", "route_combine"])
    assert set(checks) == {"w4a16_grouped_gemv", "route_combine"}
    assert len(checks["w4a16_grouped_gemv"]) == len(EDGE_SHAPES["w4a16_grouped_gemv"]) + 2
    assert [m.name for m in timed] == [
        "w4a16_grouped_gemv.triton@experts_gate_up_B1:B1xS9xE257xN1024xK2304g32",
        "w4a16_grouped_gemv.triton@experts_down_B1:B1xS9xE257xN2304xK1024g32",
        "route_combine.triton@experts_combine_B1:B1xS9xN2304",
    ]
    assert gpu_check.rotations(timed[0].bytes_per_call, 50 * 2**20) == 18  # > 4x a 50 MiB L2
    assert gpu_check.rotations(10**9, 50 * 2**20) == 2
    fields = gpu_check.receipt_fields(timed[0], [0.01, 0.012, 0.011], 4000.0, 18, {"passed": True})
    assert fields["samples"] == {"time_ms": [0.01, 0.012, 0.011]} and fields["units"] == {"time_ms": "ms"}
    achieved = timed[0].bytes_per_call / 0.011e-3 / 1e9
    assert fields["derived"]["achieved_gbs"] == pytest.approx(achieved)
    assert fields["derived"]["fraction_of_copy"] == pytest.approx(achieved / 4000.0)
    assert fields["config"]["shipped_default_on_cuda"] is True
    json.dumps(fields)  # receipts must serialise

    _, swept = gpu_check.plan(preset("full"), 32, (1, 8), ["w4a16_grouped_swiglu"], sweep=True)
    tuned = [m for m in swept if m.launch is not None]
    assert [m.name for m in tuned] == [
        f"w4a16_grouped_swiglu.triton_fused[n{n}_k256_s1]@experts_swiglu_B1:B1xS9xE257xN1024xK2304g32"
        for n in (16, 32, 64)
    ]
    assert tuned[0].options == {"config": tuned[0].launch}
    json.dumps(gpu_check.receipt_fields(tuned[0], [0.02], 4000.0, 2, {"passed": True}))


def test_gpu_check_dry_run_and_missing_gpu(tmp_path):
    dry = _run("-m", "runners.gpu_check", "--dry-run", "--batches", "1")
    assert dry.returncode == 0
    assert "time w4a16_gemv.triton@lm_head_B1:B1xN163840xK2304g32: 212,996,608 bytes/call" in dry.stdout
    import torch

    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    result = _run("-m", "runners.gpu_check", "--out", str(tmp_path))
    assert result.returncode == 2 and "needs an NVIDIA GPU" in result.stderr
