"""Triton route-weighted combine: ``out[b, n] = sum_s weights[b, s] * y[b, s, n]`` in FP32, launched
through the torch custom op ``kimi::route_combine`` (opaque to ``torch.compile``, see triton_gemv.py)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.signatures import combine_shape, output
from engine.kernels.triton_gemv import LAUNCH_DIRECTLY


@triton.jit
def _combine_kernel(y_ptr, w_ptr, out_ptr, S, N, BLOCK_N: tl.constexpr):
    """Grid (N blocks, B); slots are summed in order, so the result is deterministic."""
    pid_n = tl.program_id(0)
    b = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = rn < N
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for s in range(0, S):
        weight = tl.load(w_ptr + b * S + s)
        acc += weight * tl.load(y_ptr + (b * S + s) * N + rn, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + b * N + rn, acc.to(out_ptr.dtype.element_ty), mask=mask)


def _launch(y: torch.Tensor, weights: torch.Tensor, out: torch.Tensor, block_n: int) -> None:
    batch, slots, n = y.shape
    _combine_kernel[(triton.cdiv(n, block_n), batch)](y, weights, out, slots, n, BLOCK_N=block_n, num_warps=4)


@torch.library.custom_op("kimi::route_combine", mutates_args=("out",))
def _route_combine_op(y: torch.Tensor, weights: torch.Tensor, out: torch.Tensor, block_n: int) -> None:
    _launch(y, weights, out, block_n)


_route_combine_op.register_fake(lambda *args: None)


def route_combine(y, weights, *, out=None, out_dtype=None, block_n: int = 256):
    batch, slots, n = combine_shape(y, weights)
    out = output(out, (batch, n), out_dtype or y.dtype, y.device)
    (_launch if LAUNCH_DIRECTLY[0] else torch.ops.kimi.route_combine)(y, weights, out, block_n)
    return out
