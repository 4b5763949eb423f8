"""Mixture of experts: sigmoid router with a selection-only correction bias, stacked experts, shared expert.

Routing (transformers' KimiLinearTopkRouter, vLLM, llama.cpp and DeepSeek-V3's gate agree; see
docs/ENGINE.md for Moonshot's remote code, which differs):
    scores  = sigmoid(x @ W_gate^T)                 (FP32)
    chosen  = top-k of (scores + e_score_correction_bias)
    weights = scores[chosen] / (sum + 1e-20) * routed_scaling_factor
    out     = sum_j weights_j * expert_j(x) + shared_expert(x)
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from engine.model.config import KimiLinearConfig
from engine.model.mlp import MLP
from engine.model.paths import takes_decode_path

# Prefill: while no expert has more rows than this, the experts run as one zero-padded batched product;
# beyond it, one matmul per expert (enough rows each that a call's overhead no longer dominates).
PADDED_MAX_ROWS = 64


class Router(nn.Module):
    """Checkpoint names `gate.weight` and `gate.e_score_correction_bias`; both kept in FP32."""

    def __init__(self, cfg: KimiLinearConfig, *, device=None):
        super().__init__()
        self.top_k = cfg.num_experts_per_token
        self.renormalize = cfg.moe_renormalize
        self.scaling = cfg.routed_scaling_factor
        self.weight = nn.Parameter(
            torch.empty(cfg.num_experts, cfg.hidden_size, dtype=torch.float32, device=device)
        )
        self.e_score_correction_bias = nn.Parameter(
            torch.empty(cfg.num_experts, dtype=torch.float32, device=device)
        )
        # A fused ``route_topk`` variant (engine/kernels/triton_router.py) on a GPU, or None: eager. With
        # it, `shared_slot` (when set) is appended to every token's routes with weight 1 (a packed bank's
        # shared expert, engine/kernels/fused.py).
        self.kernel: Callable | None = None
        self.shared_slot: int | None = None
        # Bound with the fused router: a ``w16a16_gemv`` variant that reads x in its own dtype and the FP32
        # weight, for the decode logits (one launch; eager casts x to FP32 first, a second).
        self.logits_kernel: Callable | None = None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, hidden] -> (expert_weights [N, k] FP32, expert_ids [N, k] int64)."""
        if self.logits_kernel is not None and takes_decode_path(x.shape[0]):
            logits = self.logits_kernel(x, self.weight, out_dtype=torch.float32)
        else:
            logits = F.linear(x.float(), self.weight)
        bias = self.e_score_correction_bias
        if self.kernel is None:
            return route_scores(logits, bias, self.top_k, self.renormalize, self.scaling)
        slots = self.top_k + (self.shared_slot is not None)
        ids = torch.empty(logits.shape[0], slots, dtype=torch.long, device=logits.device)
        weights = self.kernel(
            logits, bias, self.top_k, self.renormalize, self.scaling, shared_slot=self.shared_slot, ids=ids
        )
        return weights, ids


def route_scores(
    logits: torch.Tensor, bias: torch.Tensor, top_k: int, renormalize: bool, scaling: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The router after its matmul: logits [N, E] FP32 -> (weights [N, k] FP32, expert ids [N, k] int64)."""
    scores = torch.sigmoid(logits)
    expert_ids = torch.topk(scores + bias, top_k, dim=-1).indices
    weights = scores.gather(-1, expert_ids)
    if renormalize:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    return weights * scaling, expert_ids


def expert_ffn(
    x: torch.Tensor,
    expert_ids: torch.Tensor,
    expert_weights: torch.Tensor,
    w1: torch.Tensor,
    w3: torch.Tensor,
    w2: torch.Tensor,
) -> torch.Tensor:
    """sum_j expert_weights[n, j] * w2[e](silu(w1[e] x_n) * w3[e] x_n), e = expert_ids[n, j].

    x [N, hidden]; expert_ids / expert_weights [N, k]; w1, w3 [E, inter, hidden]; w2 [E, hidden, inter].
    Returns [N, hidden] in x's dtype, accumulated in FP32. This is the one function an alternative expert
    kernel replaces.

    Tokens that take the decode path (engine/model/paths.py draws the line) (decode, one row or a
    continuous batch): N * k expert slots, each slot one expert's matrix-vector products for one row
    (`_expert_ffn_gathered`). The shapes depend only on N and k, so the step is CUDA-graph capturable and
    compiles once per batch size; and Inductor turns each slot's matrix-vector product into one loop that
    reads the chosen expert's weights in place (a batched product with a single column), so no expert is
    copied. A union of the rows' experts written in torch (each distinct expert once, N columns) has
    products of N columns: Inductor then copies the gathered experts out and calls a GEMM, which measured
    15x slower at 4 rows on the CPU; on the CPU the runtime binds the registry's C++ grouped kernels
    instead (`ExpertBank.bind_decode_kernels`), which read each chosen expert once for all the rows that
    chose it. Many (prefill): sort assignments by expert (a host
    read of the counts); up to PADDED_MAX_ROWS rows per expert, one zero-padded batched product for all
    experts, else one matmul per expert that has tokens.
    """
    if takes_decode_path(expert_ids.shape[0]):
        return _expert_ffn_gathered(x, expert_ids, expert_weights, w1, w3, w2)
    counts = torch.bincount(expert_ids.reshape(-1), minlength=w1.shape[0])
    per_expert = counts.tolist()  # the host read of the counts, for either path
    if max(per_expert) <= PADDED_MAX_ROWS:
        return _expert_ffn_padded(x, expert_ids, expert_weights, counts, max(per_expert), w1, w3, w2)
    # unbind, not w1[e]: one view per expert whose backward stacks the experts' gradients once, where
    # indexing's backward writes each expert's gradient into a zero-filled copy of the whole bank.
    banks = tuple(zip(w1.unbind(0), w3.unbind(0), w2.unbind(0), strict=True))
    return grouped_expert_ffn(
        x, expert_ids, expert_weights, w1.shape[0], banks.__getitem__, counts=per_expert
    )


def _expert_ffn_padded(x, expert_ids, expert_weights, counts, most, w1, w3, w2):
    """Every expert's rows in one batched product: rows sorted by expert into [E, max rows, hidden], zero
    padded. Three calls in all, where one matmul per expert pays a call's overhead for a few rows each."""
    top_k = expert_ids.shape[1]
    flat = expert_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    expert_of = flat[order]
    slot = torch.arange(order.numel(), device=x.device) - (torch.cumsum(counts, 0) - counts)[expert_of]
    xs = x.new_zeros(w1.shape[0], most, x.shape[-1])
    xs[expert_of, slot] = x[order // top_k]
    hidden = F.silu(torch.bmm(xs, w1.transpose(1, 2))) * torch.bmm(xs, w3.transpose(1, 2))
    out = torch.bmm(hidden, w2.transpose(1, 2))[expert_of, slot].float()
    return _combine(out, order, expert_ids, expert_weights, x.dtype)


def _combine(out: torch.Tensor, order: torch.Tensor, expert_ids, expert_weights, dtype) -> torch.Tensor:
    """The outputs of the assignments sorted by `order` (FP32), weighted by their router weights and
    summed per token, in `dtype`."""
    n_tokens, top_k = expert_ids.shape
    out *= expert_weights.reshape(-1)[order].unsqueeze(-1)
    total = torch.zeros(n_tokens, out.shape[-1], dtype=torch.float32, device=out.device)
    return total.index_add_(0, order // top_k, out).to(dtype)


def _expert_ffn_gathered(x, expert_ids, expert_weights, w1, w3, w2):
    n_tokens, top_k = expert_ids.shape
    ids = expert_ids.reshape(-1)
    xs = x.unsqueeze(1).expand(-1, top_k, -1).reshape(-1, x.shape[-1], 1)  # [N*k, hidden, 1]
    hidden = F.silu(torch.bmm(w1[ids], xs)) * torch.bmm(w3[ids], xs)
    out = torch.bmm(w2[ids], hidden).view(n_tokens, top_k, -1)
    return _weighted_sum(out, expert_weights, x.dtype)


def _weighted_sum(out: torch.Tensor, expert_weights: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Each row's expert outputs [N, k, hidden] weighted by its router weights [N, k] and summed in FP32."""
    return (out.float() * expert_weights.unsqueeze(-1)).sum(1).to(dtype)


def grouped_expert_ffn(
    x: torch.Tensor,
    expert_ids: torch.Tensor,
    expert_weights: torch.Tensor,
    num_experts: int,
    expert_matrices: Callable[[int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    *,
    counts: list[int] | None = None,
) -> torch.Tensor:
    """The many-token form of `expert_ffn`: assignments sorted by expert, one matmul per expert that has
    tokens. `expert_matrices(e)` returns expert e's dense (w1, w3, w2); a packed bank dequantises there.
    Reads the per-expert counts on the host (a sync; `counts` when the caller has read them), so it is
    for prefill, not a captured decode step."""

    def run(expert: int, rows: torch.Tensor) -> torch.Tensor:
        w1, w3, w2 = expert_matrices(expert)
        return F.linear(F.silu(F.linear(rows, w1)) * F.linear(rows, w3), w2)

    return grouped_expert_rows(x, expert_ids, expert_weights, num_experts, run, counts=counts)


def grouped_expert_rows(
    x: torch.Tensor,
    expert_ids: torch.Tensor,
    expert_weights: torch.Tensor,
    num_experts: int,
    run_expert: Callable[[int, torch.Tensor], torch.Tensor],
    *,
    counts: list[int] | None = None,
) -> torch.Tensor:
    """`grouped_expert_ffn` for any weight format: `run_expert(e, rows [n, hidden])` returns expert e's
    output for the rows routed to it (e.g. through a W4A16 kernel, without a dense matrix)."""
    flat_ids = expert_ids.reshape(-1)
    order = torch.argsort(flat_ids, stable=True)
    if counts is None:
        counts = torch.bincount(flat_ids, minlength=num_experts).tolist()
    # split and cat, not slice assignment: under autograd a slice's backward zero-fills the whole input
    # once per expert (training spent a third of its step there); split's backward concatenates once.
    rows = x[order // expert_ids.shape[1]].split(counts)
    out = torch.cat([run_expert(e, r).float() for e, r in enumerate(rows) if r.shape[0]])
    return _combine(out, order, expert_ids, expert_weights, x.dtype)


class ExpertBank(nn.Module):
    """All routed experts of one layer, stacked: w1 (gate) and w3 (up) [E, inter, hidden], w2 (down)
    [E, hidden, inter]. Checkpoint tensor `experts.{e}.w1.weight` is `w1[e]`."""

    def __init__(self, cfg: KimiLinearConfig, *, dtype=None, device=None):
        super().__init__()
        e, h, i = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
        self.w1 = nn.Parameter(torch.empty(e, i, h, dtype=dtype, device=device))
        self.w3 = nn.Parameter(torch.empty(e, i, h, dtype=dtype, device=device))
        self.w2 = nn.Parameter(torch.empty(e, h, i, dtype=dtype, device=device))
        self.decode_kernels: tuple[Callable, Callable] | None = None  # (grouped SwiGLU, grouped GEMV)
        self.decode_variants: dict[str, str] = {}  # registry op -> variant bound, for receipts

    def bind_decode_kernels(
        self, variants: dict[str, str], swiglu: Callable | None = None, grouped: Callable | None = None
    ) -> None:
        """Run decode rows through the registry's dense grouped kernels (``swiglu(x, w1, w3, route_ids)``
        then ``grouped(hidden, w2, route_ids)``) from now on; none given: `expert_ffn`'s own path (the
        registry's "native" variants). `variants` (op -> variant) names what runs, for receipts."""
        self.decode_kernels = None if swiglu is None or grouped is None else (swiglu, grouped)
        self.decode_variants = dict(variants)

    def forward(
        self, x: torch.Tensor, expert_ids: torch.Tensor, expert_weights: torch.Tensor
    ) -> torch.Tensor:
        if self.decode_kernels is None or not takes_decode_path(x.shape[0]):
            return expert_ffn(x, expert_ids, expert_weights, self.w1, self.w3, self.w2)
        swiglu, grouped = self.decode_kernels
        hidden = swiglu(x.contiguous(), self.w1, self.w3, expert_ids)  # [N, k, inter]
        y = grouped(hidden, self.w2, expert_ids, out_dtype=torch.float32)  # [N, k, hidden]
        return _weighted_sum(y, expert_weights, x.dtype)


class SparseMoE(nn.Module):
    def __init__(self, cfg: KimiLinearConfig, *, dtype=None, device=None):
        super().__init__()
        self.gate = Router(cfg, device=device)
        self.experts: nn.Module = ExpertBank(cfg, dtype=dtype, device=device)  # or a packed bank
        shared = cfg.moe_intermediate_size * cfg.num_shared_experts
        self.shared_experts = MLP(cfg.hidden_size, shared, dtype=dtype, device=device) if shared else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        weights, ids = self.gate(flat)
        out = self.experts(flat, ids, weights)
        if self.shared_experts is not None:
            out = out + self.shared_experts(flat)
        return out.view_as(x)
