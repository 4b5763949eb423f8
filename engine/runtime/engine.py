"""The engine: a loaded model under a memory cap, with sized caches, chunked prefill, compiled and/or graph
decode and a prefix state cache. Single-threaded; the scheduler (or a benchmark) drives it.

    engine = Engine.load(synthetic="tiny")              # or weights="ckpt/" / "artifact/", quant="default", ...
    seq = engine.prefill([ids])                                 # [B] prompts of equal length
    tokens = engine.decode(seq, 64, SamplingParams(), on_token=lambda i, ids: ...)
    engine.release(seq); engine.memory_report(); engine.close()

The step-wise form is `start` → `prefill_step` until it returns True → `next_token` per token →
`release`. The scheduler's continuously batched form: `start` → `prefill_step` → `next_token` (the first
token, from the prefill's logits) → `join` → `decode_batch` (one step for every joined sequence) →
`keep_reply` (prefix-cache the state after the reply) → `release`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import torch

from common.memory_cap import MemoryCap
from engine.kernels import KernelSelectionError, KernelUnavailable, env_selection
from engine.kernels.cpp_cpu import flush_denormals
from engine.model import CheckpointError, ConfigError, KimiLinearForCausalLM, SamplingParams, Tokenizer
from engine.model.dtypes import default_dtype
from engine.quant import ArtifactError, kernel_variants, use_kernels
from engine.runtime.batch import DecodeBatch
from engine.runtime.builder import build_model
from engine.runtime.cache_pool import CachePool, Lease, required_lease
from engine.runtime.compiled import check_step, default_step
from engine.runtime.loader import ModelSource, ModelSourceError, open_model_source
from engine.runtime.memory import (
    GIB,
    MemoryPlan,
    MemoryPlanError,
    check_ram,
    dequantize_workspace_bytes,
    module_bytes,
    plan_memory,
)
from engine.runtime.prefix_cache import PrefixCache
from engine.runtime.sampling import Sampler
from engine.runtime.state import move_row, restore_snapshot, transfer
from engine.runtime.torch_thread import TorchThread

# Everything `Engine.load` raises for weights, plans or settings it cannot serve: a CLI shows the message.
LOAD_ERRORS = (
    MemoryPlanError,
    ModelSourceError,
    CheckpointError,
    ConfigError,
    ArtifactError,
    KernelUnavailable,
    KernelSelectionError,
)

FIRST_CACHE_EXTRA_TOKENS = 512  # a new sequence's first cache holds the prompt plus this much output
DEFAULT_PREFILL_CHUNK = 2048


class EngineBusy(RuntimeError):
    """Not enough free memory for another sequence right now (others hold it)."""


@dataclass
class PromptBatch:
    """A batch of prompts of equal length in flight (the server uses one prompt per sequence)."""

    prompt_ids: list[list[int]]
    max_new_tokens: int
    lease: Lease | None  # its own cache; None once it joined the decode batch
    reservation: int
    pending: torch.Tensor  # [B, T] prompt tokens not prefilled yet
    cached_tokens: int = 0  # prompt tokens restored from the prefix cache
    logits: torch.Tensor | None = None  # [B, vocab] for the next token
    last_tokens: torch.Tensor | None = None  # sampled but not yet fed to the model
    generated: list[list[int]] = field(default_factory=list)

    @property
    def held(self) -> Lease:
        """Its own cache's lease, while it has one."""
        return required_lease(self.lease, "the sequence joined the decode batch: it has no cache of its own")

    @property
    def batch_size(self) -> int:
        return len(self.prompt_ids)

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids[0])

    @property
    def prefilled(self) -> bool:
        return self.pending.shape[1] == 0

    @property
    def capacity(self) -> int:
        """Tokens the cache must hold at most: the prompt and every generated token but the last."""
        return self.prompt_len + self.max_new_tokens - 1


class Engine:
    def __init__(
        self,
        model: KimiLinearForCausalLM,
        tokenizer: Tokenizer,
        source: ModelSource,
        plan: MemoryPlan,
        cap: MemoryCap,
        *,
        cuda_graphs: bool,
        step: str = "eager",
        kda_kernel: str,
        prefix_cache: PrefixCache | None,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.source = source
        self.plan = plan
        self.cap = cap
        self.kda_kernel = kda_kernel
        self.prefix_cache = prefix_cache
        self.step = step
        self.pool = CachePool(
            model,
            max_context=plan.max_context,
            budget_bytes=plan.cache_budget_bytes,
            cuda_graphs=cuda_graphs,
            compiled=step == "compiled",
        )
        self.batch = DecodeBatch(self.pool)

    # ------------------------------------------------------------------ loading

    @classmethod
    def load(
        cls,
        *,
        weights: str | Path | None = None,
        synthetic: str | None = None,
        seed: int = 0,
        quant: str | None = None,
        kernels: dict[str, str] | None = None,
        verify: bool = True,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        memory_cap_gib: float | None = None,
        max_context: int = 32768,
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
        cuda_graphs: bool = True,
        step: str | None = None,
        kda_kernel: str = "auto",
        prefix_cache_gib: float | None = None,
        progress: bool = False,
    ) -> Engine:
        """Plan memory, refuse what cannot fit (MemoryPlanError), then build the model under the cap
        (engine/runtime/builder.py: weight format, kernels, KDA prefill kernel, inference form).

        `weights` is a checkpoint or an INT4 artifact directory (verified first unless `verify=False`);
        `synthetic` a preset, quantised in memory by the plan `quant` when given. `kernels` (op ->
        variant) chooses a packed model's kernels, resolved and bound once here. `device` defaults to CUDA
        when available; `dtype` to `engine.model.dtypes.default_dtype` (BF16 on a GPU and on CPUs with
        native BF16, else FP32). CUDA graphs are used only on a GPU. `step` is the decode step, "eager" or
        "compiled" (Inductor, once per batch size; engine/runtime/compiled.py), default `KIMI_DECODE_STEP` or the
        device's shipped default. Prefix snapshots get `prefix_cache_gib` (default 4 on a GPU, in host
        memory outside the cap; 1 on the CPU, inside it; 0 turns the prefix cache off).
        """
        env_selection()  # a KIMI_KERNELS typo is refused before anything is read, dense or not
        source = open_model_source(weights=weights, synthetic=synthetic, seed=seed, quant=quant)
        device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        step = check_step(step) if step is not None else default_step(device.type)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if device.type == "cpu":
            flush_denormals()  # on this thread and its OpenMP workers, which the model's work runs on
        dtype = dtype or default_dtype(device)
        on_gpu = device.type == "cuda"
        if prefix_cache_gib is None:
            prefix_cache_gib = 4.0 if on_gpu else 1.0
        prefix_bytes = int(prefix_cache_gib * GIB)
        if on_gpu:
            baseline = torch.cuda.memory_allocated(device)
        else:
            baseline = psutil.Process(os.getpid()).memory_info().rss
        structure = source.meta_model(dtype)  # packed modules at their stored sizes
        plan = plan_memory(
            source.config,
            dtype,
            weights_bytes=module_bytes(structure),
            dequantize_bytes=dequantize_workspace_bytes(structure),
            cap_bytes=None if memory_cap_gib is None else int(memory_cap_gib * GIB),
            max_context=max_context,
            prefill_chunk=prefill_chunk,
            baseline_bytes=baseline,
            prefix_cache_bytes=0 if on_gpu else prefix_bytes,
            scores_materialized=not on_gpu,
        )
        if not on_gpu:  # also under a cap: one larger than the machine's RAM does not make the plan fit
            check_ram(plan)
        cap = MemoryCap(memory_cap_gib, device=str(device), poll_s=0.1)
        cap.__enter__()
        try:
            built = build_model(
                source,
                device=device,
                dtype=dtype,
                kernels=kernels,
                kda_kernel=kda_kernel,
                verify=verify,
                progress=progress,
            )
            tokenizer = source.tokenizer()
        except BaseException:
            cap.__exit__(None, None, None)
            raise
        prefix = PrefixCache(prefix_bytes, device="cpu" if on_gpu else device) if prefix_bytes > 0 else None
        return cls(
            built.model,
            tokenizer,
            source,
            plan,
            cap,
            cuda_graphs=cuda_graphs and on_gpu,
            step=step,
            kda_kernel=built.kda_kernel,
            prefix_cache=prefix,
        )

    def close(self) -> None:
        self.cap.__exit__(None, None, None)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def max_context(self) -> int:
        return self.plan.max_context

    @property
    def kernel_variants(self) -> dict[str, str]:
        """The variant bound for every kernel operation the model calls ({} for a dense model)."""
        return kernel_variants(self.model)

    def use_kernels(self, kernels: dict[str, str] | None) -> dict[str, str]:
        """Re-bind a packed model's kernels (op -> variant; None: the defaults) and drop the idle caches,
        whose CUDA graphs hold the old ones. Only between sequences. Returns `kernel_variants`."""
        if self.pool.in_use_bytes:
            raise RuntimeError("re-bind kernels only while no sequence is in flight")
        if kernels and not self.kernel_variants:
            raise ValueError("kernel selections apply to quantised weights; this model is dense")
        variants = use_kernels(self.model, kernels)
        self.pool.drop_idle()
        return variants

    def warm_up(self, tokens: int = 2 * FIRST_CACHE_EXTRA_TOKENS, batch: int = 1) -> float | None:
        """Build (compile, capture) the decode runner of a sequence of `tokens` tokens now, and keep it
        idle for the first request; returns its compile seconds (None for an eager step)."""
        capacity = self.pool.capacity_for(min(tokens, self.max_context))
        nbytes = self.pool.bytes_for(capacity, batch)
        if not self.pool.reserve(nbytes):
            raise EngineBusy("no memory to warm up a decode runner")
        try:
            lease = self.pool.take(capacity, batch)
            self.pool.give_back(lease)
        finally:
            self.pool.unreserve(nbytes)
        return lease.decoder.compile_s

    # ------------------------------------------------------------------ step-wise API

    def start(
        self, prompt_ids: Iterable[Iterable[int]], max_new_tokens: int, *, batched: bool = False
    ) -> PromptBatch:
        """Admit prompts of equal length that will generate up to `max_new_tokens` each: reserve memory,
        take a cache, and restore the longest kept prefix. `batched`: the sequence will `join` the decode
        batch, so its own cache is only prefilled into (no decode runner is built for it). Raises
        EngineBusy when memory is held by others (try again later), ValueError for prompts that can
        never fit."""
        prompts = [list(p) for p in prompt_ids]
        length = len(prompts[0]) if prompts else 0
        if not length or any(len(p) != length for p in prompts):
            raise ValueError("give one or more non-empty prompts of equal length")
        if max_new_tokens < 1:
            raise ValueError("max_new_tokens must be at least 1")
        vocab = self.model.config.vocab_size
        if any(not 0 <= t < vocab for p in prompts for t in p):
            raise ValueError(f"prompt token ids must be in 0..{vocab - 1}")
        total = length + max_new_tokens - 1
        if total > self.max_context:
            raise ValueError(
                f"{length} prompt tokens + {max_new_tokens} new tokens exceed the max context of {self.max_context}"
            )
        batch = len(prompts)
        first = min(total, length + FIRST_CACHE_EXTRA_TOKENS)
        reservation = self.pool.reservation_for(first, total, batch)
        if not self.pool.reserve(reservation):
            raise EngineBusy("no memory for another sequence until one finishes")
        lease = None
        try:
            lease = self.pool.take(first, batch, decoding=not batched)
            pending = torch.tensor(prompts, dtype=torch.long, device=self.device)
            seq = PromptBatch(prompts, max_new_tokens, lease, reservation, pending)
            if batch == 1 and self.prefix_cache is not None:
                self._restore_prefix(seq, self.prefix_cache)
        except BaseException:
            if lease is not None:
                self.pool.give_back(lease)
            self.pool.unreserve(reservation)
            raise
        return seq

    def _restore_prefix(self, seq: PromptBatch, prefix_cache: PrefixCache) -> None:
        snapshot = prefix_cache.lookup(seq.prompt_ids[0])
        if snapshot is None:
            return
        restore_snapshot(snapshot, seq.held.cache)
        seq.cached_tokens = snapshot.length
        seq.pending = seq.pending[:, snapshot.length :]
        if seq.prefilled and snapshot.logits is not None:  # the very same prompt again: its logits were kept
            seq.logits = snapshot.logits.to(self.device, copy=True)

    def prefill_step(self, seq: PromptBatch, max_tokens: int | None = None) -> bool:
        """Prefill the next chunk of the prompt (at most `max_tokens`, default and at most the planned
        chunk); True once the whole prompt is in the cache."""
        if not seq.prefilled:
            size = self.plan.prefill_chunk if max_tokens is None else min(max_tokens, self.plan.prefill_chunk)
            chunk = seq.pending[:, :size]
            seq.pending = seq.pending[:, chunk.shape[1] :]
            seq.logits = self.model.prefill(chunk, seq.held.cache)
            self.cap.check()
            self._keep_prompt(seq)
        return seq.prefilled

    def prefill_together(self, seqs: list[PromptBatch], tokens: int) -> bool:
        """`prefill_step(seq, tokens)` for every one of several one-prompt sequences at once: one forward
        pass over a cache of len(seqs) rows, their states copied in and back out (a few MB; nothing is
        recomputed). Their caches must hold the same number of tokens, and each must have `tokens`
        pending; `len(seqs) * tokens` is at most the planned prefill chunk. False, with nothing done,
        when the memory for that cache is not free now (prefill them one by one then)."""
        length = seqs[0].held.cache.length if seqs else 0
        if not seqs or any(s.batch_size != 1 or s.held.cache.length != length for s in seqs):
            raise ValueError("prefill together one-prompt sequences whose caches hold the same length")
        if len(seqs) * tokens > self.plan.prefill_chunk:
            raise ValueError(
                f"{len(seqs)} x {tokens} tokens exceed the prefill chunk of {self.plan.prefill_chunk}"
            )
        if tokens < 1 or any(s.pending.shape[1] < tokens for s in seqs):
            raise ValueError(f"every sequence prefilled together needs {tokens} pending prompt tokens")
        capacity = self.pool.capacity_for(length + tokens)
        nbytes = self.pool.bytes_for(capacity, len(seqs))
        if not self.pool.reserve(nbytes):
            return False
        lease = None
        try:
            lease = self.pool.take(capacity, len(seqs), decoding=False)
            group = lease.cache
            for row, seq in enumerate(seqs):
                move_row(seq.held.cache, None, length, group, row)
            group.length = length
            logits = self.model.prefill(torch.cat([s.pending[:, :tokens] for s in seqs]), group)
            self.cap.check()
            for row, seq in enumerate(seqs):
                move_row(group, row, length + tokens, seq.held.cache, 0)
                seq.held.cache.length = length + tokens
                seq.pending = seq.pending[:, tokens:]
                seq.logits = logits[row : row + 1]
                self._keep_prompt(seq)
        finally:
            if lease is not None:
                self.pool.give_back(lease)
            self.pool.unreserve(nbytes)
        return True

    def _keep_prompt(self, seq: PromptBatch) -> None:
        """Once a one-prompt sequence is prefilled, keep its state in the prefix cache for the next turn."""
        if seq.prefilled and seq.batch_size == 1 and self.prefix_cache is not None and seq.logits is not None:
            self.prefix_cache.store(seq.prompt_ids[0], seq.held.cache, seq.logits)

    def next_token(self, seq: PromptBatch, sampler: Sampler) -> list[int]:
        """Feed the previously sampled tokens (one decode step) and sample the next ones, one per prompt."""
        if not seq.prefilled or seq.logits is None:
            raise RuntimeError("prefill the prompt before decoding")
        if len(seq.generated) >= seq.max_new_tokens:
            raise RuntimeError(f"the sequence was admitted for {seq.max_new_tokens} new tokens")
        if seq.last_tokens is not None:
            self._grow_if_full(seq)
            seq.logits = seq.held.decoder.step(seq.last_tokens)
        tokens = sampler(seq.logits, self._columns(seq) if sampler.logits_processor is not None else [])
        seq.last_tokens = tokens
        ids = tokens.tolist()
        seq.generated.append(ids)
        return ids

    @staticmethod
    def _columns(seq: PromptBatch) -> list[list[int]]:
        """Each prompt's generated tokens (rebuilt per token: only for a logits processor, which needs them)."""
        return [list(col) for col in zip(*seq.generated, strict=True)] or [[] for _ in seq.prompt_ids]

    def join(self, newcomers: list[tuple[PromptBatch, Sampler]]) -> int:
        """Move prefilled one-prompt sequences whose first tokens are sampled (`next_token`) into the
        decode batch, in order; returns how many joined (the rest: no memory now, try after a step)."""
        if any(seq.batch_size != 1 or not seq.generated for seq, _ in newcomers):
            raise ValueError("join one prompt after prefill and its first token")
        return self.batch.join(newcomers)

    def decode_batch(self) -> list[tuple[PromptBatch, int]]:
        """One decode step for every joined sequence: (sequence, its next token) each."""
        if not self.batch.members:
            return []
        stepped = self.batch.step()
        self.cap.check()
        return [(m.seq, token) for m, token in stepped]

    def keep_reply(self, seq: PromptBatch) -> None:
        """Prefix-cache a joined sequence's state after its reply, so a next turn that resends the prompt
        and the reply prefills only what follows (the last token is not in the cache: nothing fed it)."""
        member = self.batch.member(seq)
        if self.prefix_cache is None or member is None or member.logits is None:
            return
        ids = seq.prompt_ids[0] + [g[0] for g in seq.generated[:-1]]
        self.prefix_cache.store(ids, self.batch.held.cache, member.logits.unsqueeze(0), row=member.row)

    def release(self, seq: PromptBatch) -> None:
        """Give the sequence's cache (or its batch row) back and drop its reservation (at once: used on
        cancellation too)."""
        if seq.lease is not None:
            self.pool.give_back(seq.lease)
            seq.lease = None
        if self.batch.member(seq) is not None:
            self.batch.leave(seq)
        self.pool.unreserve(seq.reservation)
        seq.reservation = 0

    def _grow_if_full(self, seq: PromptBatch) -> None:
        cache = seq.held.cache
        if cache.length < cache.max_len:
            return
        bigger = self.pool.take(min(seq.capacity, 2 * cache.max_len), seq.batch_size)
        transfer(cache, bigger.cache)
        self.pool.give_back(seq.held)
        seq.lease = bigger

    # ------------------------------------------------------------------ whole-call API (benchmarks, tests)

    def prefill(self, prompt_ids: Iterable[Iterable[int]], *, max_new_tokens: int = 1) -> PromptBatch:
        """Admit and prefill prompts (all chunks); the logits of the next token are in `seq.logits`."""
        seq = self.start(prompt_ids, max_new_tokens)
        while not self.prefill_step(seq):
            pass
        return seq

    def decode(
        self,
        seq: PromptBatch,
        n: int,
        params: SamplingParams | None = None,
        *,
        sampler: Sampler | None = None,
        on_token: Callable[[int, list[int]], None] | None = None,
    ) -> list[list[int]]:
        """Generate `n` tokens per prompt (stop tokens are not checked: the benchmark form). `on_token(i,
        ids)` is called right after token i is on the host, for per-token timing."""
        sampler = sampler or Sampler(params or SamplingParams(), self.device)
        for i in range(n):
            ids = self.next_token(seq, sampler)
            if on_token is not None:
                on_token(i, ids)
        return [list(col) for col in zip(*seq.generated[-n:], strict=True)]

    # ------------------------------------------------------------------ reporting

    def memory_report(self) -> dict:
        """Sizes in GiB: weights, sequence caches (in use, idle for reuse, reserved, budget), prefix
        snapshots, and the peak measured by the cap (allocator peak on a GPU, resident peak on the CPU)."""
        gib = lambda n: None if n is None else n / GIB
        pool = self.pool.stats()
        cap = self.cap.report()
        report = {
            "weights_gib": gib(self.plan.weights_bytes),
            "cache_in_use_gib": gib(pool["in_use_bytes"]),
            "cache_idle_gib": gib(pool["idle_bytes"]),
            "cache_reserved_gib": gib(pool["reserved_bytes"]),
            "cache_budget_gib": gib(pool["budget_bytes"]),
            "cache_bytes_per_token": self.plan.cache_bytes_per_token,
            "graphs_captured": pool["graphs_captured"],
            "steps_compiled": pool["steps_compiled"],
            "peak_gib": cap.get("peak_allocated_gib", cap["peak_rss_gib"]),
            "cap": cap,
            "plan": self.plan.as_dict(),
        }
        if self.prefix_cache is not None:
            report["prefix_cache"] = self.prefix_cache.stats()
        if self.device.type == "cuda":
            report["allocated_gib"] = gib(torch.cuda.memory_allocated(self.device))
        return report


def load_on_own_thread(**options) -> tuple[TorchThread, Engine]:
    """`Engine.load(**options)` with a progress bar, on a new TorchThread: the thread that then warms the
    engine up and runs its Scheduler, so loading, compiling and serving share one OpenMP pool
    (torch_thread.py). If loading fails, the thread is closed and the error raised here."""
    torch_thread = TorchThread()
    try:
        return torch_thread, torch_thread.call(Engine.load, progress=True, **options)
    except BaseException:
        torch_thread.close()
        raise
