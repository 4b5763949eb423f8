"""One decode step for a cache, through static buffers; on a GPU, one CUDA-graph replay per token.

The runner owns the input token buffer. With a graph, `decode_step` is captured once for its cache and
every later token is a copy into that buffer plus `graph.replay()`: the step's kernels write the same
cache buffers, read the device-side position, and leave the logits in the graph's static output. The
host-side length is advanced here (it is not part of the graph). Without CUDA, or with graphs turned
off, the same buffer goes through `decode_step` eagerly.
"""

from __future__ import annotations

import torch

from engine.model import KimiLinearForCausalLM, SequenceCache
from engine.model.moe import ExpertBank
from engine.quant.packed import DECODE_MAX_ROWS, PackedExpertBank

_WARMUP_STEPS = 2  # lazy initialisation (cuBLAS handles, workspace) must happen outside the capture


def graph_capturable(model: KimiLinearForCausalLM, batch: int) -> bool:
    """Whether a decode step of `batch` sequences has static shapes, i.e. every expert bank takes a
    sync-free path: a dense `ExpertBank` gathers experts only while batch * top_k < num_experts (beyond,
    `expert_ffn` groups by expert on the host); a `PackedExpertBank` runs its kernels up to
    `DECODE_MAX_ROWS` rows (beyond, it dequantises expert by expert, also grouped on the host)."""
    cfg = model.config
    for module in model.modules():
        if isinstance(module, PackedExpertBank) and batch > DECODE_MAX_ROWS:
            return False
        if isinstance(module, ExpertBank) and batch * cfg.num_experts_per_token >= cfg.num_experts:
            return False
    return True


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
