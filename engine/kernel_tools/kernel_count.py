"""Kernels per decode token of a model with the CUDA kernel selection, counted on the ``meta`` device.

No GPU and no weights: the packed model is built on ``meta`` at its stored shapes, bound to the CUDA
shipped defaults (the Triton variants: GEMVs, and the fused RMSNorm, KDA step and router of
engine/kernels/fused.py), and one ``decode_tensors`` step is run under a dispatch mode that
counts the aten operations that launch a kernel (views and allocations do not) while Triton's launches are
intercepted and counted by kernel (engine/kernel_tools/aot.py's capture; split-K reductions are part of the
GEMV kernel, so they need no extra launch). An aten op is counted as one kernel, as it would launch on a
GPU in eager mode; Inductor or CUDA graphs fuse or batch some of them, so this is the eager upper bound
the fusion work is measured against.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from engine.kernel_tools.aot import SM_COUNTS, _intercepted
from engine.kernels import registry
from engine.kernels.defaults import SHIPPED_DEFAULTS
from engine.kernels.fused import use_fused_kernels
from engine.kernels.triton_gemv import direct_launches
from engine.model.config import KimiLinearConfig
from engine.quant.packed import PackedExpertBank, PackedLinear
from engine.quant.plan import Plan
from engine.quant.quantized_model import quantized_meta_model

# Aten ops that allocate or read a scalar without a device kernel (views are told apart by their schema).
_NO_KERNEL = {"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "lift_fresh",
              "_local_scalar_dense", "promote_types"}  # fmt: skip


@dataclass(frozen=True)
class KernelCount:
    aten: dict[str, int]  # aten op -> kernels per decode step
    triton: dict[str, int]  # Triton kernel -> launches per decode step

    @property
    def total(self) -> int:
        return sum(self.aten.values()) + sum(self.triton.values())


class _AtenKernels(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        result = func(*args, **(kwargs or {}))
        # `to` is marked a view (it may return its input); a dtype or device change is a copy kernel.
        converts = name == "to" and result is not args[0]
        if converts or (not func.is_view and name not in _NO_KERNEL):
            self.ops[name] += 1
        return result


def cuda_selections() -> dict[str, registry.Selection]:
    """The CUDA shipped defaults, bound without asking whether CUDA is here (nothing runs)."""
    table = SHIPPED_DEFAULTS["cuda"]
    return {
        op: registry.Selection(registry.variant(op, name), "shipped default", "cuda")
        for op, name in table.items()
    }


@torch.inference_mode()
def count_decode_kernels(cfg: KimiLinearConfig, plan: Plan, *, batch: int = 1, context: int = 16,
                         dtype: torch.dtype = torch.bfloat16, sm_count: int = SM_COUNTS[90]) -> KernelCount:  # fmt: skip
    """Kernels one decode step of ``cfg`` quantised with ``plan`` launches at ``batch`` on a GPU with
    ``sm_count`` SMs (the split-K choice depends on it), after ``context`` tokens."""
    from engine.runtime.builder import prepare_for_inference  # engine.runtime imports engine.quant

    model = quantized_meta_model(cfg, plan, dtype=dtype)
    prepare_for_inference(model)  # as the engine does at load: shared-input projections as one GEMM
    selections = cuda_selections()
    for module in model.modules():
        if isinstance(module, PackedLinear | PackedExpertBank):
            module.bind(selections)
    use_fused_kernels(model, selections)
    cache = model.new_cache(context + 1, batch_size=batch)
    cache.advance(context)
    tokens = torch.zeros(batch, dtype=torch.long, device="meta")
    aten = _AtenKernels()
    with _intercepted(sm_count) as launches, direct_launches(), aten:
        model.decode_tensors(tokens, cache)
    triton = collections.Counter(kernel.fn.__name__ for kernel, _, _ in launches)
    return KernelCount(dict(aten.ops.most_common()), dict(triton.most_common()))
