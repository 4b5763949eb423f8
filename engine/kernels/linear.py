"""A linear layer on a :class:`LinearWeight` of any storage format, through the registry's GEMVs."""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.codec import LinearWeight
from engine.kernels import registry

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
