"""engine/runtime/builder.py builds the model in its final form: the KDA prefill kernel given at
construction by every weight format's loader, the packed kernels bound, MLA's absorbed weights frozen and
the shared-input projections fused before anyone gets the model; its logits are the plain model's."""

from __future__ import annotations

import pytest
import torch

from engine.kernels.defaults import SHIPPED_DEFAULTS
from engine.kernels.linear import DENSE_EXPERT_OPS
from engine.model.kda import KimiDeltaAttention, kda_chunked
from engine.model.mla import MultiheadLatentAttention
from engine.model.mlp import MLP
from engine.quant import PackedExpertBank, PackedLinear
from engine.runtime import build_model, open_model_source
from tests.runtime.runtime_support import random_prompt

CPU = torch.device("cpu")


def _sentinel(*args):
    return kda_chunked(*args)


def _sources(tiny_artifact):
    checkpoint, artifact = tiny_artifact
    return {
        "synthetic dense": open_model_source(synthetic="tiny"),
        "synthetic quantised": open_model_source(synthetic="tiny", quant="default"),
        "checkpoint": open_model_source(weights=checkpoint),
        "artifact": open_model_source(weights=artifact),
    }


@pytest.mark.parametrize("kind", ["synthetic dense", "synthetic quantised", "checkpoint", "artifact"])
def test_every_weight_format_constructs_its_kda_layers_with_the_given_kernel(tiny_artifact, kind):
    source = _sources(tiny_artifact)[kind]
    model = source.load(CPU, torch.float32, kda_chunked_kernel=_sentinel)
    kda = [m for m in model.modules() if isinstance(m, KimiDeltaAttention)]
    assert kda and all(m.chunked_kernel is _sentinel for m in kda)
    packed = any(isinstance(m, PackedLinear | PackedExpertBank) for m in model.modules())
    assert packed == (source.plan is not None)


@pytest.mark.parametrize("quant", [None, "default"])
def test_the_built_model_is_in_its_final_form_and_computes_the_plain_logits(rng, quant):
    source = open_model_source(synthetic="tiny", quant=quant)
    # The plain model runs the torch KDA form, so the built one does too: the CPU default's C++ block
    # scores differ in the last bits, which can flip a near-tie of the quantised model's routing.
    built = build_model(source, device=CPU, dtype=torch.float32, kda_kernel="torch")
    assert built.kda_kernel == "torch"
    assert all(
        m.chunked_kernel is kda_chunked for m in built.model.modules() if isinstance(m, KimiDeltaAttention)
    )
    mla = [m for m in built.model.modules() if isinstance(m, MultiheadLatentAttention)]
    assert mla and all(m._absorbed is not None for m in mla)
    fused = [m for m in built.model.modules() if isinstance(m, KimiDeltaAttention | MLP)]
    assert all(m._input_projections is not None for m in fused if isinstance(m, KimiDeltaAttention))
    assert all(m._gate_up is not None for m in fused if isinstance(m, MLP))
    # A dense model binds only the decode GEMV of its Linears and the grouped kernels of its expert banks;
    # a packed one its packed kernels too.
    dense_ops = {"w16a16_gemv", *DENSE_EXPERT_OPS}
    assert built.kernel_variants.get("w16a16_gemv") == SHIPPED_DEFAULTS["cpu"]["w16a16_gemv"]
    assert (set(built.kernel_variants) != dense_ops) == (quant is not None)

    plain = source.load(CPU, torch.float32)  # same seed, same weights; nothing frozen or fused
    tokens = torch.tensor([random_prompt(rng, 70)])
    cache_built, cache_plain = built.model.new_cache(128), plain.new_cache(128)
    out = torch.full((1, plain.config.vocab_size), float("nan"))
    out.copy_(built.model.prefill(tokens, cache_built))
    expected = plain.prefill(tokens, cache_plain)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-4 * expected.abs().max().item())
    step = torch.tensor([int(expected.argmax())])
    out.fill_(float("nan")).copy_(built.model.decode_step(step, cache_built))
    expected = plain.decode_step(step, cache_plain)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-4 * expected.abs().max().item())


def test_an_unknown_kda_kernel_is_refused():
    with pytest.raises(ValueError, match="unknown KDA kernel"):
        build_model(open_model_source(synthetic="tiny"), device=CPU, dtype=torch.float32, kda_kernel="triton")
