"""Prompts prefilled together (`Engine.prefill_together`, and the scheduler's grouping): one forward pass
over a cache of several rows gives each prompt the state and logits its own prefill gives, and the
scheduler sends the prompts of one step through such passes, up to the shortest one's length, within
its token budget.

Tolerance: FP32 tiny model; a pass of several rows sums in another order (other GEMM blocking, the experts'
rows grouped differently), so logits and states agree to STATE_RTOL of their scale, not bit for bit.
"""

from __future__ import annotations

import pytest
import torch

from engine.model import SamplingParams, generate
from engine.runtime import Request, Scheduler
from engine.runtime.state import take_snapshot
from tests.runtime.runtime_support import random_prompt
from tests.runtime.test_batching import _run, assert_same_greedy

STATE_RTOL = 1e-4


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert torch.isfinite(got).all()
    scale = want.abs().max().clamp_min(1e-6)
    assert ((got - want).abs().max() / scale).item() <= STATE_RTOL


def _alone(engine, prompt: list[int], first: int):
    """The prompt prefilled on its own: `first` tokens, then the rest (None: all at once)."""
    seq = engine.start([prompt], 1, batched=True)
    if first:
        engine.prefill_step(seq, first)
    engine.prefill_step(seq)
    return seq


@pytest.mark.parametrize("already", [0, 13])
def test_prompts_prefilled_together_get_the_state_and_logits_of_their_own_prefill(engine, rng, already):
    """Three prompts of different lengths, `already` tokens of each in their caches first; 40 more
    together. The rows the pass writes are poisoned (NaN) in every cache beforehand."""
    prompts = [random_prompt(rng, n) for n in (60, 53, 90)]
    seqs = [engine.start([p], 1, batched=True) for p in prompts]
    if already:
        for seq in seqs:
            engine.prefill_step(seq, already)
    for seq in seqs:
        for layer in seq.held.cache.layers:
            if hasattr(layer, "kv"):
                layer.kv[:, already:].fill_(float("nan"))
        seq.logits = torch.full((1, engine.model.config.vocab_size), float("nan"))
    assert engine.prefill_together(seqs, 40) is True
    for seq, prompt in zip(seqs, prompts, strict=True):
        assert seq.held.cache.length == already + 40 and seq.pending.shape[1] == len(prompt) - already - 40
        reference = engine.start([prompt[: already + 40]], 1, batched=True)
        if already:
            engine.prefill_step(reference, already)
        engine.prefill_step(reference)
        _close(seq.logits, reference.logits)
        ours, theirs = take_snapshot(seq.held.cache), take_snapshot(reference.held.cache)
        for got, want in zip(ours.tensors, theirs.tensors, strict=True):
            _close(got, want)
        engine.release(reference)
    for seq in seqs:
        engine.release(seq)
    assert engine.pool.in_use_bytes == 0 and engine.pool.reserved_bytes == 0


def test_prefill_together_refuses_what_it_cannot_do(engine, rng):
    a, b = (engine.start([random_prompt(rng, 30)], 1, batched=True) for _ in range(2))
    try:
        with pytest.raises(ValueError, match="pending"):
            engine.prefill_together([a, b], 31)
        engine.prefill_step(a, 5)
        with pytest.raises(ValueError, match="same length"):
            engine.prefill_together([a, b], 10)
        with pytest.raises(ValueError, match="prefill chunk"):
            engine.prefill_together([b, b], engine.plan.prefill_chunk)
    finally:
        engine.release(a)
        engine.release(b)


def _count_prefills(engine, monkeypatch) -> list[tuple[int, int]]:
    shapes: list[tuple[int, int]] = []
    real = engine.model.prefill

    def spy(token_ids, cache):
        shapes.append(tuple(token_ids.shape))
        return real(token_ids, cache)

    monkeypatch.setattr(engine.model, "prefill", spy)
    return shapes


def _serve(engine, prompts: dict[str, list[int]], params: SamplingParams, **options):
    """Every prompt submitted in one step to a fresh scheduler; -> (its collector, its step records)."""
    s = Scheduler(engine, max_active=8, max_queue=8, **options)
    s.start()
    try:
        return _run(s, {label: Request(p, params) for label, p in prompts.items()}), list(s.steps)
    finally:
        s.stop()


def test_prompts_of_one_step_prefill_together_and_join_in_that_step(engine, rng, monkeypatch):
    """Four prompts of 40 tokens and one of 100 arrive in one step: one pass of 5 x 40, then the long one's
    60 alone; every prompt is prefilled and joins in that first step; the replies are those alone."""
    prompts = {f"r{i}": random_prompt(rng, n) for i, n in enumerate((40, 40, 100, 40, 40))}
    params = SamplingParams(max_tokens=6)
    shapes = _count_prefills(engine, monkeypatch)
    out, steps = _serve(engine, prompts, params)
    assert shapes == [(5, 40), (1, 60)]
    first = next(r for r in steps if r.prefill_tokens)
    assert first.prefill_tokens == sum(len(p) for p in prompts.values())
    assert max(r.decoded for r in steps) == len(prompts)
    monkeypatch.undo()
    for label, prompt in prompts.items():
        assert_same_greedy(
            engine.model, prompt, out.tokens(label), generate(engine.model, prompt, params).token_ids
        )


def test_the_budget_bounds_a_group_and_no_memory_means_one_by_one(engine, rng, monkeypatch):
    prompts = {f"r{i}": random_prompt(rng, 24) for i in range(3)}
    params = SamplingParams(max_tokens=3)
    shapes = _count_prefills(engine, monkeypatch)
    _, steps = _serve(engine, prompts, params, prefill_budget=30)
    assert all(r.prefill_tokens <= 30 for r in steps)
    assert shapes[0] == (3, 10)  # 30 tokens of budget over three prompts
    shapes.clear()
    monkeypatch.setattr(engine, "prefill_together", lambda seqs, tokens: False)  # never memory for a group
    out, _ = _serve(engine, prompts, params)
    assert shapes == [(1, 24)] * 3 and all(len(out.tokens(label)) == 3 for label in prompts)
