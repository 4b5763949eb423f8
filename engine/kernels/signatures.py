"""Argument checks and output allocation shared by every variant, so all of them accept and refuse alike.

Checks are on shapes and dtypes only (no device synchronisation), so they are safe in a decode loop.
Route ids are *not* range-checked by the Triton variants (that would need a sync): they must lie in
``[0, bank slots)``; the reference raises on a bad id.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ACTIVATION_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
SCALE_DTYPES = (torch.bfloat16, torch.float16)
PACKED_DTYPES = {"int4": torch.uint8, "int8": torch.int8}


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


@dataclass(frozen=True)
class GemvShape:
    batch: int
    n: int
    k: int


def gemv_shape(
    fmt: str, x: torch.Tensor, data: torch.Tensor, scales: torch.Tensor | None, group: int | None
) -> GemvShape:
    """Validate ``y[B, N] = x[B, K] @ W[N, K]^T`` for a weight in format ``fmt`` (int4 / int8 / dense)."""
    _require(x.ndim == 2, f"x must be [B, K], got {tuple(x.shape)}")
    _require(x.dtype in ACTIVATION_DTYPES, f"x dtype {x.dtype} is not one of {ACTIVATION_DTYPES}")
    _require(
        data.ndim == 2 and data.is_contiguous(),
        f"weight must be a contiguous [N, K'] tensor, got {tuple(data.shape)}",
    )
    k = x.shape[1]
    _check_weight(fmt, data, scales, group, k)
    _require(data.device == x.device, f"x is on {x.device} but the weight is on {data.device}")
    return GemvShape(x.shape[0], data.shape[0], k)


INT4_GROUP_MULTIPLE = 8


def _check_weight(
    fmt: str, data: torch.Tensor, scales: torch.Tensor | None, group: int | None, k: int
) -> None:
    stored_k = k // 2 if fmt == "int4" else k
    if fmt == "int4":
        _require(k % 2 == 0, f"INT4 weights need an even K, got {k}")
    _require(
        data.shape[-1] == stored_k,
        f"{fmt} weight has {data.shape[-1]} columns, expected {stored_k} for K={k}",
    )
    if fmt == "dense":
        _require(data.dtype in ACTIVATION_DTYPES, f"dense weight dtype {data.dtype} not supported")
        return
    _require(data.dtype == PACKED_DTYPES[fmt], f"{fmt} codes must be {PACKED_DTYPES[fmt]}, got {data.dtype}")
    if group is None or group <= 0 or k % group:
        raise ValueError(f"group size {group} must divide K={k}")
    # The Triton INT4 kernel scales whole 32-bit words of 8 codes: a smaller group gives wrong sums.
    _require(
        fmt != "int4" or group % INT4_GROUP_MULTIPLE == 0,
        f"INT4 group size {group} is not a multiple of {INT4_GROUP_MULTIPLE} (8 codes per 32-bit word)",
    )
    if scales is None or scales.dtype not in SCALE_DTYPES:
        raise ValueError(f"scales must be one of {SCALE_DTYPES}")
    expected = (*data.shape[:-1], k // group)
    _require(tuple(scales.shape) == expected, f"scales shape {tuple(scales.shape)}, expected {expected}")
    _require(scales.is_contiguous(), "scales must be contiguous")


@dataclass(frozen=True)
class GroupedShape:
    batch: int
    slots: int
    experts: int
    n: int
    k: int
    per_slot_input: bool  # x is [B, S, K] (down projection) rather than [B, K] shared by all slots


def grouped_shape(
    x: torch.Tensor,
    codes: torch.Tensor,
    scales: torch.Tensor | None,
    route_ids: torch.Tensor,
    group: int | None,
    fmt: str = "int4",
) -> GroupedShape:
    """Validate a grouped GEMV ``y[b, s] = x[b(, s)] @ W[route_ids[b, s]]^T`` over a bank in format
    ``fmt`` (INT4 codes + scales, or a dense bank with no scales)."""
    _require(x.ndim in (2, 3), f"x must be [B, K] or [B, S, K], got {tuple(x.shape)}")
    _require(x.dtype in ACTIVATION_DTYPES, f"x dtype {x.dtype} is not one of {ACTIVATION_DTYPES}")
    _require(x.is_contiguous(), "x must be contiguous")
    _require(
        codes.ndim == 3 and codes.is_contiguous(),
        f"the bank must be a contiguous [E, N, K'] tensor, got {tuple(codes.shape)}",
    )
    _require(route_ids.ndim == 2, f"route_ids must be [B, S], got {tuple(route_ids.shape)}")
    _require(
        route_ids.dtype in (torch.int32, torch.int64), f"route_ids must be int32/int64, got {route_ids.dtype}"
    )
    _require(route_ids.is_contiguous(), "route_ids must be contiguous")
    batch, slots = route_ids.shape
    _require(x.shape[0] == batch, f"x has batch {x.shape[0]} but route_ids has {batch}")
    if x.ndim == 3:
        _require(x.shape[1] == slots, f"x has {x.shape[1]} slots but route_ids has {slots}")
    k = x.shape[-1]
    _check_weight(fmt, codes, scales, group, k)
    _require(codes.device == x.device == route_ids.device, "x, the bank and route_ids must share a device")
    return GroupedShape(batch, slots, codes.shape[0], codes.shape[1], k, x.ndim == 3)


def dense_swiglu_shape(
    x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, route_ids: torch.Tensor
) -> GroupedShape:
    """Validate a dense grouped SwiGLU: two banks of one shape and dtype, x [B, K] shared by all slots."""
    shape = grouped_shape(x, gate, None, route_ids, None, "dense")
    _require(
        tuple(up.shape) == tuple(gate.shape) and up.dtype == gate.dtype and up.is_contiguous(),
        f"up bank {tuple(up.shape)} {up.dtype} differs from the gate bank {tuple(gate.shape)} {gate.dtype}",
    )
    _require(not shape.per_slot_input, "the gate/up projection takes x as [B, K]")
    return shape


def combine_shape(y: torch.Tensor, weights: torch.Tensor) -> tuple[int, int, int]:
    """Validate ``out[B, N] = sum_s weights[B, S] * y[B, S, N]``; returns ``(B, S, N)``."""
    _require(
        y.ndim == 3 and y.is_contiguous(), f"y must be a contiguous [B, S, N] tensor, got {tuple(y.shape)}"
    )
    _require(
        tuple(weights.shape) == tuple(y.shape[:2])
        and weights.dtype == torch.float32
        and weights.is_contiguous(),
        f"weights must be contiguous FP32 {tuple(y.shape[:2])}, got {tuple(weights.shape)} {weights.dtype}",
    )
    _require(weights.device == y.device, "y and weights must share a device")
    return y.shape[0], y.shape[1], y.shape[2]


def output(
    out: torch.Tensor | None, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """``out`` after checking it matches, or a fresh tensor; every variant writes every element."""
    if out is None:
        return torch.empty(shape, dtype=dtype, device=device)
    _require(tuple(out.shape) == shape, f"out has shape {tuple(out.shape)}, expected {shape}")
    _require(out.dtype == dtype, f"out has dtype {out.dtype}, expected {dtype}")
    _require(out.device == device and out.is_contiguous(), "out must be contiguous on the inputs' device")
    return out
