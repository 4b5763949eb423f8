"""The fused decode kernels (RMSNorm + residual, the KDA step, the router) beyond the shared equivalence
checks of test_kernel_equivalence.py: the outputs that checker does not see (the residual sum, the expert
ids), that a broken state update fails it, that CPU models keep their eager code, and what the CUDA kernel
count counts. On the CPU the kernels run in the Triton interpreter (tests/conftest.py).

Tolerances: the kernels round to the activation dtype where the eager code does (to nearest even, also in
the interpreter), so the residual sum and the ids are compared exactly and the weights within 1e-6.
"""

import dataclasses

import pytest
import torch

import engine.kernels  # noqa: F401  (registers the variants)
from engine.kernel_tools.equivalence import check
from engine.kernel_tools.kernel_count import _AtenKernels, count_decode_kernels
from engine.kernels import registry
from engine.kernels.fused import FUSED_OPS, fused_variants
from engine.kernels.triton_kda import kda_decode_triton
from engine.kernels.triton_norm import rms_norm_reference, rms_norm_triton
from engine.kernels.triton_router import route_topk_reference, route_topk_triton
from engine.model.presets import TINY
from engine.quant import make_plan, synthetic_quantized_model

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _gen() -> torch.Generator:
    return torch.Generator(DEVICE).manual_seed(int(torch.randint(0, 2**31, (1,)).item()))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rms_norm_writes_the_rounded_residual_sum(dtype):
    gen = _gen()
    x, residual = (torch.randn(3, 260, generator=gen, device=DEVICE).to(dtype) for _ in range(2))
    weight = (torch.rand(260, generator=gen, device=DEVICE) + 0.5).to(dtype)
    sums = [torch.full_like(x, float("nan")) for _ in range(2)]
    outs = [torch.full_like(x, float("nan")) for _ in range(2)]
    rms_norm_reference(x, weight, 1e-5, residual=residual, out=outs[0], sum_out=sums[0])
    rms_norm_triton(x, weight, 1e-5, residual=residual, out=outs[1], sum_out=sums[1])
    assert torch.equal(sums[1], x + residual) and torch.equal(sums[0], sums[1])
    torch.testing.assert_close(outs[1], outs[0], rtol=2**-7, atol=1e-5)


@pytest.mark.parametrize("shared_slot", [None, 40])
def test_router_picks_the_reference_experts_in_order(shared_slot):
    gen = _gen()
    logits = torch.randn(5, 40, generator=gen, device=DEVICE) * 2
    bias = torch.randn(40, generator=gen, device=DEVICE) * 0.1
    slots = 6 + (shared_slot is not None)
    results = []
    for fn in (route_topk_reference, route_topk_triton):
        ids = torch.full((5, slots), -1, dtype=torch.long, device=DEVICE)
        out = torch.full((5, slots), float("nan"), device=DEVICE)
        fn(logits, bias, 6, True, 2.5, shared_slot=shared_slot, out=out, ids=ids)
        results.append((ids, out))
    (want_ids, want), (got_ids, got) = results
    assert torch.equal(got_ids, want_ids)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    if shared_slot is not None:
        assert (got_ids[:, -1] == shared_slot).all() and (got[:, -1] == 1).all()


def test_the_checker_fails_a_kda_step_that_does_not_roll_its_window(monkeypatch):
    """The output is right but the conv window is left as it was: only the state comparison sees it."""

    def stale_window(*args, **kwargs):
        window = args[6].clone()
        out = kda_decode_triton(*args, **kwargs)
        args[6].copy_(window)
        return out

    shape = {"B": 2, "H": 2, "d": 16, "taps": 4, "act": "fp32"}
    assert check("kda_decode_step", "triton", shape, device=DEVICE).passed
    operation = registry._operation("kda_decode_step")
    broken = dataclasses.replace(operation.variants["triton"], fn=stale_window)
    monkeypatch.setitem(operation.variants, "triton", broken)
    assert not check("kda_decode_step", "triton", shape, device=DEVICE).passed


def test_cpu_models_keep_their_eager_code():
    model = synthetic_quantized_model(TINY, make_plan("default"), device="cpu", dtype=torch.float32, seed=1)
    assert fused_variants(model) == dict.fromkeys(sorted(FUSED_OPS), "reference")
    layer = model.model.layers[1]
    assert layer.input_layernorm.kernel is None and layer.block_sparse_moe.gate.kernel is None
    assert layer.block_sparse_moe.gate.logits_kernel is None
    assert not layer.block_sparse_moe.experts.routes_include_shared


def test_dtype_conversions_are_counted_as_kernels_and_no_ops_are_not():
    x = torch.empty(2, 8, dtype=torch.bfloat16, device="meta")
    counter = _AtenKernels()
    with torch.inference_mode(), counter:
        x.float()
        x.to(torch.bfloat16)  # returns x itself
        torch.promote_types(x.dtype, torch.float32)
    assert dict(counter.ops) == {"to": 1}


def test_the_cuda_count_runs_the_fused_kernels():
    counted = count_decode_kernels(TINY, make_plan("default"))
    kda_layers = sum(not TINY.is_mla_layer(i) for i in range(TINY.num_hidden_layers))
    moe_layers = sum(TINY.is_moe_layer(i) for i in range(TINY.num_hidden_layers))
    assert counted.triton["_kda_decode_kernel"] == kda_layers
    assert counted.triton["_route_kernel"] == moe_layers
    # Two per layer (input, then residual + post-attention), MLA's latent norm, the final norm.
    mla_layers = TINY.num_hidden_layers - kda_layers
    assert counted.triton["_rms_norm_kernel"] == 2 * TINY.num_hidden_layers + mla_layers + 1
    assert not {"rsqrt", "topk", "softplus", "sigmoid", "new_full"} & set(counted.aten), counted.aten
    # The router's logits GEMV reads BF16 x itself: the casts left are MLA's two per layer (scores, probs).
    assert counted.aten.get("to", 0) == 2 * mla_layers, counted.aten


def test_a_prepared_model_decodes_alike_with_the_fused_kernels():
    """As the engine loads it (shared-input projections as one GEMM, so the KDA step reads strided rows):
    the CUDA defaults (interpreted here) against the references, FP32, 1e-4 x max|logit| per step."""
    from engine.kernels.defaults import SHIPPED_DEFAULTS
    from engine.runtime.builder import prepare_for_inference

    two_layers = dataclasses.replace(TINY, num_hidden_layers=2, full_attn_layers=(1,))
    models = []
    for kernels in (SHIPPED_DEFAULTS["cuda"], registry.named_choices("reference")):
        model = synthetic_quantized_model(
            two_layers, make_plan("default"), device="cpu", dtype=torch.float32, seed=3, kernels=kernels
        )
        prepare_for_inference(model)
        models.append(model)
    assert fused_variants(models[0]) == dict.fromkeys(sorted(FUSED_OPS), "triton")
    caches = [model.new_cache(6) for model in models]
    token = torch.tensor([5])
    for _ in range(3):
        got, want = (model.decode_step(token, cache) for model, cache in zip(models, caches, strict=True))
        assert (got - want).abs().max() <= 1e-4 * want.abs().max()
        token = want.argmax(-1)


@pytest.mark.parametrize("kernels", ["cuda", "cpu"])
def test_packed_input_projections_share_one_gemv_on_triton_only(kernels):
    """KDA's quantised q/k/v after `prepare_for_inference`: the bound CUDA defaults (interpreted here) run
    them as one GEMV over the concatenated rows, equal to the three separate GEMVs and within 1e-5 x max
    of the dequantised reference (FP32); the CPU defaults keep the three calls and the same weights."""
    from engine.kernels.defaults import SHIPPED_DEFAULTS
    from engine.model.kda import KimiDeltaAttention
    from engine.quant.packed import PackedInputGroup
    from engine.runtime.builder import prepare_for_inference

    if kernels == "cpu" and DEVICE != "cpu":
        pytest.skip("the CPU defaults run on CPU tensors")
    two_layers = dataclasses.replace(TINY, num_hidden_layers=2, full_attn_layers=(1,))
    model = synthetic_quantized_model(
        two_layers, make_plan("default"), device=DEVICE, dtype=torch.float32, seed=4,
        kernels=SHIPPED_DEFAULTS[kernels],
    )  # fmt: skip
    attn = next(m for m in model.modules() if isinstance(m, KimiDeltaAttention))
    names = ("q_proj", "k_proj", "v_proj")
    before = {n: getattr(attn, n).dense_weight().clone() for n in names}
    prepare_for_inference(model)
    group = attn._input_projections.merged
    assert isinstance(group, PackedInputGroup) and group.names == names
    x = torch.randn(2, 1, two_layers.hidden_size, generator=_gen(), device=DEVICE)
    calls = []
    for module in group.modules:
        gemv = module._gemv
        module._gemv = lambda *args, gemv=gemv: calls.append(args[1].data_ptr()) or gemv(*args)
    merged = group(x)
    if kernels == "cpu":
        assert merged is None and not calls
    else:
        assert merged is not None and calls == [group.data.data_ptr()]
        for name, got in zip(names, merged, strict=True):
            alone = getattr(attn, name)(x)
            reference = x @ before[name].T
            torch.testing.assert_close(got, alone, atol=0, rtol=0)
            assert (got - reference).abs().max() <= 1e-5 * reference.abs().max()
    for name in names:  # views of the one matrix, same weights
        assert (
            getattr(attn, name).data.untyped_storage().data_ptr() == group.data.untyped_storage().data_ptr()
        )
        torch.testing.assert_close(getattr(attn, name).dense_weight(), before[name], atol=0, rtol=0)
