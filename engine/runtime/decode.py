"""One decode step for a cache, through static buffers; on a GPU, one CUDA-graph replay per token.

The runner owns the input token buffer. With a graph, `decode_step` is captured once for its cache and
every later token is a copy into that buffer plus `graph.replay()`: the step's kernels write the same
cache buffers, read the device-side position, and leave the logits in the graph's static output. The
host-side length is advanced here (it is not part of the graph). Without CUDA, or with graphs turned
off, the same buffer goes through `decode_step` eagerly.
"""

from __future__ import annotations

import torch

from engine.model import KimiLinearConfig, KimiLinearForCausalLM, SequenceCache

_WARMUP_STEPS = 2  # lazy initialisation (cuBLAS handles, workspace) must happen outside the capture


def graph_capturable(config: KimiLinearConfig, batch: int) -> bool:
    """Whether a decode step of `batch` sequences has static shapes: `expert_ffn` takes its gathered
    (sync-free) path only while batch * top_k < num_experts; beyond, it groups by expert on the host."""
    return batch * config.num_experts_per_token < config.num_experts


class DecodeRunner:
    def __init__(
        self,
        model: KimiLinearForCausalLM,
        cache: SequenceCache,
        *,
        cuda_graph: bool,
        graph_pool: tuple | None = None,
    ):
        if cuda_graph and cache.device.type != "cuda":
            raise ValueError("CUDA graphs need a cache on a CUDA device")
        self.model = model
        self.cache = cache
        self.tokens = torch.zeros(cache.batch_size, dtype=torch.long, device=cache.device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None
        if cuda_graph:
            self._capture(graph_pool)

    def _capture(self, pool: tuple | None) -> None:
        """Capture on an empty cache, then empty it again: the warm-up steps really run and write it."""
        if self.cache.length:
            raise ValueError("capture a decode graph on an empty cache")
        side = torch.cuda.Stream(device=self.cache.device)
        side.wait_stream(torch.cuda.current_stream(self.cache.device))
        with torch.cuda.stream(side):
            for _ in range(_WARMUP_STEPS):
                self.model.decode_step(self.tokens, self.cache)
        torch.cuda.current_stream(self.cache.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            self.logits = self.model.decode_step(self.tokens, self.cache)
        self.graph = graph
        self.cache.reset()  # zero the warm-ups' writes; the capture only advanced the host counter

    def step(self, token_ids: torch.Tensor) -> torch.Tensor:
        """token_ids [B] -> logits [B, vocab]. With a graph the logits are its static output, overwritten
        by the next step: read (sample) them before calling again."""
        self.tokens.copy_(token_ids)
        if self.graph is None:
            return self.model.decode_step(self.tokens, self.cache)
        self.cache.check_room(1)
        self.graph.replay()
        self.cache.advance(1)
        return self.logits
