"""MLA: absorbed latent-space decode vs plain attention, and the layer vs the float64 reference."""

from __future__ import annotations

import torch

from engine.model.cache import SequenceCache


def mla_layer(model):
    index = model.config.full_attn_layers[0]
    return index, model.model.layers[index].self_attn


def fresh_state(model, max_len, batch=1):
    cache = SequenceCache(model.config, max_len, batch_size=batch)
    return cache, cache.layers[model.config.full_attn_layers[0]]


def test_mla_layer_matches_reference(tiny_model, reference, rng):
    index, attn = mla_layer(tiny_model)
    x = torch.randn(1, 12, tiny_model.config.hidden_size, generator=rng)
    ref_state = reference.new_state()[index]
    expected = torch.stack([reference.mla_token(index, x[0, t].double(), ref_state) for t in range(12)])
    got = attn(x, None)[0]
    scale = expected.abs().max().item()
    assert scale > 0.1
    torch.testing.assert_close(got.double(), expected, atol=2e-5 * scale, rtol=0)


def test_absorbed_decode_matches_plain_attention(tiny_model, rng):
    """Prefill 10 tokens, then decode 8 one at a time (absorbed), vs plain attention over all 18 at once.
    Unwritten cache slots hold large garbage first: the decode mask must keep it out."""
    _, attn = mla_layer(tiny_model)
    x = torch.randn(2, 18, tiny_model.config.hidden_size, generator=rng)
    expected = attn(x, None)
    cache, state = fresh_state(tiny_model, max_len=24, batch=2)
    state.kv.uniform_(-1e4, 1e4, generator=rng)
    got = [attn(x[:, :10], state, 0)]
    cache.position.fill_(10)
    for t in range(10, 18):
        got.append(attn.decode(x[:, t : t + 1], state, cache.position, cache.slots))
        cache.position.add_(1)
    torch.testing.assert_close(torch.cat(got, 1), expected, atol=2e-5, rtol=0)


def test_prefill_continuing_a_cache_matches_one_prefill(tiny_model, rng):
    """Prefill in two pieces (the second attends to the cached first piece) equals one prefill."""
    _, attn = mla_layer(tiny_model)
    x = torch.randn(1, 15, tiny_model.config.hidden_size, generator=rng)
    _, state = fresh_state(tiny_model, max_len=15)
    got = torch.cat([attn(x[:, :6], state, 0), attn(x[:, 6:], state, 6)], 1)
    torch.testing.assert_close(got, attn(x, None), atol=2e-5, rtol=0)


def test_cache_holds_only_the_latent(tiny_model, rng):
    cfg = tiny_model.config
    _, attn = mla_layer(tiny_model)
    x = torch.randn(1, 5, cfg.hidden_size, generator=rng)
    _, state = fresh_state(tiny_model, max_len=8)
    attn(x, state, 0)
    assert state.kv.shape == (1, 8, cfg.kv_lora_rank + cfg.qk_rope_head_dim)
    torch.testing.assert_close(state.kv[:, :5], attn.compress(x))
    assert state.kv[:, 5:].abs().sum() == 0


def test_the_compiled_steps_attention_form_matches_the_eager_one(rng):
    """The broadcast-and-sum attention a compiled step traces equals the matmul form eager runs, per row
    and with the unwritten slots masked (they hold large garbage: a leak would show)."""
    from engine.model.cache import MLAState
    from engine.model.mla import _attend_as_matmuls, _attend_as_reductions

    batch, heads, nope, rope, latent, v, slots = 3, 4, 16, 8, 32, 16, 20
    kv = torch.randn(batch, slots, latent + rope, generator=rng)
    at = torch.tensor([4, 11, 19]).view(batch, 1, 1)
    masked = torch.arange(slots).view(1, 1, slots) > at
    kv[masked.view(batch, slots)] = 1e4
    state = MLAState(kv=kv, kv_lora_rank=latent)
    args = (
        torch.randn(batch, heads, nope, generator=rng),
        torch.randn(batch, heads, rope, generator=rng),
        torch.randn(heads, nope, latent, generator=rng) / nope**0.5,
        torch.randn(heads, v, latent, generator=rng) / latent**0.5,
        state,
        masked,
        (nope + rope) ** -0.5,
    )
    expected = _attend_as_matmuls(*args)
    got = _attend_as_reductions(*args)
    scale = expected.abs().max().item()
    assert scale > 0.1
    torch.testing.assert_close(got, expected, atol=1e-5 * scale, rtol=0)
