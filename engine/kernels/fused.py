"""Bind the fused decode kernels (RMSNorm, the KDA decode step, the router) to a model's dispatch points.

Each is an operation of the registry with its reference beside its Triton kernel (triton_norm.py,
triton_kda.py, triton_router.py); on CUDA the shipped default is the Triton variant, on the CPU the
reference. A fused router also takes the selected ``w16a16_gemv`` for its decode logits (x in its own
dtype against the FP32 weight: no cast kernel). A bound reference leaves the model's eager code in place (the same computation, with no
extra copy into an output buffer), so CPU runs are unchanged.
"""

from __future__ import annotations

from torch import nn

from engine.kernels import registry, triton_kda, triton_norm, triton_router  # noqa: F401  (define the operations)
from engine.kernels.registry import Selection
from engine.model.kda import KimiDeltaAttention, kda_decode_step
from engine.model.moe import Router, SparseMoE
from engine.model.norm import RMSNorm

FUSED_OPS = ("rms_norm", "kda_decode_step", "route_topk")


def use_fused_kernels(model: nn.Module, selections: dict[str, Selection]) -> dict[str, str]:
    """Bind ``selections``' variants of FUSED_OPS to every RMSNorm, KDA layer and router of ``model``;
    returns op -> variant name for the operations the model has a dispatch point for."""
    fns = {op: None if selections[op].variant.is_reference else selections[op].variant.fn for op in FUSED_OPS}
    bound: dict[str, str] = {}
    for module in model.modules():
        if isinstance(module, RMSNorm):
            module.kernel, op = fns["rms_norm"], "rms_norm"
        elif isinstance(module, KimiDeltaAttention):
            module.decode_kernel, op = fns["kda_decode_step"] or kda_decode_step, "kda_decode_step"
        elif isinstance(module, Router):
            module.kernel, op = fns["route_topk"], "route_topk"
            # The logits GEMV goes with the fused router, so CPU models (eager router) keep F.linear.
            module.logits_kernel = None if module.kernel is None else selections["w16a16_gemv"].variant.fn
        else:
            if isinstance(module, SparseMoE):
                _route_shared_slot(module, fused=fns["route_topk"] is not None)
            continue
        bound[op] = selections[op].variant.name
    return dict(sorted(bound.items()))


def _route_shared_slot(moe: SparseMoE, *, fused: bool) -> None:
    """With the fused router, a packed bank's shared slot is appended by the router kernel (the bank's
    own route table would cost four launches); unbound, the bank appends it as before."""
    bank = moe.experts
    if not hasattr(bank, "routes_include_shared"):  # a dense ExpertBank: no shared slot in it
        return
    shared = bank.shared_slot if fused else None
    moe.gate.shared_slot = shared  # type: ignore[assignment]  # nn.Module's attribute typing
    bank.routes_include_shared = shared is not None  # type: ignore[assignment]


def fused_variants(model: nn.Module) -> dict[str, str]:
    """op -> the variant of FUSED_OPS bound to ``model``'s dispatch points now ("reference": eager)."""

    def name(op: str, fn) -> str:
        if fn is None or fn is kda_decode_step:
            return registry.REFERENCE
        return next(v.name for v in registry.variants(op) if v.fn is fn)

    found: dict[str, str] = {}
    for module in model.modules():
        if isinstance(module, RMSNorm):
            found["rms_norm"] = name("rms_norm", module.kernel)
        elif isinstance(module, KimiDeltaAttention):
            found["kda_decode_step"] = name("kda_decode_step", module.decode_kernel)
        elif isinstance(module, Router):
            found["route_topk"] = name("route_topk", module.kernel)
    return dict(sorted(found.items()))
