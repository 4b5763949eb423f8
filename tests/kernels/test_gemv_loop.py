"""The W4A16/W8A16 GEMV loop's parts: x permuted position-major, split-K sized to the tiles and reduced in
the kernel itself (arrival counters re-armed), at real Kimi-Linear K under the interpreter on the CPU."""

import pytest
import torch
import triton

import engine.kernels  # noqa: F401
from engine.kernel_tools.aot import SM_COUNTS
from engine.kernel_tools.equivalence import check
from engine.kernel_tools.shapes import kimi_shapes
from engine.kernels import registry, triton_gemv, workspace
from engine.model import preset

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_kernels = pytest.mark.skipif(
    triton_gemv.triton_unavailable(DEVICE) is not None, reason=str(triton_gemv.triton_unavailable(DEVICE))
)


@needs_kernels
@pytest.mark.parametrize("fmt,per_word", [("int4", 8), ("int8", 4)])
def test_x_is_permuted_position_major_with_the_decode_powers_of_two(fmt, per_word):
    x = (
        torch.randn(3, 40 * per_word, generator=torch.Generator().manual_seed(5))
        .to(torch.bfloat16)
        .to(DEVICE)
    )
    x = x[:, : 36 * per_word]  # a row stride that is not the row length
    with workspace.poisoned_scratch():
        xp = triton_gemv.permuted(fmt, x)
    positions = torch.arange(per_word)
    exponent = (
        4 * torch.where(positions < 5, positions, positions - 3) if fmt == "int4" else 8 * (positions % 2)
    )
    expected = x.float().view(3, -1, per_word).transpose(1, 2) * torch.exp2(-exponent.float())[:, None].to(
        DEVICE
    )
    assert torch.equal(xp, expected)  # powers of two: exact, and every element written (no NaN left)


def _tiles(fmt, k):
    return triton.cdiv(k, triton_gemv._TILES[fmt][1])


@pytest.mark.parametrize("arch", sorted(SM_COUNTS))
def test_split_k_divides_the_tiles_at_the_full_shapes(arch, monkeypatch):
    """Every part gets the same number of K tiles (two or more): no split is idle or short."""
    monkeypatch.setattr(triton_gemv, "_sm_count", lambda device: SM_COUNTS[arch])
    splits = set()
    for op, shapes in kimi_shapes(preset("full"), batches=(1, 8)).items():
        if op not in ("w4a16_gemv", "w8a16_gemv", "w4a16_grouped_gemv"):
            continue
        for shape in shapes:
            fmt = "int8" if op == "w8a16_gemv" else "int4"
            rows = shape["B"] * shape.get("S", 1)
            cfg = triton_gemv.launch_config(fmt, rows, shape["N"], shape["K"], "cpu")
            tiles = _tiles(fmt, shape["K"])
            assert tiles % cfg.split_k == 0 and (cfg.split_k == 1 or tiles // cfg.split_k >= 2), shape
            splits.add(cfg.split_k)
    assert splits != {1}  # the short matrices do split


@needs_kernels
def test_split_k_reduces_in_the_kernel_and_rearms_its_counters():
    shape = {"B": 2, "N": 40, "K": 1536, "group": 32}
    config = triton_gemv.LaunchConfig(16, 256, 3)
    result = check("w4a16_gemv", "triton", shape, device=DEVICE, options={"config": config})
    assert result.passed, result.describe()
    used = 2 * triton.cdiv(40, 16)
    assert int(workspace.counters(used, torch.device(DEVICE)).abs().sum()) == 0


# Real K of the full model (N cut to one or two row blocks: the interpreter runs every program in Python).
REAL_K = [
    ("w4a16_gemv", {"B": 1, "N": 64, "K": 2304, "group": 32}),  # hidden -> anything (q/k/v, gate/up, head)
    ("w4a16_gemv", {"B": 2, "N": 70, "K": 4096, "group": 32, "out": "fp32"}),  # KDA output projection
    ("w8a16_gemv", {"B": 1, "N": 64, "K": 2304, "group": 32, "out": "fp32"}),  # INT8 head
    ("w16a16_gemv", {"B": 1, "N": 40, "K": 2304, "out": "fp32"}),  # BF16 head
    ("w4a16_grouped_gemv", {"B": 1, "S": 2, "E": 4, "N": 64, "K": 1024, "group": 32, "per_slot": True}),
    ("w4a16_grouped_swiglu", {"B": 1, "S": 2, "E": 4, "N": 32, "K": 2304, "group": 32}),
]


@pytest.mark.slow
@needs_kernels
@pytest.mark.parametrize("op,shape", REAL_K, ids=[f"{op}-K{s['K']}" for op, s in REAL_K])
def test_triton_gemvs_match_the_reference_at_the_real_k(op, shape):
    for v in registry.variants(op):
        if v.backend == "triton":
            result = check(op, v.name, {"name": "real_k", **shape}, device=DEVICE)
            assert result.passed and result.unwritten == 0, result.describe()
