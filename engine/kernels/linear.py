"""A linear layer on a :class:`LinearWeight` of any storage format, through the registry's GEMVs."""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.codec import LinearWeight
from engine.kernels import registry
from engine.model import KimiLinearForCausalLM, Linear

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
    """On the CPU, bind the selected `w16a16_gemv` (`kernels`, else KIMI_KERNELS, else the shipped default)
    to every plain `Linear` (FP32, BF16 or FP16) for its decode rows, unless it is torch's own matmul
    ("native"); -> the variant bound, or None (another device, or native). torch's FP32 matmul at 2 to 8
    rows measured 2-3x slower than at one row on the CPU (a GEMM, not a GEMV, for the same bytes); the C++
    GEMV reads each weight row once for all rows."""
    device = model.device
    if device.type != "cpu":
        return None
    selection = registry.select("w16a16_gemv", (kernels or {}).get("w16a16_gemv"), device)
    bound = None
    for module in model.modules():
        if type(module) is Linear and module.weight.dtype in (torch.float32, torch.bfloat16, torch.float16):
            if selection.variant.name == "native":
                module.bind_decode_gemv(None, None)
            else:
                module.bind_decode_gemv(selection.variant.name, selection.variant.fn)
                bound = selection.variant.name
    return bound
