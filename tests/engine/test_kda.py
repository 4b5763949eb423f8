"""KDA: chunked prefill vs the token-by-token recurrence, and the whole KDA layer vs the float64 reference."""

from __future__ import annotations

import pytest
import torch

from engine.model import kda
from engine.model.cache import KDAState
from engine.model.kda import ShortConv, kda_chunked, kda_recurrent_step, l2_normalize


def random_kda_inputs(rng, batch=2, tokens=150, heads=3, dk=32, dv=24, dtype=torch.float32):
    """Inputs shaped like the layer produces them: normalised q/k, decays <= 0 of varied strength."""
    q = l2_normalize(torch.randn(batch, tokens, heads, dk, generator=rng, dtype=dtype), 1e-6) * dk**-0.5
    k = l2_normalize(torch.randn(batch, tokens, heads, dk, generator=rng, dtype=dtype), 1e-6)
    v = torch.randn(batch, tokens, heads, dv, generator=rng, dtype=dtype)
    # log-decays from ~0 (slow) to ~-8 (fast), so cumulative decays inside a chunk underflow exp()
    g = -(torch.rand(batch, tokens, heads, dk, generator=rng, dtype=dtype) ** 3) * 8
    beta = torch.rand(batch, tokens, heads, generator=rng, dtype=dtype)
    state = torch.randn(batch, heads, dk, dv, generator=rng, dtype=dtype)
    return q, k, v, g, beta, state


def recurrent_loop(q, k, v, g, beta, state):
    out = torch.full_like(v, float("nan"))
    for t in range(q.shape[1]):
        out[:, t] = kda_recurrent_step(q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], state)
    return out


def plain_recurrent_step(q, k, v, g, beta, state):
    """The textbook update, op by op, in whatever dtype it is given: decay, predict, correct, read."""
    state = state * g.exp().unsqueeze(-1)
    prediction = (k.unsqueeze(-2) @ state).squeeze(-2)
    state = state + k.unsqueeze(-1) * (beta.unsqueeze(-1) * (v - prediction)).unsqueeze(-2)
    return (q.unsqueeze(-2) @ state).squeeze(-2), state


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_recurrent_step_matches_the_plain_update_in_float64(rng, compiled):
    """The fused step (one read and one write of the state; the output from the old state) against the
    plain update in float64, several tokens in a row, batch 3, on fresh random inputs. Stated tolerance:
    2e-6 absolute on outputs and state (entries O(1), FP32 rounding over a d_k = 32 reduction)."""
    step = (
        torch.compile(kda_recurrent_step, fullgraph=True, dynamic=False) if compiled else kda_recurrent_step
    )
    q, k, v, g, beta, s0 = random_kda_inputs(rng, batch=3, tokens=6)
    state, expected_state = s0.clone(), s0.double()
    for t in range(q.shape[1]):
        inputs = q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t]
        out = torch.full_like(v[:, t], float("nan"))  # poisoned
        out.copy_(step(*inputs, state))
        expected, expected_state = plain_recurrent_step(*(x.double() for x in inputs), expected_state)
        torch.testing.assert_close(out.double(), expected, atol=2e-6, rtol=0)
        torch.testing.assert_close(state.double(), expected_state, atol=2e-6, rtol=0)
    assert (state - s0).abs().max() > 0.1  # the update really moved the state


def plain_short_conv(conv: ShortConv, x: torch.Tensor, window: torch.Tensor):
    """conv1d over [window | x] then SiLU, and the window's next contents: the definition."""
    seq = torch.cat([window, x.transpose(1, 2)], dim=-1)
    y = torch.nn.functional.conv1d(seq.float(), conv.weight.float(), groups=seq.shape[1])
    return torch.nn.functional.silu(y).transpose(1, 2), seq[..., -window.shape[-1] :]


@pytest.mark.parametrize(
    ("dtype", "tolerance"), [(torch.float32, 1e-6), (torch.bfloat16, 2**-7)], ids=["fp32", "bf16"]
)
def test_short_conv_decode_step_matches_conv1d(rng, dtype, tolerance):
    """The decode form (a 4-tap weighted sum on the rolling window) against conv1d in FP32, token after
    token, batch 2, fresh random weights and inputs; outputs poisoned. Stated tolerance: 1e-6 absolute in
    FP32; in BF16, one rounding of the output (2^-7 relative, as a BF16 conv1d rounds once too)."""
    dim, kernel = 48, 4
    conv = ShortConv(dim, kernel, dtype=dtype)
    with torch.no_grad():
        conv.weight.copy_(torch.randn(dim, 1, kernel, generator=rng) * 0.5)
    window = torch.randn(2, dim, kernel - 1, generator=rng).to(dtype)
    expected_window = window.clone()
    for _ in range(5):
        x = torch.randn(2, 1, dim, generator=rng).to(dtype)
        out = torch.full((2, 1, dim), float("nan"), dtype=dtype)  # poisoned
        with torch.no_grad():
            out.copy_(conv(x, window))
            expected, expected_window = plain_short_conv(conv, x, expected_window)
        torch.testing.assert_close(out.float(), expected, atol=tolerance, rtol=tolerance)
        torch.testing.assert_close(window, expected_window, atol=0, rtol=0)


def test_decode_steps_continue_a_prefill_like_one_long_prefill(tiny_model, rng):
    """Prefill (conv1d, chunked form) then single-token steps (taps, fused step) equals one forward over
    all tokens: the two paths hand the conv window and the recurrent state to each other correctly."""
    _, attn = kda_layers(tiny_model)[0]
    cfg = tiny_model.config
    x = torch.randn(2, 12, cfg.hidden_size, generator=rng)
    state = KDAState.zeros(cfg, 2)
    parts = [attn(x[:, :7], state)] + [attn(x[:, t : t + 1], state) for t in range(7, 12)]
    torch.testing.assert_close(torch.cat(parts, 1), attn(x, None), atol=1e-5, rtol=0)


@pytest.mark.parametrize("tokens", [1, 5, 64, 150])
def test_chunked_matches_recurrent(rng, tokens):
    q, k, v, g, beta, s0 = random_kda_inputs(rng, tokens=tokens)
    s_rec, s_chunk = s0.clone(), s0.clone()
    o_rec = recurrent_loop(q, k, v, g, beta, s_rec)
    o_chunk = kda_chunked(q, k, v, g, beta, s_chunk)
    # FP32 both ways; state entries are O(1). Stated tolerance: 2e-5 absolute.
    torch.testing.assert_close(o_chunk, o_rec, atol=2e-5, rtol=0)
    torch.testing.assert_close(s_chunk, s_rec, atol=2e-5, rtol=0)


def test_chunked_matches_recurrent_in_float64_exactly(rng):
    q, k, v, g, beta, s0 = random_kda_inputs(rng, tokens=130, dtype=torch.float64)
    s_rec, s_chunk = s0.clone(), s0.clone()
    o_rec = recurrent_loop(q, k, v, g, beta, s_rec)
    o_chunk = kda_chunked(q, k, v, g, beta, s_chunk, chunk_size=64)
    torch.testing.assert_close(o_chunk, o_rec, atol=1e-11, rtol=0)
    torch.testing.assert_close(s_chunk, s_rec, atol=1e-11, rtol=0)


@pytest.mark.parametrize("chunk_size", [7, 40])  # smaller than one sub-block; not a multiple of it
def test_chunk_size_does_not_change_the_result(rng, chunk_size):
    q, k, v, g, beta, s0 = random_kda_inputs(rng, tokens=100, dtype=torch.float64)
    s64, s_other = s0.clone(), s0.clone()
    a = kda_chunked(q, k, v, g, beta, s64, chunk_size=64)
    b = kda_chunked(q, k, v, g, beta, s_other, chunk_size=chunk_size)
    torch.testing.assert_close(a, b, atol=1e-11, rtol=0)
    torch.testing.assert_close(s64, s_other, atol=1e-11, rtol=0)


def test_batched_phase_in_several_groups(rng, monkeypatch):
    """Long prompts run the state-independent phase in groups of chunks; force several groups."""
    q, k, v, g, beta, s0 = random_kda_inputs(rng, tokens=200, dtype=torch.float64)
    s_one, s_groups = s0.clone(), s0.clone()
    one_group = kda_chunked(q, k, v, g, beta, s_one)
    monkeypatch.setattr(kda, "_GROUP_ELEMENTS", 1)  # one chunk per group
    torch.testing.assert_close(kda_chunked(q, k, v, g, beta, s_groups), one_group, atol=1e-11, rtol=0)
    torch.testing.assert_close(s_groups, s_one, atol=1e-11, rtol=0)


def test_heads_one_at_a_time_give_all_heads_at_once(rng):
    """The CPU runs `kda_chunked` head by head (cache-sized passes); the all-heads pass (the GPU's) over
    the same inputs must agree, outputs and every head's final state."""
    q, k, v, g, beta, s0 = random_kda_inputs(rng, tokens=90, dtype=torch.float64)
    s_heads, s_all = s0.clone(), s0.clone()
    per_head = kda_chunked(q, k, v, g, beta, s_heads)
    all_heads = kda._kda_chunked_heads(q, k, v, g, beta, s_all, kda.CHUNK_SIZE)
    torch.testing.assert_close(per_head, all_heads, atol=1e-11, rtol=0)
    torch.testing.assert_close(s_heads, s_all, atol=1e-11, rtol=0)
    assert not torch.equal(s_heads, s0)


def test_recurrence_is_not_trivial(rng):
    """Guard against a vacuous comparison: the state must matter and the decay must matter."""
    q, k, v, g, beta, s0 = random_kda_inputs(rng, tokens=20)
    with_state = kda_chunked(q, k, v, g, beta, s0.clone())
    without = kda_chunked(q, k, v, g, beta, torch.zeros_like(s0))
    no_decay = kda_chunked(q, k, v, torch.zeros_like(g), beta, s0.clone())
    assert (with_state - without).abs().max() > 1e-2
    assert (with_state - no_decay).abs().max() > 1e-2


def kda_layers(model):
    return [(i, layer.self_attn) for i, layer in enumerate(model.model.layers) if not layer.is_mla]


def test_kda_layer_matches_reference(tiny_model, reference, rng):
    """Layer 1 (KDA) on random normalised hidden states: prefill of 70 tokens (two chunks), then 6 decode
    steps continuing from the cache, against the float64 per-token reference."""
    index, attn = kda_layers(tiny_model)[1]
    cfg = tiny_model.config
    x = torch.randn(1, 76, cfg.hidden_size, generator=rng)
    ref_state = reference.new_state()[index]
    expected = torch.stack([reference.kda_token(index, x[0, t].double(), ref_state) for t in range(76)])

    state = KDAState.zeros(cfg, 1)
    got = [attn(x[:, :70], state)[0]]
    got += [attn(x[:, t : t + 1], state)[0] for t in range(70, 76)]
    got = torch.cat(got)
    scale = expected.abs().max().item()
    assert scale > 0.1  # the layer produces a real signal
    torch.testing.assert_close(got.double(), expected, atol=2e-5 * scale, rtol=0)
    torch.testing.assert_close(state.recurrent.double(), ref_state["S"].unsqueeze(0), atol=1e-5, rtol=0)


def test_kda_layer_without_cache_equals_with_cache(tiny_model, rng):
    _, attn = kda_layers(tiny_model)[0]
    cfg = tiny_model.config
    x = torch.randn(2, 9, cfg.hidden_size, generator=rng)
    state = KDAState.zeros(cfg, 2)
    first, second = attn(x[:, :4], state), attn(x[:, 4:], state)
    torch.testing.assert_close(torch.cat([first, second], 1), attn(x, None), atol=1e-5, rtol=0)
