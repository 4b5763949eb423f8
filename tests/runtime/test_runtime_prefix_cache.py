"""Prefix state cache: the next turn restores the kept prompt and prefills only the new tokens, with the
logits of a cold prefill of the whole conversation; byte budget; longest match."""

from __future__ import annotations

import pytest
import torch

from engine.model import SamplingParams, generate
from engine.runtime.prefix_cache import PrefixCache
from tests.runtime.runtime_support import random_prompt, tiny_engine


@pytest.fixture(scope="module")
def cached_engine():
    with tiny_engine(max_context=4096, prefix_cache_gib=0.05) as eng:
        yield eng


def _prefill(engine, prompt):
    seq = engine.prefill([prompt], max_new_tokens=8)
    logits, cached = seq.logits.clone(), seq.cached_tokens
    engine.release(seq)
    return logits, cached


def test_next_turn_prefills_only_new_tokens_with_cold_logits(cached_engine, rng):
    turn1 = random_prompt(rng, 300)
    turn2 = turn1 + random_prompt(rng, 170)  # the same conversation plus new messages
    _, cached = _prefill(cached_engine, turn1)
    assert cached == 0
    warm, cached = _prefill(cached_engine, turn2)
    assert cached == len(turn1)
    cold = cached_engine.model(torch.tensor([turn2]))[:, -1]  # the whole conversation, no cache at all
    torch.testing.assert_close(warm, cold, rtol=0, atol=1e-4 * cold.abs().max().item())
    # and generation continues as from a cold prompt
    seq = cached_engine.prefill([turn2], max_new_tokens=12)
    assert seq.cached_tokens == len(turn2)
    tokens = cached_engine.decode(seq, 12)
    cached_engine.release(seq)
    assert tokens == [generate(cached_engine.model, turn2, SamplingParams(max_tokens=12)).token_ids]


def test_an_exact_repeat_needs_no_prefill(cached_engine, rng, monkeypatch):
    prompt = random_prompt(rng, 90)
    first, _ = _prefill(cached_engine, prompt)

    def no_prefill(*args, **kwargs):
        raise AssertionError("prefill ran for a kept prompt")

    monkeypatch.setattr(cached_engine.model, "prefill", no_prefill)
    again, cached = _prefill(cached_engine, prompt)
    assert cached == len(prompt) and torch.equal(again, first)


def test_longest_kept_prefix_wins_and_unrelated_prompts_miss(cached_engine, rng):
    base = random_prompt(rng, 200)
    _prefill(cached_engine, base[:80])
    _prefill(cached_engine, base[:150])
    _, cached = _prefill(cached_engine, base)
    assert cached == 150
    other = [(t + 1) % 256 for t in base]
    _, cached = _prefill(cached_engine, other)
    assert cached == 0


def test_budget_evicts_least_recently_used(engine, rng):
    model = engine.model
    prompts = [random_prompt(rng, 40) for _ in range(3)]
    caches = []
    for p in prompts:
        cache = model.new_cache(64)
        logits = model.prefill(torch.tensor([p]), cache)
        caches.append((p, cache, logits))
    probe = PrefixCache(1 << 30, device="cpu")
    probe.store(*caches[0])
    one = probe.bytes
    kept = PrefixCache(2 * one, device="cpu")  # room for two snapshots
    kept.store(*caches[0])
    kept.store(*caches[1])
    assert kept.lookup(prompts[0] + [1]) is not None  # touch the first: the second is now oldest
    kept.store(*caches[2])
    assert len(kept) == 2 and kept.bytes <= kept.max_bytes
    assert kept.lookup(prompts[1]) is None
    assert kept.lookup(prompts[0]).length == 40 and kept.lookup(prompts[2]).length == 40
    with pytest.raises(ValueError, match="cache holds 40 tokens"):
        kept.store(prompts[0][:10], caches[0][1], caches[0][2])
