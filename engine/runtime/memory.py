"""Memory accounting: what the weights, a sequence's cache and a prefill chunk need, checked against a cap.

The plan is made before the weights are allocated (sizes come from the model built on the `meta` device),
so a max context that cannot fit is refused at start-up with a message saying what would. Prefill
activation memory is an estimate (an upper bound of the live tensors of the largest layer, plus a
margin); the cap itself is enforced by `common.memory_cap.MemoryCap` (the CUDA allocator's limit on a GPU,
resident memory on the CPU), so an estimate that is too low fails a request, never the machine.
"""

from __future__ import annotations

from dataclasses import dataclass

import psutil
import torch

from common.memory_cap import GIB
from engine.model import KimiLinearConfig, SequenceCache
from engine.quant import PackedExpertBank, PackedLinear

_WORKSPACE_MARGIN = 1.25  # on top of the counted live tensors: allocator rounding, small temporaries
# kda_chunked's batched phase forms decays for 16-token blocks: 4 * tokens * kda_dim elements per tensor,
# its groups capped near 2^24 of them; about 4 such fp32 tensors are live at once.
_KDA_BLOCK_ELEMENTS_CAP = 1 << 24
# engine.codec.dequantize of one matrix: int16 nibble unpacking, then FP32 codes and values and the
# result; bytes per logical weight element, an upper estimate.
_DEQUANTIZE_BYTES_PER_ELEMENT = 16


class MemoryPlanError(ValueError):
    """The requested configuration does not fit under the memory cap."""


def module_bytes(module: torch.nn.Module) -> int:
    """Bytes of a module's parameters and buffers (works on the `meta` device)."""
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def cache_bytes(config: KimiLinearConfig, dtype: torch.dtype, tokens: int, batch: int = 1) -> int:
    """Bytes of one `SequenceCache` of `tokens` slots (its layout, measured on the `meta` device)."""
    cache = SequenceCache(config, tokens, batch_size=batch, device="meta", dtype=dtype)
    return cache.nbytes + cache.slots.numel() * cache.slots.element_size()


def dequantize_workspace_bytes(model: torch.nn.Module) -> int:
    """Temporaries of the largest weight a packed model dequantises at once during prefill (works on the
    `meta` model): a `PackedLinear` given more than `DECODE_MAX_ROWS` rows, or one expert's three matrices.
    The LM head is left out: prefill gives it one row per prompt, which its GEMV takes. 0 for a dense model."""
    largest = 0
    for name, module in model.named_modules():
        if isinstance(module, PackedLinear) and name != "lm_head":
            largest = max(largest, module.out_features * module.in_features)
        elif isinstance(module, PackedExpertBank):
            _, n, half_k = module.w1_codes.shape
            largest = max(largest, 3 * n * 2 * half_k)
    return largest * _DEQUANTIZE_BYTES_PER_ELEMENT


def prefill_workspace_bytes(
    config: KimiLinearConfig,
    dtype: torch.dtype,
    chunk: int,
    context: int,
    *,
    scores_materialized: bool,
    dequantize_bytes: int = 0,
) -> int:
    """Estimated peak activation bytes of prefilling `chunk` tokens that end at position `context`.

    Layers run one after another, so the peak is the residual stream plus the largest layer's live
    tensors. MLA expands every cached latent of the context (keys and values for all heads), so its
    term grows with the context; `scores_materialized` adds the [heads, chunk, context] FP32 scores of
    an attention kernel that forms them (the CPU's), which memory-efficient GPU kernels do not.
    `dequantize_bytes` (a packed model's, `dequantize_workspace_bytes`) is live within a layer too.
    """
    b, f = dtype.itemsize, 4
    c, n, h = chunk, max(context, chunk), config.hidden_size
    residual = 4 * c * h * b
    d = config.kda_dim
    kda = (
        c * d * (8 * b + 14 * f)  # projections and conv outputs; fp32 q, k, v, g and their chunked copies
        + 2 * c * config.kda_num_heads * 64 * f  # intra-chunk scores A, M
        + 4 * min(4 * c * d, _KDA_BLOCK_ELEMENTS_CAP) * f
    )
    heads = config.num_attention_heads
    mla = (
        c * heads * config.qk_head_dim * b  # queries
        + n * heads * (config.qk_nope_head_dim + config.v_head_dim) * b  # expanded latents
        + n * heads * (config.qk_head_dim + config.v_head_dim) * b  # keys (with k_pe) and values
        + c * n  # boolean mask
        + 2 * c * heads * config.v_head_dim * b  # attention output and its projection
    )
    if scores_materialized:
        mla += 2 * heads * c * n * f
    assignments = c * config.num_experts_per_token
    moe = (
        assignments * h * (b + f)  # gathered inputs and fp32 expert outputs
        + 3 * c * config.moe_intermediate_size * b  # one expert's hidden activations (at most every token)
        + c * h * f  # fp32 combination
        + 3 * c * config.num_experts * f  # router scores
    )
    dense = 3 * c * config.intermediate_size * b
    logits = config.vocab_size * f
    return int(_WORKSPACE_MARGIN * (residual + max(kda, mla, moe, dense) + dequantize_bytes + logits))


def decode_workspace_bytes(config: KimiLinearConfig, dtype: torch.dtype, context: int) -> int:
    """Estimated temporaries of one decode step (the gathered experts dominate), kept by a CUDA graph."""
    b, f = dtype.itemsize, 4
    experts = 3 * config.num_experts_per_token * config.moe_intermediate_size * config.hidden_size * b
    scores = 3 * config.num_attention_heads * context * f
    return int(_WORKSPACE_MARGIN * (experts + scores + 2 * config.vocab_size * f))


@dataclass(frozen=True)
class MemoryPlan:
    cap_bytes: int | None  # None: nothing enforced, figures only
    baseline_bytes: int  # already in use before the engine allocates (resident memory on the CPU)
    weights_bytes: int
    prefill_workspace_bytes: int
    decode_workspace_bytes: int
    prefix_cache_bytes: int  # counted here only when snapshots live in the capped memory
    max_context: int
    prefill_chunk: int
    cache_bytes_per_token: float  # MLA latents; the KDA state is per sequence
    cache_bytes_max_context: int  # one sequence at the max context

    @property
    def fixed_bytes(self) -> int:
        return (
            self.baseline_bytes
            + self.weights_bytes
            + self.prefill_workspace_bytes
            + self.decode_workspace_bytes
            + self.prefix_cache_bytes
        )

    @property
    def cache_budget_bytes(self) -> int | None:
        """Bytes left for sequence caches under the cap (None when uncapped)."""
        return None if self.cap_bytes is None else self.cap_bytes - self.fixed_bytes

    def as_dict(self) -> dict:
        gib = lambda x: None if x is None else round(x / GIB, 4)
        return {
            "cap_gib": gib(self.cap_bytes),
            "baseline_gib": gib(self.baseline_bytes),
            "weights_gib": gib(self.weights_bytes),
            "prefill_workspace_gib": gib(self.prefill_workspace_bytes),
            "decode_workspace_gib": gib(self.decode_workspace_bytes),
            "prefix_cache_gib": gib(self.prefix_cache_bytes),
            "cache_gib_at_max_context": gib(self.cache_bytes_max_context),
            "cache_bytes_per_token": round(self.cache_bytes_per_token, 1),
            "cache_budget_gib": gib(self.cache_budget_bytes),
            "max_context": self.max_context,
            "prefill_chunk": self.prefill_chunk,
        }


def plan_memory(
    config: KimiLinearConfig,
    dtype: torch.dtype,
    *,
    weights_bytes: int,
    cap_bytes: int | None,
    max_context: int,
    prefill_chunk: int,
    baseline_bytes: int = 0,
    prefix_cache_bytes: int = 0,
    dequantize_bytes: int = 0,
    scores_materialized: bool,
) -> MemoryPlan:
    """The plan for one sequence at `max_context`; raises MemoryPlanError (saying what would fit) when
    weights + workspaces + that sequence's cache exceed the cap."""
    if max_context < 1 or prefill_chunk < 1:
        raise MemoryPlanError("max context and prefill chunk must be positive")

    def plan_for(context: int) -> MemoryPlan:
        chunk = min(prefill_chunk, context)
        one_token = cache_bytes(config, dtype, 1)
        return MemoryPlan(
            cap_bytes=cap_bytes,
            baseline_bytes=baseline_bytes,
            weights_bytes=weights_bytes,
            prefill_workspace_bytes=prefill_workspace_bytes(
                config,
                dtype,
                chunk,
                context,
                scores_materialized=scores_materialized,
                dequantize_bytes=dequantize_bytes,
            ),
            decode_workspace_bytes=decode_workspace_bytes(config, dtype, context),
            prefix_cache_bytes=prefix_cache_bytes,
            max_context=context,
            prefill_chunk=chunk,
            cache_bytes_per_token=cache_bytes(config, dtype, 2) - one_token,
            cache_bytes_max_context=cache_bytes(config, dtype, context),
        )

    def fits(p: MemoryPlan) -> bool:
        return (budget := p.cache_budget_bytes) is None or budget >= p.cache_bytes_max_context

    plan = plan_for(max_context)
    if cap_bytes is None or fits(plan):
        return plan
    total = plan.fixed_bytes + plan.cache_bytes_max_context
    needed = f"{_gib(total)} GiB (weights {_gib(weights_bytes)}"
    if baseline_bytes:
        needed += f", already in use {_gib(baseline_bytes)}"
    needed += (
        f", cache {_gib(plan.cache_bytes_max_context)}, prefill workspace {_gib(plan.prefill_workspace_bytes)}"
        f" at chunk {plan.prefill_chunk}, decode workspace {_gib(plan.decode_workspace_bytes)}"
    )
    if prefix_cache_bytes:
        needed += f", prefix cache {_gib(prefix_cache_bytes)}"
    needed += ")"
    cap = f"the memory cap of {_gib(cap_bytes)} GiB"
    smallest = plan_for(1)
    if not fits(smallest):
        raise MemoryPlanError(
            f"a context of {max_context} tokens needs {needed}, over {cap}; even one token does not fit "
            f"({_gib(smallest.fixed_bytes + smallest.cache_bytes_max_context)} GiB): raise --memory-cap-gib"
            " or load smaller weights"
        )
    low, high = 1, max_context  # fits(low), not fits(high)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(plan_for(mid)) else (low, mid)
    raise MemoryPlanError(
        f"a context of {max_context} tokens needs {needed}, over {cap}; at most {low} tokens fit "
        f"(--max-context {low}), or raise --memory-cap-gib to {_gib_up(total)}"
    )


def check_ram(plan: MemoryPlan, ram_bytes: int | None = None) -> None:
    """On the CPU without a cap: refuse, before anything is allocated, a plan larger than the machine's
    physical memory (it would only end in swapping or the OOM killer)."""
    ram = ram_bytes if ram_bytes is not None else psutil.virtual_memory().total
    total = plan.fixed_bytes + plan.cache_bytes_max_context
    if total > ram:
        raise MemoryPlanError(
            f"this model at a context of {plan.max_context} tokens needs {_gib(total)} GiB (weights "
            f"{_gib(plan.weights_bytes)}), but this machine has {_gib(ram)} GiB of RAM: use smaller weights "
            "(--synthetic small, a --quant plan) or a shorter --max-context"
        )


def _gib(n: int) -> str:
    return f"{n / GIB:.2f}"


def _gib_up(n: int) -> str:
    return f"{-(-n * 100 // GIB) / 100:.2f}"
