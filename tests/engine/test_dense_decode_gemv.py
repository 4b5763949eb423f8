"""Dense `Linear`s on the CPU decode through the registry's `w16a16_gemv`, and dense expert banks through
its `w16a16_grouped_swiglu` + `w16a16_grouped_gemv` (engine.kernels.linear): the decode rows, and only
they, take the bound kernels, the fused input projections included; the logits stay those of torch's
matmul within BF16 rounding (FP32 weights within FP32 rounding) at one row and at a continuous batch's
rows; the "native" selection keeps torch's matmul and the gathered experts."""

from __future__ import annotations

import copy

import pytest
import torch

from engine.kernels import cpp_cpu
from engine.kernels.linear import bind_dense_decode_gemvs
from engine.model import Linear
from engine.model.kda import KimiDeltaAttention
from engine.model.moe import ExpertBank
from engine.model.paths import DECODE_MAX_ROWS
from engine.model.presets import TINY
from engine.quant import kernel_variants
from engine.runtime import prepare_for_inference
from tests.engine.test_shared_input_linears import prefill_and_decode, synthetic_tiny

BF16_LOGITS_RTOL = 2e-2  # of the largest logit: a BF16 rounding (2^-8) per projection, a few layers deep


def _spy_on_decode_gemv(model) -> list[tuple[int, int]]:
    """Bind to every plain Linear a GEMV that records (rows, output width) and computes in FP32."""
    rows: list[tuple[int, int]] = []

    def gemv(x, weight):
        rows.append((x.shape[0], weight.shape[0]))
        return (x.float() @ weight.float().T).to(x.dtype)

    for module in model.modules():
        if type(module) is Linear:
            module.bind_decode_gemv("spy", gemv)
    return rows


def test_only_decode_rows_take_the_bound_gemv_fused_projections_included(rng):
    model = synthetic_tiny(torch.bfloat16, seed=int(torch.randint(1 << 30, (1,), generator=rng)))
    prepare_for_inference(model)
    rows = _spy_on_decode_gemv(model)
    prompt = torch.randint(0, 200, (1, 3 * DECODE_MAX_ROWS), generator=rng)
    cache = model.new_cache(prompt.shape[1] + 2)
    model.prefill(prompt, cache)
    # Prefill: only the LM head's last row (one row) may reach it; every projection of the prompt's rows not.
    assert rows == [(1, TINY.vocab_size)]
    rows.clear()
    model.decode_step(torch.tensor([5]), cache)
    assert rows and all(r == 1 for r, _ in rows)
    # The six KDA input projections of each layer: one call of their concatenated width, none separately.
    kda = [m for m in model.modules() if isinstance(m, KimiDeltaAttention)]
    fused_width = sum(getattr(kda[0], name).out_features for name in kda[0]._input_projections.fused)
    assert [w for _, w in rows].count(fused_width) == len(kda)


CPP = {"w16a16_gemv": "cpp", "w16a16_grouped_gemv": "cpp", "w16a16_grouped_swiglu": "cpp"}
NATIVE = dict.fromkeys(CPP, "native")


def _cpp_bound_against_torch(dtype, rng, rows: int, kernels: dict[str, str] = CPP):
    """A fresh tiny model and its copy bound to `kernels`, and the bound copy's logits error relative to
    the largest of torch's, over a prefill and 4 decode steps of `rows` sequences."""
    model = synthetic_tiny(dtype, seed=int(torch.randint(1 << 30, (1,), generator=rng)))
    prepare_for_inference(model)
    bound = copy.deepcopy(model)
    bind_dense_decode_gemvs(bound, kernels)
    assert kernel_variants(bound) == kernels and kernel_variants(model) == {}
    prompt = torch.randint(0, 200, (rows, 9), generator=rng)
    expected, actual = prefill_and_decode(model, prompt, 4), prefill_and_decode(bound, prompt, 4)
    assert torch.isfinite(actual).all()
    return model, bound, ((actual - expected).abs().max() / expected.abs().max()).item()


@pytest.mark.skipif(cpp_cpu.unavailable() is not None, reason=str(cpp_cpu.unavailable()))
def test_the_cpp_gemv_keeps_torchs_logits_within_bf16_rounding(rng):
    _, _, error = _cpp_bound_against_torch(torch.bfloat16, rng, rows=2)
    assert error <= BF16_LOGITS_RTOL, error


@pytest.mark.skipif(cpp_cpu.unavailable() is not None, reason=str(cpp_cpu.unavailable()))
@pytest.mark.parametrize("dtype, rtol", [(torch.bfloat16, 2e-2), (torch.float32, 1e-4)])
def test_the_cpp_expert_kernels_alone_keep_the_gathered_experts_logits(rng, dtype, rtol):
    """Only the banks bound: 5 rows per step, so rows share experts and
    the union kernel reads a shared expert once for several rows (tiny: 2 of 8 experts per row)."""
    kernels = {**NATIVE, "w16a16_grouped_gemv": "cpp", "w16a16_grouped_swiglu": "cpp"}
    _, bound, error = _cpp_bound_against_torch(dtype, rng, rows=5, kernels=kernels)
    assert all(m.decode_kernels is not None for m in bound.modules() if type(m) is ExpertBank)
    assert error <= rtol, error


def test_only_decode_rows_take_the_bound_expert_kernels(rng):
    model = synthetic_tiny(torch.float32, seed=int(torch.randint(1 << 30, (1,), generator=rng)))
    calls: list[tuple[str, int]] = []

    def swiglu(x, w1, w3, ids):
        calls.append(("swiglu", x.shape[0]))
        return torch.nn.functional.silu(torch.einsum("bk,bsnk->bsn", x, w1[ids])) * torch.einsum(
            "bk,bsnk->bsn", x, w3[ids]
        )

    def grouped(h, w2, ids, out_dtype):
        calls.append(("grouped", h.shape[0]))
        return torch.einsum("bsk,bsnk->bsn", h, w2[ids]).to(out_dtype)

    banks = [m for m in model.modules() if type(m) is ExpertBank]
    for bank in banks:
        bank.bind_decode_kernels({"w16a16_grouped_swiglu": "spy"}, swiglu, grouped)
    cache = model.new_cache(3 * DECODE_MAX_ROWS + 2)
    model.prefill(torch.randint(0, 200, (1, 3 * DECODE_MAX_ROWS), generator=rng), cache)
    assert calls == []  # the prompt's rows group by expert on the host, as before
    model.decode_step(torch.tensor([5]), cache)
    assert calls == [("swiglu", 1), ("grouped", 1)] * len(banks)


FP32_LOGITS_RTOL = 1e-4  # of the largest logit: FP32 sums in another order, a few layers deep


@pytest.mark.skipif(cpp_cpu.unavailable() is not None, reason=str(cpp_cpu.unavailable()))
def test_fp32_weights_take_the_cpp_gemv_too_and_keep_torchs_logits(rng):
    """A continuous batch's few rows: torch's FP32 matmul there is a slow GEMM, so FP32 Linears bind too."""
    _, bound, error = _cpp_bound_against_torch(torch.float32, rng, rows=3)  # three rows per decode step
    assert all(m.decode_variant == "cpp" for m in bound.modules() if type(m) is Linear)
    assert all(m.decode_kernels is not None for m in bound.modules() if type(m) is ExpertBank)
    assert error <= FP32_LOGITS_RTOL, error


def test_the_native_selection_keeps_torchs_matmul_and_the_gathered_experts(rng):
    fp32 = synthetic_tiny(torch.float32, seed=1)
    assert bind_dense_decode_gemvs(fp32, NATIVE) is None
    assert kernel_variants(fp32) == NATIVE  # named in receipts, though nothing is bound
    bf16 = synthetic_tiny(torch.bfloat16, seed=1)
    _spy_on_decode_gemv(bf16)
    assert bind_dense_decode_gemvs(bf16, NATIVE) is None
    assert all(m.decode_gemv is None for m in bf16.modules() if type(m) is Linear)
    assert all(m.decode_kernels is None for m in bf16.modules() if type(m) is ExpertBank)
