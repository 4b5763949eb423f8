"""Triton GEMV kernels for batch-1 decode (and small batches): dense INT4 / INT8 / 16-bit weights, grouped
INT4 experts over a route table, and a fused gate/up + SwiGLU.

Layout for bandwidth: weights are row-major with the reduction axis K contiguous, so each program streams
whole rows in wide (16-byte) loads; every program owns ``BLOCK_N`` output rows with a one-row FP32
accumulator per batch row; split-K spreads short-N matrices over more programs, with the partial sums
reduced in a fixed order afterwards (deterministic). Group scales are applied once per group after the
in-group reduction, which keeps the per-byte instruction count low.

Interpreter-safe (``TRITON_INTERPRET=1``): no ``tl.dot``, no block pointers, no inline asm, no autotune,
every tile dimension a power of two >= 16.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from engine.kernels.signatures import gemv_shape, grouped_shape, output
from engine.kernels.workspace import scratch

FMT_INT4, FMT_INT8, FMT_DENSE = 0, 1, 2
_FORMATS = {"int4": FMT_INT4, "int8": FMT_INT8, "dense": FMT_DENSE}


@triton.jit
def _tile_partial(
    w_ptr,
    s_ptr,
    x_ptr,
    rn,
    mask_n,
    rb,
    mask_b,
    stride_wn,
    stride_sn,
    stride_xb,
    k0,
    K,
    FMT: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """FP32 partial dot products ``[BLOCK_B, BLOCK_N]`` of inputs ``k0 .. k0+BLOCK_K`` (masked past K)."""
    if FMT == 0:
        # INT4: BLOCK_K // 2 bytes per row; byte j holds input 2j (low nibble) and 2j+1 (high nibble).
        HALF: tl.constexpr = BLOCK_K // 2
        rj = k0 // 2 + tl.arange(0, HALF)
        mask_j = rj < K // 2
        packed = tl.load(
            w_ptr + rn[:, None] * stride_wn + rj[None, :], mask=mask_n[:, None] & mask_j[None, :], other=0
        )
        packed = packed.to(tl.int8, bitcast=True)
        low = ((packed << 4) >> 4).to(tl.float32)  # arithmetic shifts sign-extend the nibbles
        high = (packed >> 4).to(tl.float32)
        x_mask = mask_b[:, None] & mask_j[None, :]
        x_even = tl.load(x_ptr + rb[:, None] * stride_xb + 2 * rj[None, :], mask=x_mask, other=0.0).to(
            tl.float32
        )
        x_odd = tl.load(x_ptr + rb[:, None] * stride_xb + 2 * rj[None, :] + 1, mask=x_mask, other=0.0).to(
            tl.float32
        )
        prod = low[None, :, :] * x_even[:, None, :] + high[None, :, :] * x_odd[:, None, :]
        PER_GROUP: tl.constexpr = GROUP // 2
    else:
        rk = k0 + tl.arange(0, BLOCK_K)
        mask_k = rk < K
        w = tl.load(
            w_ptr + rn[:, None] * stride_wn + rk[None, :], mask=mask_n[:, None] & mask_k[None, :], other=0
        )
        x = tl.load(
            x_ptr + rb[:, None] * stride_xb + rk[None, :], mask=mask_b[:, None] & mask_k[None, :], other=0.0
        )
        prod = w.to(tl.float32)[None, :, :] * x.to(tl.float32)[:, None, :]
        PER_GROUP: tl.constexpr = GROUP
    if FMT == 2:
        partial = tl.sum(prod, axis=2)
    else:
        # Sum inside each scale group first, then one multiply per group.
        GROUPS: tl.constexpr = BLOCK_K // GROUP
        grouped = tl.sum(tl.reshape(prod, [BLOCK_B * BLOCK_N * GROUPS, PER_GROUP]), axis=1)
        grouped = tl.reshape(grouped, [BLOCK_B, BLOCK_N, GROUPS])
        rg = k0 // GROUP + tl.arange(0, GROUPS)
        s_mask = mask_n[:, None] & (rg < K // GROUP)[None, :]
        scales = tl.load(s_ptr + rn[:, None] * stride_sn + rg[None, :], mask=s_mask, other=0.0).to(tl.float32)
        partial = tl.sum(grouped * scales[None, :, :], axis=2)
    return partial


@triton.jit
def _gemv_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    out_ptr,
    B,
    N,
    K,
    stride_xb,
    stride_wn,
    stride_sn,
    stride_split,
    tiles_per_split,
    FMT: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Grid (N blocks, split-K parts, batch blocks); writes ``out[split, b, n]`` (FP32 partials or final)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_b = tl.program_id(2)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rb = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)
    mask_n = rn < N
    mask_b = rb < B
    acc = tl.zeros([BLOCK_B, BLOCK_N], dtype=tl.float32)
    for t in range(0, tiles_per_split):
        k0 = (pid_k * tiles_per_split + t) * BLOCK_K
        acc += _tile_partial(
            w_ptr,
            s_ptr,
            x_ptr,
            rn,
            mask_n,
            rb,
            mask_b,
            stride_wn,
            stride_sn,
            stride_xb,
            k0,
            K,
            FMT,
            GROUP,
            BLOCK_B,
            BLOCK_N,
            BLOCK_K,
        )
    dst = out_ptr + pid_k * stride_split + rb[:, None] * N + rn[None, :]
    tl.store(dst, acc.to(out_ptr.dtype.element_ty), mask=mask_b[:, None] & mask_n[None, :])


@triton.jit
def _grouped_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    ids_ptr,
    out_ptr,
    S,
    N,
    K,
    stride_xb,
    stride_xs,
    stride_we,
    stride_se,
    stride_split,
    tiles_per_split,
    GROUP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Grid (N blocks, split-K parts, B*S assignments); each assignment reads its routed expert's rows."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_a = tl.program_id(2)
    expert = tl.load(ids_ptr + pid_a).to(tl.int64)
    b = pid_a // S
    s = pid_a % S
    x_row = x_ptr + b.to(tl.int64) * stride_xb + s.to(tl.int64) * stride_xs
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rb = tl.arange(0, 1)
    mask_n = rn < N
    mask_b = rb < 1
    acc = tl.zeros([1, BLOCK_N], dtype=tl.float32)
    for t in range(0, tiles_per_split):
        k0 = (pid_k * tiles_per_split + t) * BLOCK_K
        acc += _tile_partial(
            w_ptr + expert * stride_we,
            s_ptr + expert * stride_se,
            x_row,
            rn,
            mask_n,
            rb,
            mask_b,
            K // 2,
            K // GROUP,
            0,
            k0,
            K,
            0,
            GROUP,
            1,
            BLOCK_N,
            BLOCK_K,
        )
    dst = out_ptr + pid_k * stride_split + pid_a * N + rn[None, :]
    tl.store(dst, acc.to(out_ptr.dtype.element_ty), mask=mask_n[None, :])


@triton.jit
def _grouped_swiglu_kernel(
    x_ptr,
    wg_ptr,
    sg_ptr,
    wu_ptr,
    su_ptr,
    ids_ptr,
    out_ptr,
    S,
    N,
    K,
    stride_xb,
    stride_we,
    stride_se,
    num_tiles,
    GROUP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Grid (N blocks, B*S assignments): gate and up rows of one expert, then ``silu(gate) * up``."""
    pid_n = tl.program_id(0)
    pid_a = tl.program_id(1)
    expert = tl.load(ids_ptr + pid_a).to(tl.int64)
    x_row = x_ptr + (pid_a // S).to(tl.int64) * stride_xb
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rb = tl.arange(0, 1)
    mask_n = rn < N
    mask_b = rb < 1
    gate = tl.zeros([1, BLOCK_N], dtype=tl.float32)
    up = tl.zeros([1, BLOCK_N], dtype=tl.float32)
    for t in range(0, num_tiles):
        k0 = t * BLOCK_K
        gate += _tile_partial(
            wg_ptr + expert * stride_we,
            sg_ptr + expert * stride_se,
            x_row,
            rn,
            mask_n,
            rb,
            mask_b,
            K // 2,
            K // GROUP,
            0,
            k0,
            K,
            0,
            GROUP,
            1,
            BLOCK_N,
            BLOCK_K,
        )
        up += _tile_partial(
            wu_ptr + expert * stride_we,
            su_ptr + expert * stride_se,
            x_row,
            rn,
            mask_n,
            rb,
            mask_b,
            K // 2,
            K // GROUP,
            0,
            k0,
            K,
            0,
            GROUP,
            1,
            BLOCK_N,
            BLOCK_K,
        )
    hidden = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + pid_a * N + rn[None, :], hidden.to(out_ptr.dtype.element_ty), mask=mask_n[None, :])


# True when TRITON_INTERPRET=1 was set when this module was imported: @triton.jit reads it at decoration.
INTERPRETED = isinstance(_gemv_kernel, InterpretedFunction)


@dataclass(frozen=True)
class LaunchConfig:
    block_n: int
    block_k: int  # inputs (not bytes) per tile
    split_k: int
    num_warps: int = 4
    num_stages: int = 3


def _pow2_floor(value: int) -> int:
    return 1 << (max(value, 1).bit_length() - 1)


def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 1


def launch_config(
    fmt: str, rows: int, programs_per_block: int, n: int, k: int, group: int, device, *, split: bool = True
) -> LaunchConfig:
    """A launch configuration from the shape (no autotuning, so runs are reproducible).

    Each program step holds about 4096 FP32 products (``rows`` batch rows x ``block_n`` weight rows x the
    tile's values; INT4 counts bytes, two values each), so registers stay bounded as the batch grows.
    Split-K doubles until the grid has about four waves of programs or the splits get short.
    ``programs_per_block`` multiplies the grid (route assignments for grouped kernels).
    """
    block_n = 32 if rows <= 2 else 16
    step = _pow2_floor(4096 // (rows * block_n))
    block_k = step * 2 if fmt == "int4" else step
    block_k = min(max(block_k, 32, group), 512)
    tiles = triton.cdiv(k, block_k)
    programs = triton.cdiv(n, block_n) * programs_per_block
    target = 4 * _sm_count(torch.device(device))
    split_k = 1
    while split and programs * split_k < target and tiles // (2 * split_k) >= 2 and split_k < 16:
        split_k *= 2
    return LaunchConfig(block_n, block_k, split_k)


def _finish_split(partials: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    # Fixed-order reduction of the split-K partials: deterministic, unlike atomics.
    out.copy_(partials.sum(dim=0) if partials.shape[0] > 1 else partials[0])
    return out


def _gemv(fmt, x, data, scales, group, out, out_dtype, config: LaunchConfig | None):
    shape = gemv_shape(fmt, x, data, scales, group)
    out = output(out, (shape.batch, shape.n), out_dtype or x.dtype, x.device)
    if x.stride(1) != 1:
        x = x.contiguous()
    block_b = min(triton.next_power_of_2(shape.batch), 8)
    group = group or 1
    cfg = config or launch_config(
        fmt, block_b, triton.cdiv(shape.batch, block_b), shape.n, shape.k, group, x.device
    )
    tiles = triton.cdiv(shape.k, cfg.block_k)
    tiles_per_split = triton.cdiv(tiles, cfg.split_k)
    target = out if cfg.split_k == 1 else scratch((cfg.split_k, shape.batch, shape.n), x.device)
    grid = (triton.cdiv(shape.n, cfg.block_n), cfg.split_k, triton.cdiv(shape.batch, block_b))
    _gemv_kernel[grid](
        x,
        data,
        data if scales is None else scales,
        target,
        shape.batch,
        shape.n,
        shape.k,
        x.stride(0),
        data.stride(0),
        0 if scales is None else scales.stride(0),
        shape.batch * shape.n,
        tiles_per_split,
        FMT=_FORMATS[fmt],
        GROUP=group,
        BLOCK_B=block_b,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return out if cfg.split_k == 1 else _finish_split(target, out)


def w4a16_gemv(x, codes, scales, group_size, *, out=None, out_dtype=None, config=None):
    return _gemv("int4", x, codes, scales, group_size, out, out_dtype, config)


def w8a16_gemv(x, codes, scales, group_size, *, out=None, out_dtype=None, config=None):
    return _gemv("int8", x, codes, scales, group_size, out, out_dtype, config)


def w16a16_gemv(x, weight, *, out=None, out_dtype=None, config=None):
    return _gemv("dense", x, weight, None, None, out, out_dtype, config)


def w4a16_grouped_gemv(x, codes, scales, route_ids, group_size, *, out=None, out_dtype=None, config=None):
    shape = grouped_shape(x, codes, scales, route_ids, group_size)
    out = output(out, (shape.batch, shape.slots, shape.n), out_dtype or x.dtype, x.device)
    assignments = shape.batch * shape.slots
    cfg = config or launch_config("int4", 1, assignments, shape.n, shape.k, group_size, x.device)
    tiles = triton.cdiv(shape.k, cfg.block_k)
    tiles_per_split = triton.cdiv(tiles, cfg.split_k)
    target = out if cfg.split_k == 1 else scratch((cfg.split_k, assignments, shape.n), x.device)
    stride_xs = shape.k if shape.per_slot_input else 0
    stride_xb = shape.slots * shape.k if shape.per_slot_input else shape.k
    grid = (triton.cdiv(shape.n, cfg.block_n), cfg.split_k, assignments)
    _grouped_kernel[grid](
        x,
        codes,
        scales,
        route_ids,
        target,
        shape.slots,
        shape.n,
        shape.k,
        stride_xb,
        stride_xs,
        codes.stride(0),
        scales.stride(0),
        assignments * shape.n,
        tiles_per_split,
        GROUP=group_size,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return (
        out
        if cfg.split_k == 1
        else _finish_split(target.view(cfg.split_k, shape.batch, shape.slots, shape.n), out)
    )


def w4a16_grouped_swiglu(
    x, gate_codes, gate_scales, up_codes, up_scales, route_ids, group_size, *, out=None, config=None
):
    shape = grouped_shape(x, gate_codes, gate_scales, route_ids, group_size)
    if grouped_shape(x, up_codes, up_scales, route_ids, group_size) != shape:
        raise ValueError("gate and up banks must have the same shape")
    if shape.per_slot_input:
        raise ValueError("the gate/up projection takes x as [B, K]")
    if gate_codes.stride() != up_codes.stride() or gate_scales.stride() != up_scales.stride():
        raise ValueError("gate and up banks must share strides")
    out = output(out, (shape.batch, shape.slots, shape.n), x.dtype, x.device)
    assignments = shape.batch * shape.slots
    cfg = config or launch_config("int4", 1, assignments, shape.n, shape.k, group_size, x.device, split=False)
    grid = (triton.cdiv(shape.n, cfg.block_n), assignments)
    _grouped_swiglu_kernel[grid](
        x,
        gate_codes,
        gate_scales,
        up_codes,
        up_scales,
        route_ids,
        out,
        shape.slots,
        shape.n,
        shape.k,
        shape.k,
        gate_codes.stride(0),
        gate_scales.stride(0),
        triton.cdiv(shape.k, cfg.block_k),
        GROUP=group_size,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return out


def triton_unavailable(device_type: str) -> str | None:
    """Why these kernels cannot run on ``device_type`` now (None when they can)."""
    if device_type == "cuda":
        if not torch.cuda.is_available():
            return "CUDA is not available"
        if INTERPRETED:
            return (
                "TRITON_INTERPRET=1 was set when engine.kernels was imported, so the kernels are interpreted"
            )
        return None
    if device_type == "cpu":
        if INTERPRETED:
            return None
        return (
            "Triton kernels run on the CPU only in the interpreter; set TRITON_INTERPRET=1 before "
            "engine.kernels is imported (the kernels are compiled or interpreted when it is imported)"
        )
    return f"no Triton backend for {device_type}"
