"""torch's CPU int4pack kernels as W4A16 variants: the repack is exact, and the variants trace whole."""

import pytest
import torch

import engine.kernels  # noqa: F401
from engine.codec import LinearWeight, dequantize
from engine.kernel_tools.cases import CASES
from engine.kernels import int4pack, registry


@pytest.mark.parametrize("n,k,group", [(48, 128, 32), (20, 96, 32), (16, 256, 64)])
def test_repack_reproduces_every_code_times_its_scale(n, k, group):
    """One-hot activations read the weight back column by column: code * scale (exact in FP32), rounded
    once to the BF16 output, equals the codec's dequantisation rounded the same way, bit for bit. Covers
    the padding of N to a multiple of 16 and every code -8..7."""
    x, codes, scales, _ = CASES["w4a16_gemv"](
        {"B": 1, "N": n, "K": k, "group": group}, torch.Generator().manual_seed(n), "cpu"
    ).args
    packed, scales_and_zeros = int4pack.pack(codes, scales)
    assert packed.shape == (n + (-n % 16), k // 2) and scales_and_zeros.shape == (k // group, n, 2)
    columns = int4pack.w4a16_gemv(torch.eye(k, dtype=torch.bfloat16), packed, scales_and_zeros, group)
    expected = dequantize(LinearWeight("int4", codes, scales, group)).to(torch.bfloat16)
    assert torch.equal(columns.t(), expected)


def test_banks_pack_slot_by_slot():
    _, codes, scales, _, _ = CASES["w4a16_grouped_gemv"](
        {"B": 1, "S": 2, "E": 3, "N": 32, "K": 64, "group": 32}, torch.Generator().manual_seed(1), "cpu"
    ).args
    packed, both = int4pack.pack(codes, scales)
    for e in range(3):
        one, one_scales = int4pack.pack(codes[e], scales[e])
        assert torch.equal(packed[e], one) and torch.equal(both[e], one_scales)


def test_fp16_scales_are_refused_not_rounded():
    codes = torch.zeros(16, 16, dtype=torch.uint8)
    with pytest.raises(ValueError, match="BF16 scales"):
        int4pack.pack(codes, torch.ones(16, 1, dtype=torch.float16))


def test_int4pack_is_cpu_only():
    v = registry.variant("w4a16_gemv", "int4pack")
    assert registry.built_for(v, "cpu") and not registry.built_for(v, "cuda")
    assert "CPU only" in registry.unavailable_reason(v, "cuda")


@pytest.mark.parametrize("op", ["w4a16_gemv", "w4a16_grouped_gemv", "w4a16_grouped_swiglu"])
def test_variants_trace_without_graph_breaks(op):
    """What the compiled decode step needs: one graph, the grouped GEMV an opaque custom op (its route ids
    are read inside it, not by the traced code)."""
    shape = {"B": 1, "S": 3, "E": 4, "N": 32, "K": 64, "group": 32}
    case = CASES[op](shape, torch.Generator().manual_seed(2), "cpu")
    v = registry.variant(op, "int4pack")
    args = registry.packed_args(v, case.args)
    eager = v.fn(*args, **case.kwargs)
    compiled = torch.compile(v.fn, backend="eager", fullgraph=True)(*args, **case.kwargs)
    assert torch.equal(compiled, eager)
