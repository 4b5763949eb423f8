"""One decode step for a cache, through static buffers; on a GPU, one CUDA-graph replay per token.

The runner owns the input token buffer and the host bookkeeping (room check, length counter); the step
itself is the model's `decode_tensors`, run eagerly or compiled by Inductor (engine/runtime/compiled.py:
one compiled step per batch size, shared by the pool's runners of any capacity, compiled by the first
runner's warm-up on its empty cache). With a graph, that step (eager or compiled) is captured once for
its cache and every later token is a copy into that buffer plus `graph.replay()`: the step's kernels
write the same cache buffers, read the device-side position, and leave the logits in the graph's static
output. Without CUDA, or with graphs turned off, the same buffer goes through the step directly.
"""

from __future__ import annotations

import time

import torch

from engine.model import KimiLinearForCausalLM, SequenceCache
from engine.model.moe import ExpertBank
from engine.model.paths import takes_decode_path
from engine.quant.packed import PackedExpertBank
from engine.runtime.compiled import CompiledStep

_WARMUP_STEPS = 2  # lazy initialisation (cuBLAS handles, workspace) must happen outside the capture


def graph_capturable(model: KimiLinearForCausalLM, batch: int) -> bool:
    """Whether a decode step of `batch` sequences has static shapes and no host reads (so it can be
    captured in a CUDA graph, or compiled in one graph), i.e. every expert bank takes a
    sync-free path: on the decode side of `engine.model.paths`, a dense `ExpertBank` runs one expert slot per row and
    choice and a `PackedExpertBank` runs its kernels; beyond, both group by expert on the host."""
    has_banks = any(isinstance(m, ExpertBank | PackedExpertBank) for m in model.modules())
    return takes_decode_path(batch) or not has_banks


class DecodeRunner:
    def __init__(
        self,
        model: KimiLinearForCausalLM,
        cache: SequenceCache,
        *,
        cuda_graph: bool,
        compiled: CompiledStep | None = None,
        graph_pool: torch.cuda._POOL_HANDLE | None = None,
    ):
        if cuda_graph and cache.device.type != "cuda":
            raise ValueError("CUDA graphs need a cache on a CUDA device")
        self.model = model
        self.cache = cache
        self.tokens = torch.zeros(cache.batch_size, dtype=torch.long, device=cache.device)
        self.compiled = compiled  # shared by the pool's runners of this batch size
        self._step = self.compiled or model.decode_tensors
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None
        self.compile_s: float | None = None  # seconds its warm-up took when that compiled the step
        compilations = 0 if compiled is None else compiled.compilations
        start = time.perf_counter()
        if cuda_graph:
            self._capture(graph_pool)
        elif self.compiled is not None:
            self._warm_up(1)
            self.cache.reset()  # zero the compiling step's writes
        if compiled is not None and compiled.compilations > compilations:
            self.compile_s = time.perf_counter() - start

    def _warm_up(self, steps: int) -> None:
        if self.cache.length:
            raise ValueError("warm up (compile, capture) a decode step on an empty cache")
        for _ in range(steps):
            self._step(self.tokens, self.cache)

    def _capture(self, pool: torch.cuda._POOL_HANDLE | None) -> None:
        """Capture on an empty cache, then empty it again: the warm-up steps really run and write it."""
        side = torch.cuda.Stream(device=self.cache.device)
        side.wait_stream(torch.cuda.current_stream(self.cache.device))
        with torch.cuda.stream(side):
            self._warm_up(_WARMUP_STEPS)  # also compiles a compiled step, before the capture
        torch.cuda.current_stream(self.cache.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            self.logits = self._step(self.tokens, self.cache)
        self.graph = graph
        self.cache.reset()  # zero the warm-ups' and the capture's writes

    def step(self, token_ids: torch.Tensor) -> torch.Tensor:
        """token_ids [B] -> logits [B, vocab]. With a graph the logits are its static output, overwritten
        by the next step: read (sample) them before calling again."""
        self.cache.check_room(1)
        self.tokens.copy_(token_ids)
        if self.graph is None or self.logits is None:  # not captured (logits: the graph's output)
            logits = self._step(self.tokens, self.cache)
        else:
            self.graph.replay()
            logits = self.logits
        self.cache.advance(1)
        return logits
