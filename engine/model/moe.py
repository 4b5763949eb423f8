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

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, hidden] -> (expert_weights [N, k] FP32, expert_ids [N, k] int64)."""
        scores = torch.sigmoid(F.linear(x.float(), self.weight))
        expert_ids = torch.topk(scores + self.e_score_correction_bias, self.top_k, dim=-1).indices
        weights = scores.gather(-1, expert_ids)
        if self.renormalize:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return weights * self.scaling, expert_ids


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

    One token (batch-1 decode): gather its k experts and run batched matmuls. A few tokens (batched
    decode): the union of their selections, each chosen expert read once for all rows. Both have shapes
    that depend only on N and k, so the step is CUDA-graph capturable. Many (prefill): sort assignments by
    expert and run one matmul per expert that has tokens (a host read of the counts). engine/model/paths.py
    draws the line between a few and many.
    """
    n_tokens = expert_ids.shape[0]
    if n_tokens == 1:
        return _expert_ffn_gathered(x, expert_ids, expert_weights, w1, w3, w2)
    if takes_decode_path(n_tokens):
        return _expert_ffn_union(x, expert_ids, expert_weights, w1, w3, w2)
    return grouped_expert_ffn(x, expert_ids, expert_weights, w1.shape[0], lambda e: (w1[e], w3[e], w2[e]))


def _expert_ffn_gathered(x, expert_ids, expert_weights, w1, w3, w2):
    n_tokens, top_k = expert_ids.shape
    ids = expert_ids.reshape(-1)
    xs = x.unsqueeze(1).expand(-1, top_k, -1).reshape(-1, x.shape[-1], 1)  # [N*k, hidden, 1]
    hidden = F.silu(torch.bmm(w1[ids], xs)) * torch.bmm(w3[ids], xs)
    out = torch.bmm(w2[ids], hidden).view(n_tokens, top_k, -1)
    return (out.float() * expert_weights.unsqueeze(-1)).sum(1).to(x.dtype)


def expert_union(
    expert_ids: torch.Tensor, expert_weights: torch.Tensor, num_experts: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The experts any row chose, without a host read: (union [U], weights [U, N] FP32) with U =
    min(N * k, E) fixed by the shapes. union lists each chosen expert once (sorted; the slots past the
    distinct count repeat expert 0 with weight 0) and weights[u, n] is row n's weight for union[u]."""
    n_tokens, top_k = expert_ids.shape
    size = min(n_tokens * top_k, num_experts)
    flat = expert_ids.reshape(-1)
    sorted_ids, order = torch.sort(flat, stable=True)
    first = torch.ones_like(sorted_ids, dtype=torch.bool)
    first[1:] = sorted_ids[1:] != sorted_ids[:-1]
    slot_sorted = torch.cumsum(first, 0) - 1  # union slot of each sorted assignment
    union = sorted_ids.new_zeros(size).scatter_(0, slot_sorted, sorted_ids)
    slot = torch.empty_like(slot_sorted).scatter_(0, order, slot_sorted)
    row = torch.arange(n_tokens, device=flat.device).repeat_interleave(top_k)
    weights = torch.zeros(size, n_tokens, dtype=torch.float32, device=flat.device)
    weights.index_put_((slot, row), expert_weights.reshape(-1).float(), accumulate=True)
    return union, weights


def _expert_ffn_union(x, expert_ids, expert_weights, w1, w3, w2):
    union, weights = expert_union(expert_ids, expert_weights, w1.shape[0])
    xt = x.t()  # [hidden, N]
    hidden = F.silu(torch.matmul(w1[union], xt)) * torch.matmul(w3[union], xt)  # [U, inter, N]
    out = torch.matmul(w2[union], hidden)  # [U, hidden, N]
    return torch.einsum("uhn,un->nh", out.float(), weights).to(x.dtype)


def grouped_expert_ffn(
    x: torch.Tensor,
    expert_ids: torch.Tensor,
    expert_weights: torch.Tensor,
    num_experts: int,
    expert_matrices: Callable[[int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
) -> torch.Tensor:
    """The many-token form of `expert_ffn`: assignments sorted by expert, one matmul per expert that has
    tokens. `expert_matrices(e)` returns expert e's dense (w1, w3, w2); a packed bank dequantises there.
    Reads the per-expert counts on the host (a sync), so it is for prefill, not a captured decode step."""

    def run(expert: int, rows: torch.Tensor) -> torch.Tensor:
        w1, w3, w2 = expert_matrices(expert)
        return F.linear(F.silu(F.linear(rows, w1)) * F.linear(rows, w3), w2)

    return grouped_expert_rows(x, expert_ids, expert_weights, num_experts, run)


def grouped_expert_rows(
    x: torch.Tensor,
    expert_ids: torch.Tensor,
    expert_weights: torch.Tensor,
    num_experts: int,
    run_expert: Callable[[int, torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """`grouped_expert_ffn` for any weight format: `run_expert(e, rows [n, hidden])` returns expert e's
    output for the rows routed to it (e.g. through a W4A16 kernel, without a dense matrix)."""
    n_tokens, top_k = expert_ids.shape
    flat_ids = expert_ids.reshape(-1)
    order = torch.argsort(flat_ids, stable=True)
    token_of = order // top_k
    counts = torch.bincount(flat_ids, minlength=num_experts).tolist()
    xs = x[token_of]
    out = torch.empty(order.numel(), x.shape[-1], dtype=torch.float32, device=x.device)
    begin = 0
    for expert, count in enumerate(counts):
        if count:
            out[begin : begin + count] = run_expert(expert, xs[begin : begin + count]).float()
            begin += count
    out *= expert_weights.reshape(-1)[order].unsqueeze(-1)
    total = torch.zeros(n_tokens, x.shape[-1], dtype=torch.float32, device=x.device)
    return total.index_add_(0, token_of, out).to(x.dtype)


class ExpertBank(nn.Module):
    """All routed experts of one layer, stacked: w1 (gate) and w3 (up) [E, inter, hidden], w2 (down)
    [E, hidden, inter]. Checkpoint tensor `experts.{e}.w1.weight` is `w1[e]`."""

    def __init__(self, cfg: KimiLinearConfig, *, dtype=None, device=None):
        super().__init__()
        e, h, i = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
        self.w1 = nn.Parameter(torch.empty(e, i, h, dtype=dtype, device=device))
        self.w3 = nn.Parameter(torch.empty(e, i, h, dtype=dtype, device=device))
        self.w2 = nn.Parameter(torch.empty(e, h, i, dtype=dtype, device=device))

    def forward(
        self, x: torch.Tensor, expert_ids: torch.Tensor, expert_weights: torch.Tensor
    ) -> torch.Tensor:
        return expert_ffn(x, expert_ids, expert_weights, self.w1, self.w3, self.w2)


class SparseMoE(nn.Module):
    def __init__(self, cfg: KimiLinearConfig, *, dtype=None, device=None):
        super().__init__()
        self.gate = Router(cfg, device=device)
        self.experts = ExpertBank(cfg, dtype=dtype, device=device)
        shared = cfg.moe_intermediate_size * cfg.num_shared_experts
        self.shared_experts = MLP(cfg.hidden_size, shared, dtype=dtype, device=device) if shared else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        weights, ids = self.gate(flat)
        out = self.experts(flat, ids, weights)
        if self.shared_experts is not None:
            out = out + self.shared_experts(flat)
        return out.view_as(x)
