"""Fused RMSNorm (with the residual add before it) as one Triton kernel, and its plain reference.

    out[r] = weight * rms_normalize(x[r] + residual[r]).to(x.dtype)     x, residual, out [R, H]

``rms_normalize`` is the model's own (engine/model/norm.py): FP32, ``x * rsqrt(mean(x^2) + eps)``. With a
``residual`` the rounded sum ``x + residual`` (x's dtype, as the eager add makes it) is written to
``sum_out`` too: the decoder layer's ``h = h + attn(...)`` followed by its post-attention norm is one
launch instead of eight. The kernel rounds where the eager code rounds (the sum, the normalised value
to x's dtype, the product by the weight), so the two differ only in the FP32 mean's summation order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels import registry
from engine.kernels.triton_gemv import LAUNCH_DIRECTLY
from engine.kernels.triton_round import round_to
from engine.model.norm import rms_norm

registry.define(
    "rms_norm",
    "out[R,H] = weight * rmsnorm(x[R,H] (+ residual[R,H], the sum also written)) (every RMSNorm at decode)",
)


def _check(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None) -> tuple[int, int]:
    if x.ndim < 1 or weight.shape != (x.shape[-1],):
        raise ValueError(f"rms_norm: x {tuple(x.shape)} and weight {tuple(weight.shape)} disagree on H")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(f"rms_norm: residual {tuple(residual.shape)} {residual.dtype} is not like x")
    return x.numel() // x.shape[-1], x.shape[-1]


def _outputs(x, weight, residual, out, sum_out):
    if out is None:
        out = torch.empty(x.shape, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    if residual is not None and sum_out is None:
        sum_out = torch.empty_like(x)
    return out, sum_out


@registry.register("rms_norm", "reference", backend="torch", description="the model's eager RMSNorm")
def rms_norm_reference(x, weight, eps, *, residual=None, out=None, sum_out=None):
    """x, residual [..., H]; weight [H]. Returns out (and writes ``sum_out`` when ``residual`` is given)."""
    _check(x, weight, residual)
    out, sum_out = _outputs(x, weight, residual, out, sum_out)
    if residual is not None:
        x = sum_out.copy_(x + residual)
    out.copy_(rms_norm(x, weight, eps))
    return out


@triton.jit
def _rms_norm_kernel(x_ptr, r_ptr, w_ptr, out_ptr, sum_ptr, H, eps, HAS_RESIDUAL: tl.constexpr,
                     BLOCK: tl.constexpr):  # fmt: skip
    """Grid (rows,): one row of H values per program, held in registers (H <= BLOCK)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    x = tl.load(x_ptr + row * H + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        x = round_to(x.to(tl.float32) + tl.load(r_ptr + row * H + cols, mask=mask, other=0.0).to(tl.float32),
                     x_ptr.dtype.element_ty)  # fmt: skip
        tl.store(sum_ptr + row * H + cols, x, mask=mask)
    xf = x.to(tl.float32)
    normed = xf * tl.rsqrt(tl.sum(xf * xf, axis=0) / H + eps)
    normed = round_to(normed, x_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * H + cols, round_to(normed * w, out_ptr.dtype.element_ty), mask=mask)


def _launch(x, weight, residual, out, sum_out, eps: float) -> None:
    rows, h = x.numel() // x.shape[-1], x.shape[-1]
    block = triton.next_power_of_2(h)
    _rms_norm_kernel[(rows,)](
        x, x if residual is None else residual, weight, out, out if sum_out is None else sum_out, h, eps,
        HAS_RESIDUAL=residual is not None, BLOCK=block, num_warps=min(16, max(1, block // 256)),
    )  # fmt: skip


@torch.library.custom_op("kimi::rms_norm", mutates_args=("out", "sum_out"))
def _rms_norm_op(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None, out: torch.Tensor,
                 sum_out: torch.Tensor | None, eps: float) -> None:  # fmt: skip
    _launch(x, weight, residual, out, sum_out, eps)


_rms_norm_op.register_fake(lambda *args: None)


@registry.register("rms_norm", "triton", backend="triton", description="one program per row, sum fused")
def rms_norm_triton(x, weight, eps, *, residual=None, out=None, sum_out=None):
    _check(x, weight, residual)
    out, sum_out = _outputs(x, weight, residual, out, sum_out)
    x = x.contiguous()
    residual = None if residual is None else residual.contiguous()
    (_launch if LAUNCH_DIRECTLY[0] else torch.ops.kimi.rms_norm)(x, weight, residual, out, sum_out, eps)
    return out
