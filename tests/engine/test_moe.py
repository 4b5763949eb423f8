"""MoE: batched expert paths vs a plain per-expert loop, router semantics, and the block vs the reference."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.model.moe import expert_ffn


def plain_experts(x, ids, weights, w1, w3, w2):
    """One token, one chosen expert at a time."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    for n in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[n, j])
            xe = x[n].double()
            h = F.silu(w1[e].double() @ xe) * (w3[e].double() @ xe)
            out[n] += weights[n, j].double() * (w2[e].double() @ h)
    return out


def random_bank(rng, experts=16, hidden=48, inter=24):
    w1 = torch.randn(experts, inter, hidden, generator=rng) * hidden**-0.5
    w3 = torch.randn(experts, inter, hidden, generator=rng) * hidden**-0.5
    w2 = torch.randn(experts, hidden, inter, generator=rng) * inter**-0.5
    return w1, w3, w2


# 1 and 3: the slot path (one sequence, a batch); 40: prefill, padded; 300: prefill, one matmul per expert
@pytest.mark.parametrize("tokens", [1, 3, 40, 300])
def test_expert_ffn_matches_plain_loop(rng, tokens):
    w1, w3, w2 = random_bank(rng)
    x = torch.randn(tokens, 48, generator=rng)
    ids = torch.stack([torch.randperm(16, generator=rng)[:4] for _ in range(tokens)])
    weights = torch.rand(tokens, 4, generator=rng)
    got = expert_ffn(x, ids, weights, w1, w3, w2)
    expected = plain_experts(x, ids, weights, w1, w3, w2)
    assert expected.abs().max() > 0.1
    torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=0)


def test_gathered_and_grouped_paths_agree(rng):
    """Force both internal paths on the same inputs (the switch is by size)."""
    from engine.model.moe import _expert_ffn_gathered, grouped_expert_ffn

    w1, w3, w2 = random_bank(rng)
    x = torch.randn(7, 48, generator=rng)
    ids = torch.stack([torch.randperm(16, generator=rng)[:4] for _ in range(7)])
    weights = torch.rand(7, 4, generator=rng)
    torch.testing.assert_close(
        _expert_ffn_gathered(x, ids, weights, w1, w3, w2),
        grouped_expert_ffn(x, ids, weights, 16, lambda e: (w1[e], w3[e], w2[e])),
    )


def test_padded_and_per_expert_prefill_paths_agree(rng, monkeypatch):
    """The same prefill rows through the padded batched product and, forced, one matmul per expert;
    the padded buffer's rows past each expert's count are where a wrong slot would read or write."""
    from engine.model import moe

    w1, w3, w2 = random_bank(rng)
    x = torch.randn(50, 48, generator=rng)
    ids = torch.stack([torch.randperm(16, generator=rng)[:4] for _ in range(50)])
    weights = torch.rand(50, 4, generator=rng)
    padded = expert_ffn(x, ids, weights, w1, w3, w2)
    monkeypatch.setattr(moe, "PADDED_MAX_ROWS", 0)
    per_expert = expert_ffn(x, ids, weights, w1, w3, w2)
    torch.testing.assert_close(padded, per_expert, atol=1e-5, rtol=0)


@pytest.mark.parametrize("tokens", [40, 300])
def test_expert_ffn_gradients_match_the_plain_loop(rng, tokens):
    """Training's backward through the prefill paths (padded, one matmul per expert), with two experts
    never chosen: their gradient must come back as exact zeros, the others as the plain loop's."""
    w1, w3, w2 = (w.requires_grad_() for w in random_bank(rng))
    x = torch.randn(tokens, 48, generator=rng, requires_grad=True)
    ids = torch.stack([torch.randperm(14, generator=rng)[:4] for _ in range(tokens)])
    weights = torch.rand(tokens, 4, generator=rng)
    upstream = torch.randn(tokens, 48, generator=rng)
    got = torch.autograd.grad((expert_ffn(x, ids, weights, w1, w3, w2) * upstream).sum(), (x, w1, w3, w2))
    expected = torch.autograd.grad(
        (plain_experts(x, ids, weights, w1, w3, w2) * upstream.double()).sum(), (x, w1, w3, w2)
    )
    for g, e in zip(got, expected, strict=True):
        assert e.abs().max() > 0.1
        torch.testing.assert_close(g, e.float(), atol=1e-4, rtol=1e-5)
    assert all(g[14:].eq(0).all() for g in got[1:])


def moe_layers(model):
    return [(i, layer.block_sparse_moe) for i, layer in enumerate(model.model.layers) if i >= 1]


def test_router_matches_reference_and_uses_bias_only_for_selection(tiny_model, reference, rng):
    index, moe = moe_layers(tiny_model)[0]
    x = torch.randn(32, tiny_model.config.hidden_size, generator=rng)
    weights, ids = moe.gate(x)
    for n in range(32):
        ref_ids, ref_weights = reference.route(index, x[n].double())
        order = torch.argsort(ids[n])
        assert ids[n][order].tolist() == sorted(ref_ids.tolist())
        torch.testing.assert_close(
            weights[n][order].double(), ref_weights[torch.argsort(ref_ids)], atol=1e-6, rtol=0
        )
    # The synthetic bias is non-zero, so the bias-in-weights variant gives measurably different weights.
    bias = moe.gate.e_score_correction_bias
    assert bias.abs().max() > 1e-2
    scores = torch.sigmoid(x @ moe.gate.weight.T)
    biased = (scores + bias).gather(1, ids)
    biased = biased / biased.sum(-1, keepdim=True) * tiny_model.config.routed_scaling_factor
    assert (biased - weights).abs().max() > 1e-3


def test_moe_block_matches_reference(tiny_model, reference, rng):
    index, moe = moe_layers(tiny_model)[1]
    x = torch.randn(1, 20, tiny_model.config.hidden_size, generator=rng)
    got = moe(x)[0]
    expected = torch.stack([reference.moe_token(index, x[0, t].double()) for t in range(20)])
    scale = expected.abs().max().item()
    assert scale > 0.1
    torch.testing.assert_close(got.double(), expected, atol=1e-5 * scale, rtol=0)


def test_dense_layer_zero_is_an_mlp(tiny_model, reference, rng):
    layer = tiny_model.model.layers[0]
    assert not hasattr(layer, "block_sparse_moe")
    x = torch.randn(5, tiny_model.config.hidden_size, generator=rng)
    expected = torch.stack([reference.ffn_token(0, x[t].double()) for t in range(5)])
    torch.testing.assert_close(
        layer.mlp(x).double(), expected, atol=1e-5 * expected.abs().max().item(), rtol=0
    )
