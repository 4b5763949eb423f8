"""A linear layer on a :class:`LinearWeight` of any storage format, through the registry's GEMVs."""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.codec import LinearWeight
from engine.kernels import registry
from engine.model import KimiLinearForCausalLM, Linear
from engine.model.moe import ExpertBank

DENSE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
DENSE_EXPERT_OPS = ("w16a16_grouped_swiglu", "w16a16_grouped_gemv")  # in the order a bank calls them
GEMV_FOR_FORMAT = {"int4": "w4a16_gemv", "int8": "w8a16_gemv", "dense": "w16a16_gemv"}


def linear_fn(fmt: str, device: torch.device | str | None = None, variant: str | None = None) -> Callable:
    """Resolve once (e.g. at model load) a ``fn(x, weight, out=None, out_dtype=None)`` for weights in ``fmt``."""
    gemv = registry.get(GEMV_FOR_FORMAT[fmt], variant, device)
    if fmt == "dense":
        return lambda x, weight, **kw: gemv(x, weight.data, **kw)
    return lambda x, weight, **kw: gemv(x, weight.data, weight.scales, weight.group_size, **kw)


def linear(
    x: torch.Tensor, weight: LinearWeight, *, out_dtype: torch.dtype | None = None, variant: str | None = None
) -> torch.Tensor:
    """``x[B, K] @ weight^T`` with the selected GEMV for the weight's format (resolved on every call)."""
    return linear_fn(weight.format, x.device, variant)(x, weight, out_dtype=out_dtype)


def bind_dense_decode_gemvs(
    model: KimiLinearForCausalLM, kernels: dict[str, str] | None = None
) -> str | None:
    """On the CPU, bind the selected dense GEMVs (`kernels`, else KIMI_KERNELS, else the shipped defaults)
    for decode rows, unless they are torch's own ("native"): `w16a16_gemv` to every plain `Linear` (FP32,
    BF16 or FP16), and `w16a16_grouped_swiglu` + `w16a16_grouped_gemv` to every dense `ExpertBank`; -> the
    `w16a16_gemv` variant bound, or None (another device, or native). torch's FP32 matmul at 2 to 8 rows
    measured 2-3x slower than at one row on the CPU (a GEMM, not a GEMV, for the same bytes); the C++ GEMV
    reads each weight row once for all rows, and the grouped one each chosen expert once for all the rows
    that chose it."""
    device = model.device
    if device.type != "cpu":
        return None
    chosen = kernels or {}
    selection = registry.select("w16a16_gemv", chosen.get("w16a16_gemv"), device)
    experts = {op: registry.select(op, chosen.get(op), device).variant for op in DENSE_EXPERT_OPS}
    swiglu, grouped = experts.values()
    names = {op: v.name for op, v in experts.items()}
    bound = None
    for module in model.modules():
        if type(module) is Linear and module.weight.dtype in DENSE_DTYPES:
            if selection.variant.name == "native":  # named for receipts; torch's matmul runs
                module.bind_decode_gemv("native", None)
            else:
                module.bind_decode_gemv(selection.variant.name, selection.variant.fn)
                bound = selection.variant.name
        elif type(module) is ExpertBank and module.w1.dtype in DENSE_DTYPES:
            if "native" in names.values():  # both run as expert_ffn's own gathered path
                module.bind_decode_kernels(dict.fromkeys(names, "native"))
            else:
                module.bind_decode_kernels(names, swiglu.fn, grouped.fn)
    return bound
