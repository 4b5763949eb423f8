"""The compiled decode step (engine/runtime/compiled.py) against the eager one, its oracle: one compilation
per generation, logits within tolerance, the same greedy tokens; dense and INT4 weights; the shipped
defaults. Compiling takes tens of seconds on a cold Inductor cache, so the engines are shared per module."""

from __future__ import annotations

import pytest
import torch

from engine.model import SamplingParams
from engine.runtime import Engine, Sampler
from engine.runtime.compiled import DEFAULT_STEPS, ENV_VAR, CompiledStep, default_step, inductor_cache_dir
from tests.runtime.runtime_support import random_prompt

GREEDY = SamplingParams(temperature=0.0)
# FP32 throughout; Inductor fuses and reorders reductions, so logits move by rounding only.
LOGITS_RTOL = 1e-4  # of the largest logit magnitude
# The CPU's INT4 kernels (int4pack) take BF16 activations and round their outputs to BF16 (2^-8
# relative each); Inductor fuses the FP32 ops around them differently, so roundings land elsewhere.
INT4_LOGITS_RTOL = 2e-2


def _load(step: str, **kwargs) -> Engine:
    return Engine.load(
        device="cpu", dtype=torch.float32, max_context=1024, prefix_cache_gib=0, step=step, **kwargs
    )


@pytest.fixture(scope="module")
def compiled_engine():
    with _load("compiled", synthetic="tiny") as eng:
        yield eng


def _lockstep(
    eager: Engine, compiled: Engine, prompt: list[int], n: int, tie_rtol: float | None = None
) -> list[float]:
    """Greedy-decode `n` tokens on both engines side by side; the tokens must agree at every step.
    Returns each step's largest logit difference relative to the largest eager logit.

    With `tie_rtol`, a differing token is accepted only at a near tie: where the eager logits' top two are
    within 2 * tie_rtol of the largest magnitude (each engine's logits may be off by tie_rtol), and the
    comparison ends there (the two sequences have diverged)."""
    seqs = [e.prefill([prompt], max_new_tokens=n) for e in (eager, compiled)]
    samplers = [Sampler(GREEDY, e.device) for e in (eager, compiled)]
    errors = []
    try:
        for i in range(n):
            tokens = [
                e.next_token(s, sampler)
                for e, s, sampler in zip((eager, compiled), seqs, samplers, strict=True)
            ]
            expected, actual = (s.logits for s in seqs)
            if tokens[0] != tokens[1] and tie_rtol is not None:
                top2 = expected.float().flatten().topk(2).values
                margin = ((top2[0] - top2[1]) / expected.abs().max()).item()
                assert margin <= 2 * tie_rtol, (
                    f"greedy tokens differ at step {i} with a top-2 margin of {margin:.2e}"
                )
                assert i >= n // 4, f"a near tie as early as step {i}: too few steps compared"
                break
            assert tokens[0] == tokens[1], f"greedy tokens differ at step {i}"
            assert torch.isfinite(actual).all()
            errors.append(((actual - expected).abs().max() / expected.abs().max()).item())
    finally:
        for e, s in zip((eager, compiled), seqs, strict=True):
            e.release(s)
    return errors


@pytest.mark.slow
def test_one_compilation_serves_a_generation_of_100_tokens(compiled_engine, rng):
    seq = compiled_engine.prefill([random_prompt(rng, 9)], max_new_tokens=101)
    try:
        runner = seq.lease.runner
        assert runner.compiled is not None and runner.compiled.compilations == 1  # compiled at take()
        compiled_engine.decode(seq, 101, GREEDY)
        assert runner.compiled.compilations == 1, "the decode step recompiled during the generation"
        assert runner.compile_s > 0
    finally:
        compiled_engine.release(seq)
    assert compiled_engine.memory_report()["steps_compiled"] >= 1


@pytest.mark.slow
def test_one_compilation_serves_every_capacity(engine, compiled_engine, rng):
    """A sequence that needs a larger cache (a long prompt, or a batch growing mid-stream) runs its batch
    size's compiled step as it is: the capacity is compiled as a dynamic size, so nothing compiles on
    the executor thread while the streams wait; and the step still gives the eager tokens there."""
    short = compiled_engine.prefill([random_prompt(rng, 9)], max_new_tokens=8)
    step, small = short.lease.runner.compiled, short.lease.cache.max_len
    compiled_engine.release(short)
    compilations = step.compilations
    long = compiled_engine.prefill([random_prompt(rng, 600)], max_new_tokens=16)
    try:
        assert long.lease.cache.max_len > small and long.lease.runner.compiled is step
        assert long.lease.runner.compile_s is None
    finally:
        compiled_engine.release(long)
    errors = _lockstep(engine, compiled_engine, random_prompt(rng, 600), 24)
    assert step.compilations == compilations, "a larger capacity recompiled the decode step"
    assert max(errors) <= LOGITS_RTOL, f"worst relative logit error {max(errors):.2e}"


@pytest.mark.slow
def test_compiled_logits_and_greedy_tokens_match_the_eager_step(engine, compiled_engine, rng):
    assert engine.step == "eager" and compiled_engine.step == "compiled"
    errors = _lockstep(engine, compiled_engine, random_prompt(rng, 23), 64)
    assert max(errors) <= LOGITS_RTOL, f"worst relative logit error {max(errors):.2e}"


@pytest.mark.slow
def test_int4_weights_compile_with_the_packed_modules(tiny_artifact, rng):
    _, artifact = tiny_artifact
    eager, compiled = _load("eager", weights=artifact), _load("compiled", weights=artifact)
    try:
        assert compiled.kernel_variants and compiled.kernel_variants == eager.kernel_variants
        errors = _lockstep(eager, compiled, random_prompt(rng, 17), 64, tie_rtol=INT4_LOGITS_RTOL)
    finally:
        eager.close()
        compiled.close()
    assert max(errors) <= INT4_LOGITS_RTOL, f"worst relative logit error {max(errors):.2e}"


@pytest.mark.slow
def test_the_compilation_count_sees_a_step_that_guards_on_the_host_length():
    """What the one-compilation test guards against: a step reading `cache.length` (as `decode_step` does)
    recompiles on every token."""

    class HostLengthStep:
        def decode_tensors(self, tokens, cache):
            return tokens * cache.length

    class Cache:
        length = 1

    step, cache = CompiledStep(HostLengthStep()), Cache()
    for _ in range(3):
        step(torch.ones(2), cache)
        cache.length += 1
    assert step.compilations == 3


def test_the_shipped_default_is_compiled_on_the_cpu_and_the_environment_overrides_it(monkeypatch):
    assert DEFAULT_STEPS == {"cpu": "compiled", "cuda": "eager"}
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert default_step("cpu") == "compiled" and default_step("cuda") == "eager"
    monkeypatch.setenv(ENV_VAR, "eager")
    assert default_step("cpu") == "eager"
    monkeypatch.setenv(ENV_VAR, "fast")
    with pytest.raises(ValueError, match="unknown decode step 'fast'"):
        default_step("cpu")


def test_an_unknown_step_is_refused_before_loading():
    with pytest.raises(ValueError, match="choose one of eager, compiled"):
        Engine.load(synthetic="tiny", device="cpu", step="jit")


def test_inductor_caches_under_the_project_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("KIMI_CACHE_DIR", str(tmp_path))
    assert inductor_cache_dir() == tmp_path / "inductor"


@pytest.mark.gpu
@pytest.mark.parametrize("quant", [None, "default"], ids=["dense", "int4-triton"])
def test_a_compiled_step_captured_in_a_cuda_graph_gives_the_eager_tokens(quant, rng):
    """The runner compiles in its warm-up steps, then captures the compiled function; packed weights run
    the shipped Triton kernels (custom ops) inside it."""
    kwargs = {"synthetic": "tiny", "quant": quant, "device": "cuda", "dtype": torch.float32}
    eager = Engine.load(max_context=1024, prefix_cache_gib=0, step="eager", cuda_graphs=False, **kwargs)
    compiled = Engine.load(max_context=1024, prefix_cache_gib=0, step="compiled", **kwargs)
    try:
        errors = _lockstep(eager, compiled, random_prompt(rng, 11), 32)
        assert compiled.pool.graphs_captured == 1 and compiled.memory_report()["steps_compiled"] == 1
    finally:
        eager.close()
        compiled.close()
    assert max(errors) <= 1e-3, f"worst relative logit error {max(errors):.2e}"  # TF32/Triton reorderings


def test_warm_up_leaves_the_runner_idle_for_the_first_request(engine, rng):
    engine.pool.drop_idle()
    assert engine.warm_up(64) is None  # an eager step has no compile time
    assert engine.pool.idle_count == 1 and engine.pool.reserved_bytes == 0
    runner = next(iter(engine.pool._idle.values()))[0].runner
    seq = engine.prefill([random_prompt(rng, 5)], max_new_tokens=10)
    try:
        assert seq.lease.runner is runner and engine.pool.idle_count == 0
    finally:
        engine.release(seq)
