"""The MoE router after its gate matmul as one Triton kernel, and its reference (the model's eager code).

    scores  = sigmoid(logits)                          logits [N, E] FP32 (x @ W_gate^T)
    ids     = top-k of (scores + correction_bias)      ids [N, k] int64, best first (torch.topk's order)
    weights = scores[ids] / (sum + 1e-20) * scaling    weights [N, k] FP32 (sum only when renormalising)

With ``shared_slot`` a last column (slot k) routes every token to that expert-bank slot with weight 1:
the packed bank's route table with its shared expert (engine/quant/packed.py), built here instead of
by four more launches (two concatenations and their fills).

The eager form is eight launches (sigmoid, the bias add, topk, gather, sum, eps add, div, scaling); one
program per token here, holding its E scores in registers, picking the k best by repeated max (ties go to the
lower expert id). It differs from the reference only in the FP32 order of the renormalising sum.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels import registry
from engine.kernels.triton_gemv import LAUNCH_DIRECTLY
from engine.model.moe import route_scores

registry.define(
    "route_topk",
    "weights[N,k(+1)], ids[N,k(+1)] = top-k of sigmoid(logits[N,E]) + bias, renormalised, scaled (+ shared slot)",
)


def _outputs(logits, top_k, shared_slot, out, ids):
    n, experts = logits.shape
    slots = top_k + (shared_slot is not None)
    if logits.dtype != torch.float32 or not 0 < top_k <= experts:
        raise ValueError(
            f"route_topk: logits must be [N, E] FP32 with E >= top_k={top_k}, got {logits.dtype}"
        )
    if out is None:
        out = torch.empty(n, slots, dtype=torch.float32, device=logits.device)
    if ids is None:
        ids = torch.empty(n, slots, dtype=torch.long, device=logits.device)
    return out, ids


@registry.register("route_topk", "reference", backend="torch", description="the model's eager router")
def route_topk_reference(logits, bias, top_k, renormalize, scaling, *, shared_slot=None, out=None, ids=None):
    """Returns ``out`` (the weights); the expert ids go to ``ids`` (allocated when not given)."""
    out, ids = _outputs(logits, top_k, shared_slot, out, ids)
    weights, chosen = route_scores(logits, bias, top_k, renormalize, scaling)
    ids[:, :top_k], out[:, :top_k] = chosen, weights
    if shared_slot is not None:
        ids[:, top_k], out[:, top_k] = shared_slot, 1.0
    return out


@triton.jit
def _route_kernel(logits_ptr, bias_ptr, out_ptr, ids_ptr, E, scaling, shared_slot, TOP_K: tl.constexpr,
                  SLOTS: tl.constexpr, RENORMALIZE: tl.constexpr, BLOCK_E: tl.constexpr):  # fmt: skip
    """Grid (N,): token n's E scores in registers; the k picks are scattered to their output slots, and
    slot TOP_K (when SLOTS > TOP_K) is the shared expert's."""
    n = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, BLOCK_E)
    live = e < E
    scores = tl.sigmoid(tl.load(logits_ptr + n * E + e, mask=live, other=0.0))
    ranked = tl.where(live, scores + tl.load(bias_ptr + e, mask=live, other=0.0), float("-inf"))
    slot = tl.full([BLOCK_E], -1, dtype=tl.int32)
    for j in tl.static_range(TOP_K):
        best = tl.max(ranked, axis=0)
        pick = tl.min(tl.where(ranked == best, e, BLOCK_E), axis=0)
        slot = tl.where(e == pick, j, slot)
        ranked = tl.where(e == pick, float("-inf"), ranked)
    chosen = slot >= 0
    weights = scores
    if RENORMALIZE:
        weights = scores / (tl.sum(tl.where(chosen, scores, 0.0), axis=0) + 1e-20)
    tl.store(out_ptr + n * SLOTS + slot, weights * scaling, mask=chosen)
    tl.store(ids_ptr + n * SLOTS + slot, e.to(tl.int64), mask=chosen)
    if SLOTS > TOP_K:
        tl.store(out_ptr + n * SLOTS + TOP_K, 1.0)
        tl.store(ids_ptr + n * SLOTS + TOP_K, shared_slot.to(tl.int64))


def _launch(logits, bias, out, ids, top_k: int, renormalize: bool, scaling: float, shared_slot: int) -> None:
    n, experts = logits.shape
    block = triton.next_power_of_2(experts)
    _route_kernel[(n,)](
        logits, bias, out, ids, experts, scaling, shared_slot,
        TOP_K=top_k, SLOTS=out.shape[1], RENORMALIZE=renormalize, BLOCK_E=block, num_warps=max(1, min(8, block // 128)),
    )  # fmt: skip


@torch.library.custom_op("kimi::route_topk", mutates_args=("out", "ids"))
def _route_op(logits: torch.Tensor, bias: torch.Tensor, out: torch.Tensor, ids: torch.Tensor, top_k: int,
              renormalize: bool, scaling: float, shared_slot: int) -> None:  # fmt: skip
    _launch(logits, bias, out, ids, top_k, renormalize, scaling, shared_slot)


_route_op.register_fake(lambda *args: None)


@registry.register(
    "route_topk", "triton", backend="triton", description="one program per token, top-k by max"
)
def route_topk_triton(logits, bias, top_k, renormalize, scaling, *, shared_slot=None, out=None, ids=None):
    out, ids = _outputs(logits, top_k, shared_slot, out, ids)
    logits = logits.contiguous()
    shared = -1 if shared_slot is None else int(shared_slot)
    (_launch if LAUNCH_DIRECTLY[0] else torch.ops.kimi.route_topk)(
        logits, bias, out, ids, top_k, bool(renormalize), float(scaling), shared
    )
    return out
