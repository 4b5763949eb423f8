"""Sequence caches sized to the request, reused, and kept within a byte budget.

MLA decode attends over a cache's whole capacity, so a sequence gets a cache sized to what it holds
(powers of two from `min_tokens`, capped at the max context) and moves to a larger one when it fills
(`engine.runtime.state.transfer`). Admission reserves the bytes of the largest cache the sequence may
need (plus the smaller one it moves out of), so growth never fails for memory. Released caches stay
idle, with their decode runner (its compiled step and CUDA graph), for the next sequence of the same size;
idle caches are dropped (least recently used first) when a reservation needs the room.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from engine.model import KimiLinearForCausalLM, SequenceCache
from engine.runtime.compiled import CompiledStep
from engine.runtime.decode import DecodeRunner, graph_capturable
from engine.runtime.memory import cache_bytes


@dataclass
class Lease:
    cache: SequenceCache
    runner: DecodeRunner | None  # None: a cache only prefilled into (its sequence joins the decode batch)
    nbytes: int

    @property
    def decoder(self) -> DecodeRunner:
        if self.runner is None:
            raise RuntimeError("this cache was leased for prefill only: it has no decode runner")
        return self.runner


def required_lease(lease: Lease | None, why_none: str) -> Lease:
    """`lease`, or a RuntimeError saying why there is none (an empty batch, a sequence in the batch)."""
    if lease is None:
        raise RuntimeError(why_none)
    return lease


class CachePool:
    def __init__(
        self,
        model: KimiLinearForCausalLM,
        *,
        max_context: int,
        budget_bytes: int | None,
        cuda_graphs: bool,
        compiled: bool = False,
        min_tokens: int = 256,
        max_idle: int = 8,
    ):
        self.model = model
        self.max_context = max_context
        self.budget_bytes = budget_bytes
        self.cuda_graphs = cuda_graphs
        self.compiled = compiled
        self.min_tokens = min_tokens
        self.max_idle = max_idle
        self.graph_pool = torch.cuda.graph_pool_handle() if cuda_graphs else None
        self._idle: OrderedDict[int, list[Lease]] = OrderedDict()  # capacity -> idle leases, LRU order
        self.idle_bytes = 0
        self.idle_count = 0  # counters, not views of the dict: other threads read stats()
        self.in_use_bytes = 0
        self.reserved_bytes = 0
        self.graphs_captured = 0
        self.steps_compiled = 0
        self.compile_s: dict[tuple[int, int], float] = {}  # (capacity, batch) -> its latest compile time
        self._compiled_steps: dict[int, CompiledStep] = {}  # batch -> its step, for every capacity

    def capacity_for(self, tokens: int) -> int:
        """The cache size for `tokens` tokens: the next power of two (at least `min_tokens`), at most the
        max context."""
        if tokens > self.max_context:
            raise ValueError(f"{tokens} tokens exceed the max context of {self.max_context}")
        size = max(self.min_tokens, 1 << max(0, tokens - 1).bit_length())
        return min(size, self.max_context)

    def bytes_for(self, capacity: int, batch: int = 1) -> int:
        return cache_bytes(self.model.config, self.model.dtype, capacity, batch)

    def reservation_for(self, first_tokens: int, total_tokens: int, batch: int = 1) -> int:
        """Bytes to reserve for a sequence that starts needing `first_tokens` slots and may grow to
        `total_tokens`: the final cache, plus the one it grows out of."""
        first, final = self.capacity_for(first_tokens), self.capacity_for(total_tokens)
        growth = self.bytes_for(max(first, final // 2), batch) if final > first else 0
        return self.bytes_for(final, batch) + growth

    def reserve(self, nbytes: int, *, force: bool = False) -> bool:
        """Reserve bytes for a sequence, dropping idle caches if needed; False when they do not fit now
        (`force`: reserve them anyway, for growth that cannot wait)."""
        if self.budget_bytes is not None:
            if nbytes > self.budget_bytes and not force:
                raise ValueError(f"a sequence needing {nbytes} bytes can never fit the budget")
            while self._idle and self.reserved_bytes + self.idle_bytes + nbytes > self.budget_bytes:
                self._drop_oldest_idle()
            if self.reserved_bytes + nbytes > self.budget_bytes and not force:
                return False
        self.reserved_bytes += nbytes
        return True

    def unreserve(self, nbytes: int) -> None:
        self.reserved_bytes -= nbytes

    def take(self, tokens: int, batch: int = 1, *, decoding: bool = True) -> Lease:
        """An empty cache for `tokens` tokens (reused if one is idle); its bytes must be reserved.
        `decoding=False`: only prefilled into, so it needs no decode runner (nothing compiled for it)."""
        capacity = self.capacity_for(tokens)
        idle = self._idle.get(capacity, [])
        fits = lambda x: x.cache.batch_size == batch and (x.runner is not None or not decoding)
        lease = next((x for x in idle if fits(x)), None)
        if lease is not None:
            idle.remove(lease)
            if not idle:
                del self._idle[capacity]
            self.idle_bytes -= lease.nbytes
            self.idle_count -= 1
            lease.cache.reset()
        else:
            cache = self.model.new_cache(capacity, batch_size=batch)
            lease = Lease(cache, self._runner(cache) if decoding else None, self.bytes_for(capacity, batch))
        self.in_use_bytes += lease.nbytes
        return lease

    def _runner(self, cache: SequenceCache) -> DecodeRunner:
        batch = cache.batch_size
        runner = DecodeRunner(
            self.model,
            cache,
            cuda_graph=self.graphs_for(batch),
            compiled=self._compiled_step(batch) if self.compiled_for(batch) else None,
            graph_pool=self.graph_pool,
        )
        self.graphs_captured += runner.graph is not None
        if runner.compile_s is not None:
            self.steps_compiled += 1
            self.compile_s[cache.max_len, batch] = runner.compile_s
        return runner

    def _compiled_step(self, batch: int) -> CompiledStep:
        if batch not in self._compiled_steps:
            self._compiled_steps[batch] = CompiledStep(self.model)
        return self._compiled_steps[batch]

    def graphs_for(self, batch: int) -> bool:
        """Whether decode steps of `batch` sequences replay a CUDA graph (else they run eagerly)."""
        return self.cuda_graphs and graph_capturable(self.model, batch)

    def compiled_for(self, batch: int) -> bool:
        """Whether decode steps of `batch` sequences run compiled (else eagerly): only static, sync-free
        steps compile in one graph."""
        return self.compiled and graph_capturable(self.model, batch)

    def drop_idle(self) -> None:
        """Free every idle cache and its graph, and the compiled steps (after the model's kernels changed)."""
        self._compiled_steps.clear()
        while self._idle:
            self._drop_oldest_idle()

    def give_back(self, lease: Lease) -> None:
        """Return a cache: it becomes idle (or is freed when too many are idle)."""
        self.in_use_bytes -= lease.nbytes
        self._idle.setdefault(lease.cache.max_len, []).append(lease)
        self._idle.move_to_end(lease.cache.max_len)
        self.idle_bytes += lease.nbytes
        self.idle_count += 1
        while self.idle_count > self.max_idle:
            self._drop_oldest_idle()

    def _drop_oldest_idle(self) -> None:
        capacity, leases = next(iter(self._idle.items()))
        lease = leases.pop(0)
        if not leases:
            del self._idle[capacity]
        self.idle_bytes -= lease.nbytes
        self.idle_count -= 1

    def stats(self) -> dict:
        return {
            "in_use_bytes": self.in_use_bytes,
            "idle_bytes": self.idle_bytes,
            "reserved_bytes": self.reserved_bytes,
            "budget_bytes": self.budget_bytes,
            "idle_caches": self.idle_count,
            "graphs_captured": self.graphs_captured,
            "steps_compiled": self.steps_compiled,
        }
