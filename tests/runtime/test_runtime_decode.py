"""The decode runner: static buffers (eager on the CPU, CUDA-graph replay on a GPU) against the model's
plain generate loop; cache growth; batched sequences; weights prepared once at load."""

from __future__ import annotations

import pytest
import torch

import engine.runtime.engine as engine_module
from engine.model import KimiLinearForCausalLM, SamplingParams, generate
from engine.model.paths import DECODE_MAX_ROWS
from engine.model.presets import FULL, TINY
from engine.quant import make_plan, quantized_meta_model
from engine.runtime import Sampler
from engine.runtime.decode import graph_capturable
from tests.runtime.runtime_support import decode_with_and_without_graphs, random_prompt, tiny_engine


def test_static_buffer_runner_gives_the_tokens_of_plain_generate(engine, rng):
    prompt = random_prompt(rng, 37)
    expected = generate(engine.model, prompt, SamplingParams(max_tokens=24)).token_ids
    seq = engine.prefill([prompt], max_new_tokens=24)
    try:
        assert engine.decode(seq, 24) == [expected]
    finally:
        engine.release(seq)
    assert len(set(expected)) >= 3  # not a degenerate repeat


def test_seeded_sampling_matches_generate(engine, rng):
    prompt = random_prompt(rng, 20)
    params = SamplingParams(max_tokens=16, temperature=1.3, top_p=0.9, seed=11)
    expected = generate(engine.model, prompt, params).token_ids
    seq = engine.prefill([prompt], max_new_tokens=16)
    try:
        assert engine.decode(seq, 16, sampler=Sampler(params, engine.device)) == [expected]
    finally:
        engine.release(seq)


def test_a_growing_cache_keeps_the_sequence(engine, rng, monkeypatch):
    """Start in a 16-slot cache and grow twice while decoding; tokens are those of one big cache."""
    monkeypatch.setattr(engine_module, "FIRST_CACHE_EXTRA_TOKENS", 2)
    monkeypatch.setattr(engine.pool, "min_tokens", 16)
    prompt = random_prompt(rng, 10)
    expected = generate(engine.model, prompt, SamplingParams(max_tokens=40)).token_ids
    seq = engine.prefill([prompt], max_new_tokens=40)
    sizes = []
    try:
        tokens = engine.decode(seq, 40, on_token=lambda i, ids: sizes.append(seq.lease.cache.max_len))
    finally:
        engine.release(seq)
    assert tokens == [expected]
    assert sizes[0] == 16 and sorted(set(sizes)) == [16, 32, 64]


def test_batched_prompts_decode_like_single_ones(engine, rng):
    prompts = [random_prompt(rng, 15) for _ in range(3)]
    expected = [generate(engine.model, p, SamplingParams(max_tokens=10)).token_ids for p in prompts]
    seq = engine.prefill(prompts, max_new_tokens=10)
    timings = []
    try:
        assert engine.decode(seq, 10, on_token=lambda i, ids: timings.append((i, ids))) == expected
    finally:
        engine.release(seq)
    assert [i for i, _ in timings] == list(range(10)) and all(len(ids) == 3 for _, ids in timings)


def test_absorbed_weights_are_prepared_once_at_load(engine, rng, monkeypatch):
    """After load, decode never asks kv_b_proj for its dense matrix (an INT4 module would convert it)."""
    prompt = random_prompt(rng, 12)
    expected = generate(engine.model, prompt, SamplingParams(max_tokens=6)).token_ids
    for layer in engine.model.model.layers:
        if layer.is_mla:

            def refuse():
                raise AssertionError("dense_weight() called during decode")

            monkeypatch.setattr(layer.self_attn.kv_b_proj, "dense_weight", refuse)
    seq = engine.prefill([prompt], max_new_tokens=6)
    try:
        assert engine.decode(seq, 6) == [expected]
    finally:
        engine.release(seq)


def test_admission_errors_are_clear(engine):
    with pytest.raises(ValueError, match="equal length"):
        engine.start([[1, 2], [3]], 4)
    with pytest.raises(ValueError, match="max context"):
        engine.start([[1] * 100], engine.max_context)
    with pytest.raises(ValueError, match="token ids"):
        engine.start([[engine.model.config.vocab_size]], 4)
    assert engine.pool.reserved_bytes == 0 and engine.pool.in_use_bytes == 0


def test_graphs_are_captured_only_for_static_expert_shapes():
    """Dense banks (the gathered or union path) and packed banks (their kernels) are static up to
    DECODE_MAX_ROWS rows; beyond, experts are grouped on the host."""
    dense = lambda cfg: KimiLinearForCausalLM(cfg, dtype=torch.bfloat16, device="meta")
    for model in (
        dense(TINY),
        dense(FULL),
        quantized_meta_model(TINY, make_plan("default"), dtype=torch.bfloat16),
    ):
        assert graph_capturable(model, DECODE_MAX_ROWS) and not graph_capturable(model, DECODE_MAX_ROWS + 1)


@pytest.mark.gpu
def test_cuda_graph_replay_gives_the_tokens_of_eager_decode(rng):
    graphs = tiny_engine(device="cuda", max_context=4096)
    eager = tiny_engine(device="cuda", max_context=4096, cuda_graphs=False)
    try:
        for n_prompt in (5, 300):
            prompt = random_prompt(rng, n_prompt)
            replayed, eager_tokens = decode_with_and_without_graphs(graphs, eager, prompt, 48)
            assert replayed == eager_tokens
            assert eager_tokens == [generate(eager.model, prompt, SamplingParams(max_tokens=48)).token_ids]
        assert graphs.pool.graphs_captured >= 1 and eager.pool.graphs_captured == 0
        # a reused cache replays its graph again (no new capture)
        captured = graphs.pool.graphs_captured
        seq = graphs.prefill([random_prompt(rng, 5)], max_new_tokens=8)
        graphs.decode(seq, 8)
        graphs.release(seq)
        assert graphs.pool.graphs_captured == captured
    finally:
        graphs.close()
        eager.close()
