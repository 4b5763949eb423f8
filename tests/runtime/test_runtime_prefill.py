"""Long-prompt prefill: chunked, no per-token loop, same logits as one uncached pass; the cpp and fla
variants of the chunked form."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import engine.model.kda as kda_module
from engine.kernels import cpp_cpu
from engine.model.kda import KimiDeltaAttention, kda_chunked
from engine.runtime import Engine
from engine.runtime.kda_kernels import (
    check_against_reference,
    cpp_chunk_kda,
    fla_chunk_kda,
    random_kda_inputs,
    select_kda_kernel,
)
from tests.runtime.runtime_support import random_prompt


def test_a_4k_prompt_prefills_in_chunks_without_a_per_token_loop(engine, rng, monkeypatch):
    def per_token(*args):
        raise AssertionError("the recurrent (per-token) KDA step ran during prefill")

    monkeypatch.setattr(kda_module, "kda_recurrent_step", per_token)
    calls = []
    for module in engine.model.modules():
        if isinstance(module, KimiDeltaAttention):
            kernel = module.chunked_kernel
            monkeypatch.setattr(
                module, "chunked_kernel", lambda *a, _k=kernel: calls.append(a[0].shape[1]) or _k(*a)
            )
    monkeypatch.setattr(engine, "plan", dataclasses.replace(engine.plan, prefill_chunk=1000))
    prompt = random_prompt(rng, 4096)
    seq = engine.start([prompt], 1)
    seq.logits = torch.full((1, engine.model.config.vocab_size), float("nan"))  # poisoned
    steps = 0
    try:
        while not engine.prefill_step(seq):
            steps += 1
        logits = seq.logits
    finally:
        engine.release(seq)
    n_kda = sum(1 for layer in engine.model.model.layers if not layer.is_mla)
    assert steps + 1 == 5  # 4 chunks of 1000 and one of 96
    assert sorted(calls) == sorted([1000] * 4 * n_kda + [96] * n_kda)
    expected = engine.model(torch.tensor([prompt]))[:, -1]  # one pass, no cache
    assert torch.isfinite(logits).all()
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-4 * expected.abs().max().item())


def test_the_cpp_kernel_is_chosen_on_the_cpu_and_others_are_refused_there():
    name, kernel = select_kda_kernel("auto", torch.device("cpu"))
    assert (name, kernel) == ("cpp", cpp_chunk_kda)
    assert select_kda_kernel("torch", torch.device("cpu")) == ("torch", kda_chunked)
    with pytest.raises(ValueError, match="fla KDA kernel needs"):
        select_kda_kernel("fla", torch.device("cpu"))
    with pytest.raises(ValueError, match="unknown KDA kernel"):
        select_kda_kernel("triton", torch.device("cpu"))


def test_auto_falls_back_to_torch_when_the_cpp_library_cannot_build(monkeypatch):
    monkeypatch.setattr(cpp_cpu, "unavailable", lambda: "building cpp_cpu.cpp failed: no compiler")
    assert select_kda_kernel("auto", torch.device("cpu")) == ("torch", kda_chunked)
    with pytest.raises(ValueError, match="no compiler"):
        select_kda_kernel("cpp", torch.device("cpu"))


@pytest.mark.parametrize(
    ("tokens", "heads", "dim", "decay"),
    [(130, 2, 64, 0.5), (64, 1, 128, 12.0), (300, 3, 40, 3.0), (16, 2, 128, 0.01)],
)
def test_the_cpp_kernel_gives_the_chunked_forms_outputs_and_state(tokens, heads, dim, decay):
    """Fresh seeds; decays from mild to strong enough that intra-block exponents reach EXP_FLOOR (12 per
    token over 16 tokens), d_k not a multiple of the vector width (40), a prompt shorter than a chunk, a
    last chunk shorter than the others (130, 300 tokens), two sequences in the batch.
    Outputs poisoned first; tolerance 1e-4 of the output scale (FP32 both ways; sum order and the last
    bit of exp differ)."""
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31, (1,)).item()))
    q, k, v, g, beta, state = random_kda_inputs(gen, "cpu", batch=2, tokens=tokens, heads=heads, dim=dim)
    g = g * (decay / 0.5)
    ref_state, cpp_state = state.clone(), state.clone()
    expected = kda_chunked(q, k, v, g, beta, ref_state)
    out = torch.full_like(expected, float("nan"))
    out.copy_(cpp_chunk_kda(q, k, v, g, beta, cpp_state))
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-4 * expected.abs().max().item())
    torch.testing.assert_close(cpp_state, ref_state, rtol=0, atol=1e-4 * ref_state.abs().max().item())


def test_the_cpp_kernel_updates_a_state_that_is_a_view_of_a_larger_cache():
    """A state slice of a pool (not contiguous) is updated in place as the contiguous one is."""
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31, (1,)).item()))
    q, k, v, g, beta, _ = random_kda_inputs(gen, "cpu", batch=1, tokens=70, heads=2, dim=64)
    pool = torch.randn(2, 3, 64, 64, generator=gen) * 0.1  # [heads, slots, d_k, d_v]
    view = pool[:, 1].unsqueeze(0)  # [1, heads, d_k, d_v], strided
    ref_state = view.clone()
    expected = kda_chunked(q, k, v, g, beta, ref_state)
    before = pool.clone()
    out = cpp_chunk_kda(q, k, v, g, beta, view)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-4 * expected.abs().max().item())
    torch.testing.assert_close(pool[:, 1], ref_state[0], rtol=0, atol=1e-4 * ref_state.abs().max().item())
    assert torch.equal(pool[:, 0], before[:, 0]) and torch.equal(pool[:, 2], before[:, 2])  # others untouched


def test_the_kernel_check_accepts_the_reference_and_catches_a_wrong_kernel():
    cpu = torch.device("cpu")
    assert check_against_reference(kda_chunked, cpu) is None

    def stale_state(q, k, v, g, beta, state):  # right outputs, state left behind
        return kda_chunked(q, k, v, g, beta, state.clone())

    def broken(*args):
        raise RuntimeError("no kernel image for this device")

    assert "relative error" in check_against_reference(stale_state, cpu)
    assert check_against_reference(broken, cpu) == "RuntimeError: no kernel image for this device"


@pytest.mark.gpu
def test_fla_chunk_kda_matches_the_chunked_form(rng):
    pytest.importorskip("fla.ops.kda")
    q, k, v, g, beta, state = random_kda_inputs(rng, "cuda", batch=2, tokens=300, heads=4, dim=128)
    ref_state, fla_state = state.clone(), state.clone()
    expected = kda_chunked(q, k, v, g, beta, ref_state)
    out = torch.full_like(expected, float("nan"))
    out.copy_(fla_chunk_kda(q, k, v, g, beta, fla_state))
    # fla's Triton dots run in TF32: agreement to ~1e-3 of the output scale
    scale = expected.abs().max().item()
    torch.testing.assert_close(out, expected, rtol=0, atol=2e-3 * scale)
    torch.testing.assert_close(fla_state, ref_state, rtol=0, atol=2e-3 * ref_state.abs().max().item())


@pytest.mark.gpu
def test_a_32k_prompt_prefills_under_its_planned_cap(rng):
    """`small` at 32k tokens: the cap is set to the plan's own total, so the workspace estimate must
    really bound the allocator's peak (the cap is enforced by the CUDA allocator)."""
    probe = Engine.load(synthetic="small", device="cuda", max_context=32768, prefix_cache_gib=0)
    plan = probe.plan
    probe.close()
    del probe
    torch.cuda.empty_cache()
    cap_gib = (plan.fixed_bytes + plan.cache_bytes_max_context) / (1 << 30)
    engine = Engine.load(
        synthetic="small", device="cuda", max_context=32768, prefix_cache_gib=0, memory_cap_gib=cap_gib
    )
    try:
        vocab = engine.model.config.vocab_size
        seq = engine.prefill([random_prompt(rng, 32768 - 1, vocab)], max_new_tokens=1)
        assert torch.isfinite(seq.logits).all()
        engine.release(seq)
        assert torch.cuda.max_memory_allocated() <= cap_gib * (1 << 30)
    finally:
        engine.close()
