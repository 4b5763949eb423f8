"""Projections that share an input run as one GEMM after `prepare_for_inference`: same results as the
separate projections, no second copy of the weights, packed projections left to their own call."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from engine.model import KimiLinearForCausalLM
from engine.model.kda import KimiDeltaAttention
from engine.model.mlp import MLP
from engine.model.presets import TINY
from engine.runtime import prepare_for_inference
from engine.synth import init_synthetic_weights


def synthetic_tiny(dtype: torch.dtype, seed: int) -> KimiLinearForCausalLM:
    model = KimiLinearForCausalLM(TINY, dtype=dtype, device="meta").to_empty(device="cpu")
    init_synthetic_weights(model, seed)
    return model


def prefill_and_decode(model, prompt, steps: int) -> torch.Tensor:
    """Logits of the prefill and of `steps` greedy decode steps, each copied into a poisoned buffer."""
    cache = model.new_cache(prompt.shape[1] + steps, batch_size=prompt.shape[0])
    out = torch.full((steps + 1, prompt.shape[0], TINY.vocab_size), float("nan"))
    out[0].copy_(model.prefill(prompt, cache))
    for i in range(steps):
        out[i + 1].copy_(model.decode_step(out[i].argmax(-1), cache))
    return out


@pytest.mark.parametrize(
    ("dtype", "tolerance"), [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)], ids=["fp32", "bf16"]
)
def test_fused_projections_give_the_separate_projections_logits(rng, dtype, tolerance):
    """Prefill (chunked) and decode (one token) logits of the fused model against the unfused one, batch 2,
    fresh weights and prompt. Stated tolerance, relative to the logits' scale: 1e-5 in FP32 (only the GEMM's
    blocking differs), 2e-2 in BF16 (a different blocking can flip a BF16 rounding, which later layers carry)."""
    seed = int(torch.randint(0, 2**31, (1,), generator=rng))
    plain = synthetic_tiny(dtype, seed)
    fused = copy.deepcopy(plain)
    prepare_for_inference(fused)
    prompt = torch.randint(0, TINY.vocab_size, (2, 11), generator=rng)
    expected = prefill_and_decode(plain, prompt, 4).float()
    got = prefill_and_decode(fused, prompt, 4).float()
    scale = expected.abs().max()
    assert scale > 1
    torch.testing.assert_close(got, expected, atol=tolerance * scale, rtol=0)


def test_fused_weights_are_views_of_one_matrix():
    model = synthetic_tiny(torch.float32, 5)
    before = {name: p.clone() for name, p in model.named_parameters()}
    prepare_for_inference(model)
    after = dict(model.named_parameters())
    assert after.keys() == before.keys()
    for name, p in after.items():
        torch.testing.assert_close(p, before[name], atol=0, rtol=0)
    for module in model.modules():
        if isinstance(module, KimiDeltaAttention):
            fused = module._input_projections.weight
            assert fused.shape[0] == sum(
                getattr(module, n).out_features for n in module._input_projections.names
            )
            assert all(getattr(module, n).weight.untyped_storage().data_ptr() == fused.untyped_storage().data_ptr()
                       for n in module._input_projections.names)  # fmt: skip
        if isinstance(module, MLP):
            assert module.gate_proj.weight.untyped_storage().data_ptr() == module._gate_up.weight.data_ptr()


class Wrapped(nn.Module):
    """Stands in for a packed projection: not a plain Linear, so it must keep its own call."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.inner(x) * 2.0


def test_a_projection_that_is_not_a_plain_linear_keeps_its_own_call(rng):
    plain = synthetic_tiny(torch.float32, 7)
    attn = next(m for m in plain.modules() if isinstance(m, KimiDeltaAttention))
    attn.q_proj, attn.f_a_proj = Wrapped(attn.q_proj), Wrapped(attn.f_a_proj)
    fused = copy.deepcopy(plain)
    prepare_for_inference(fused)
    fused_attn = next(m for m in fused.modules() if isinstance(m, KimiDeltaAttention))
    assert set(fused_attn._input_projections.fused) == {"k_proj", "v_proj", "b_proj", "g_a_proj"}
    x = torch.randn(2, 3, TINY.hidden_size, generator=rng)
    torch.testing.assert_close(fused_attn(x, None), attn(x, None), atol=1e-5, rtol=0)
    assert fused_attn.q_proj.calls == 1 and fused_attn.f_a_proj.calls == 1
