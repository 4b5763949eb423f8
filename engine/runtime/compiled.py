"""The decode step compiled with Inductor: the tensor work of one token, compiled once per batch size.

`KimiLinearForCausalLM.decode_tensors` is the pure device work of a step (embedding -> layers -> norm ->
head, then the device position += 1); the host bookkeeping (room check, length counter) stays outside, in
`engine.runtime.decode.DecodeRunner`. The step reads its position from the device tensor, never the host
length, so dynamo has nothing per token to guard on: one compilation serves a whole generation.

One `CompiledStep` serves every cache of one batch size (the pool keeps one per bucket): the cache's
capacity (the MLA caches' slot axis) is compiled as a dynamic size, everything else static
(`dynamic=False`), so a batch that grows to a larger capacity mid-stream runs the code it already has
instead of compiling on the executor thread while every stream waits. Each `CompiledStep` has its own
copy of the step function, with its own code object, so its compiled code lives and dies with it and
dynamo's per-function recompile limit is never shared.
`fullgraph=True`: a graph break is an error at the first step, not a silent half-eager step. The Triton
kernels are torch custom ops (engine/kernels/triton_gemv.py), opaque to Inductor, so packed weights trace
in one graph too. On a GPU the runner captures the compiled function in its CUDA graph (Inductor's own
"reduce-overhead" graphs are not used: one graph mechanism, the runner's, for eager and compiled alike).

Inductor's on-disk cache lives under the project's cache directory, so a second start is fast.
"""

from __future__ import annotations

import os
import time
import types
from pathlib import Path

import click
import torch

from engine.model import KimiLinearForCausalLM, SequenceCache
from engine.model.cache import MLAState

STEPS = ("eager", "compiled")
ENV_VAR = "KIMI_DECODE_STEP"
# Shipped defaults per device type, pinned by tests/runtime/test_runtime_compiled.py. CPU: compiled
# measures faster (per-op overhead dominates there, and Inductor fuses the elementwise work). CUDA: the
# eager step replayed as a CUDA graph, until the compiled one is measured on a GPU.
DEFAULT_STEPS = {"cpu": "compiled", "cuda": "eager"}


def default_step(device_type: str) -> str:
    """The decode step for a device type: `KIMI_DECODE_STEP` when set, else the shipped default."""
    chosen = os.environ.get(ENV_VAR) or DEFAULT_STEPS.get(device_type, "eager")
    return check_step(chosen, source=ENV_VAR if os.environ.get(ENV_VAR) else "default")


def check_step(step: str, *, source: str = "step") -> str:
    if step not in STEPS:
        raise ValueError(f"{source}: unknown decode step {step!r}; choose one of {', '.join(STEPS)}")
    return step


def step_option(command):
    """The `--step` option of `kimi-engine serve` and the decode runner."""
    return click.option(
        "--step",
        type=click.Choice(STEPS),
        default=None,
        help="Decode step: eager (the oracle), or compiled by Inductor once per batch size (its compile time "
        "is printed). Default: KIMI_DECODE_STEP, else compiled on the CPU, eager on a GPU.",
    )(command)


def inductor_cache_dir() -> Path:
    """`$KIMI_CACHE_DIR/inductor` (default ~/.cache/local-kimi/inductor), unless TORCHINDUCTOR_CACHE_DIR is set."""
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    base = Path(os.environ.get("KIMI_CACHE_DIR", Path.home() / ".cache" / "local-kimi"))
    return base / "inductor"


# Set at import, before anything asks torch for its cache directory (which then fixes it for the process).
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(inductor_cache_dir()))


def _decode(model: KimiLinearForCausalLM, tokens: torch.Tensor, cache: SequenceCache) -> torch.Tensor:
    return model.decode_tensors(tokens, cache)


def _mark_capacity_dynamic(cache: SequenceCache) -> None:
    """Compile the capacity as a size, not a constant: the MLA caches' slot axis and the slot indices."""
    if isinstance(cache, SequenceCache):
        for state in cache.layers:
            if isinstance(state, MLAState):
                torch._dynamo.mark_dynamic(state.kv, 1)
        torch._dynamo.mark_dynamic(cache.slots, 0)


class CompiledStep:
    """`model.decode_tensors(tokens, cache)` through Inductor, for caches of one batch size and any
    capacity; counts its compilations (the test hook)."""

    def __init__(self, model: KimiLinearForCausalLM):
        self.model = model
        self.compilations = 0
        self.compile_s: float | None = None  # wall time of the first call (trace + compile + run)
        fresh = types.FunctionType(_decode.__code__.replace(), _decode.__globals__, "decode_step")
        # No guards on the model's modules: the model is fixed once built (engine/runtime/builder.py), and
        # `Engine.use_kernels`, the one re-bind, drops every CompiledStep. Checking its thousands of module
        # attributes and parameters before each token cost most of a millisecond on the CPU; the guards on
        # the step's inputs (tokens, the cache's tensors) stay.
        self._fn = torch.compile(
            fresh, backend=self._inductor, fullgraph=True, dynamic=False,
            options={"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe},
        )  # fmt: skip

    def _inductor(self, graph: torch.fx.GraphModule, example_inputs: list) -> object:
        from torch._inductor.compile_fx import compile_fx

        self.compilations += 1
        return compile_fx(graph, example_inputs)

    @torch.no_grad()
    def __call__(self, tokens: torch.Tensor, cache: SequenceCache) -> torch.Tensor:
        if self.compile_s is not None:
            return self._fn(self.model, tokens, cache)
        _mark_capacity_dynamic(cache)
        start = time.perf_counter()
        logits = self._fn(self.model, tokens, cache)
        self.compile_s = time.perf_counter() - start
        return logits
