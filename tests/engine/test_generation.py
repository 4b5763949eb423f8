"""generate(): greedy against the reference, stop tokens, max tokens, sampling, and the logits hook."""

from __future__ import annotations

import pytest
import torch

from engine.model import SamplingParams, generate, generate_stream, sample

PROMPT = [256, 72, 101, 108, 108, 111, 44, 32]  # [BOS] "Hello, "


def test_greedy_follows_the_reference_argmax(tiny_model, reference):
    result = generate(tiny_model, PROMPT, SamplingParams(max_tokens=12))
    assert result.finish_reason == "length" and len(result.token_ids) == 12
    logits = reference.logits(PROMPT + result.token_ids[:-1])
    assert result.token_ids == logits[len(PROMPT) - 1 :].argmax(-1).tolist()
    assert len(set(result.token_ids)) >= 3


def test_stop_token_ends_generation_and_is_reported(tiny_model):
    free = generate(tiny_model, PROMPT, SamplingParams(max_tokens=12)).token_ids
    stop = free[4]
    first = free.index(stop)
    result = generate(tiny_model, PROMPT, SamplingParams(max_tokens=12, stop_token_ids={stop, 999_999}))
    assert result.finish_reason == "stop" and result.stop_token_id == stop
    assert result.token_ids == free[:first]
    steps = list(generate_stream(tiny_model, PROMPT, SamplingParams(max_tokens=12, stop_token_ids={stop})))
    assert [s.finish_reason for s in steps] == [None] * first + ["stop"]


def test_top_p_tiny_is_greedy_and_seeded_sampling_is_reproducible(tiny_model):
    greedy = generate(tiny_model, PROMPT, SamplingParams(max_tokens=8)).token_ids
    nucleus = generate(tiny_model, PROMPT, SamplingParams(max_tokens=8, temperature=1.0, top_p=1e-6, seed=1))
    assert nucleus.token_ids == greedy
    a = generate(tiny_model, PROMPT, SamplingParams(max_tokens=8, temperature=1.5, seed=5)).token_ids
    b = generate(tiny_model, PROMPT, SamplingParams(max_tokens=8, temperature=1.5, seed=5)).token_ids
    c = generate(tiny_model, PROMPT, SamplingParams(max_tokens=8, temperature=1.5, seed=6)).token_ids
    assert a == b and a != c


def test_sample_respects_top_p_mass(rng):
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    draws = {int(sample(logits, 1.0, 0.7, rng)) for _ in range(200)}
    assert draws == {0, 1}  # 0.5 < 0.7 so token 1 is kept; 0.8 >= 0.7 so token 2 is not
    draws = {int(sample(logits, 1.0, 1.0, rng)) for _ in range(400)}
    assert draws == {0, 1, 2, 3}


def test_logits_processor_sees_history_and_can_force_tokens(tiny_model):
    seen = []

    def only_token_65(generated, logits):
        seen.append(list(generated))
        forced = torch.full_like(logits, float("-inf"))
        forced[65] = 0.0
        return forced

    result = generate(tiny_model, PROMPT, SamplingParams(max_tokens=4), logits_processor=only_token_65)
    assert result.token_ids == [65] * 4
    assert seen == [[], [65], [65, 65], [65, 65, 65]]


def test_bad_requests_are_refused(tiny_model):
    with pytest.raises(ValueError, match="at least one token"):
        generate(tiny_model, [], SamplingParams())
    with pytest.raises(ValueError, match="out of range"):
        generate(tiny_model, [1, 10_000], SamplingParams())
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)
