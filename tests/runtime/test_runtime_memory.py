"""The memory plan: sizes from the model's own layout, refusal messages that say what would fit."""

from __future__ import annotations

import pytest
import torch

from engine.model import SequenceCache
from engine.model.presets import FULL, TINY
from engine.runtime import Engine, MemoryPlanError, plan_memory
from engine.runtime.loader import ModelSource
from engine.runtime.memory import GIB, cache_bytes, module_bytes


def _plan(config, cap_bytes, context, *, dtype=torch.float32, weights=None):
    weights = (
        weights if weights is not None else module_bytes(ModelSource("x", config, True).meta_model(dtype))
    )
    return plan_memory(
        config,
        dtype,
        weights_bytes=weights,
        cap_bytes=cap_bytes,
        max_context=context,
        prefill_chunk=512,
        scores_materialized=True,
    )


def test_cache_sizes_are_the_caches_own():
    cache = SequenceCache(TINY, 300, batch_size=2, dtype=torch.float32)
    assert cache_bytes(TINY, torch.float32, 300, 2) == cache.nbytes + cache.slots.numel() * 8
    # full model, BF16: 7 MLA layers x 1,152 B of latent per token, plus the 8-byte slot index
    plan = _plan(FULL, None, 4096, dtype=torch.bfloat16)
    assert plan.cache_bytes_per_token == 7 * 1152 + 8


def test_refusal_names_the_largest_context_that_fits():
    reference = _plan(TINY, None, 1000)
    cap = reference.fixed_bytes + reference.cache_bytes_max_context + 5_000
    with pytest.raises(MemoryPlanError) as refused:
        _plan(TINY, cap, 100_000)
    message = str(refused.value)
    fit = int(message.split("at most ")[1].split(" tokens fit")[0])
    assert f"--max-context {fit}" in message and "raise --memory-cap-gib to" in message
    assert fit >= 1000
    _plan(TINY, cap, fit)  # the suggestion really fits ...
    with pytest.raises(MemoryPlanError):
        _plan(TINY, cap, fit + 1)  # ... and is the largest that does
    needed = float(message.split("raise --memory-cap-gib to ")[1])
    _plan(TINY, int(needed * GIB), 100_000)  # and the suggested cap admits the original request


def test_weights_over_the_cap_are_refused_whatever_the_context():
    with pytest.raises(MemoryPlanError, match="even one token does not fit") as refused:
        _plan(FULL, 32 * GIB, 32768, dtype=torch.bfloat16)
    weights = float(str(refused.value).split("(weights ")[1].split(",")[0])
    assert 91.5 <= weights < 91.6  # the 91.50 GiB BF16 checkpoint, routers kept in FP32


def test_engine_refuses_before_allocating_anything(monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("weights were allocated before the plan was checked")

    monkeypatch.setattr(ModelSource, "load", never)
    with pytest.raises(MemoryPlanError, match="over the memory cap"):
        Engine.load(synthetic="tiny", device="cpu", memory_cap_gib=0.01, max_context=4096)


def test_workspace_grows_with_context_and_chunk():
    small = _plan(TINY, None, 1024).prefill_workspace_bytes
    longer = _plan(TINY, None, 8192).prefill_workspace_bytes
    assert longer > small
