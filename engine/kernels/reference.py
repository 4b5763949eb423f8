"""The operations and their reference implementations: dequantise with the codec, then compute in FP32.

Plain PyTorch, so they run on any device; every other variant is checked against these.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.codec import LinearWeight, dequantize
from engine.kernels import registry
from engine.kernels.signatures import combine_shape, dense_swiglu_shape, gemv_shape, grouped_shape, output

registry.define(
    "w4a16_gemv",
    "y[B,N] = x[B,K] @ W^T, W INT4 [N,K/2] codes + [N,K/G] scales (dense layers, INT4 head)",
    weight_args=((1, 2),),
)
registry.define("w8a16_gemv", "y[B,N] = x[B,K] @ W^T, W INT8 [N,K] codes + [N,K/G] scales (INT8 LM head)")
registry.define("w16a16_gemv", "y[B,N] = x[B,K] @ W^T, W BF16/FP16/FP32 [N,K] (BF16 LM head, FP32 router)")
registry.define(
    "w4a16_grouped_gemv",
    "y[B,S,N] = x[B,(S,)K] @ bank[route_ids[B,S]]^T over an INT4 expert bank [E,N,K/2] (gate/up and down)",
    weight_args=((1, 2),),
)
registry.define(
    "w4a16_grouped_swiglu",
    "h[B,S,N] = silu(x @ gate[route]^T) * (x @ up[route]^T) over two INT4 expert banks (fused gate/up)",
    weight_args=((1, 2), (3, 4)),
)
registry.define(
    "w16a16_grouped_gemv",
    "y[B,S,N] = x[B,(S,)K] @ bank[route_ids[B,S]]^T over a dense expert bank [E,N,K] (down projection)",
)
registry.define(
    "w16a16_grouped_swiglu",
    "h[B,S,N] = silu(x @ gate[route]^T) * (x @ up[route]^T) over two dense expert banks [E,N,K]",
)
registry.define("route_combine", "out[B,N] = sum_s weights[B,S] * y[B,S,N] (route-weighted expert combine)")


def _fp32_gemv(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    out.copy_(x.float() @ weight.t())
    return out


@registry.register("w4a16_gemv", "reference", backend="torch", description="dequantise to FP32, matmul")
def w4a16_gemv(x, codes, scales, group_size, *, out=None, out_dtype=None):
    shape = gemv_shape("int4", x, codes, scales, group_size)
    out = output(out, (shape.batch, shape.n), out_dtype or x.dtype, x.device)
    return _fp32_gemv(x, dequantize(LinearWeight("int4", codes, scales, group_size)), out)


@registry.register("w8a16_gemv", "reference", backend="torch", description="dequantise to FP32, matmul")
def w8a16_gemv(x, codes, scales, group_size, *, out=None, out_dtype=None):
    shape = gemv_shape("int8", x, codes, scales, group_size)
    out = output(out, (shape.batch, shape.n), out_dtype or x.dtype, x.device)
    return _fp32_gemv(x, dequantize(LinearWeight("int8", codes, scales, group_size)), out)


@registry.register("w16a16_gemv", "reference", backend="torch", description="FP32 matmul")
def w16a16_gemv(x, weight, *, out=None, out_dtype=None):
    shape = gemv_shape("dense", x, weight, None, None)
    out = output(out, (shape.batch, shape.n), out_dtype or x.dtype, x.device)
    return _fp32_gemv(x, weight.float(), out)


def _grouped_fp32(x, codes, scales, route_ids, group_size) -> torch.Tensor:
    ids = route_ids.long()
    weights = dequantize(LinearWeight("int4", codes[ids], scales[ids], group_size))  # [B, S, N, K]
    rows = x.float() if x.ndim == 3 else x.float().unsqueeze(1).expand(-1, ids.shape[1], -1)
    return torch.einsum("bsk,bsnk->bsn", rows, weights)


@registry.register(
    "w4a16_grouped_gemv", "reference", backend="torch", description="gather experts, dequantise, einsum"
)
def w4a16_grouped_gemv(x, codes, scales, route_ids, group_size, *, out=None, out_dtype=None):
    shape = grouped_shape(x, codes, scales, route_ids, group_size)
    out = output(out, (shape.batch, shape.slots, shape.n), out_dtype or x.dtype, x.device)
    out.copy_(_grouped_fp32(x, codes, scales, route_ids, group_size))
    return out


@registry.register(
    "w4a16_grouped_swiglu", "reference", backend="torch", description="two FP32 grouped GEMVs, silu * up"
)
def w4a16_grouped_swiglu(x, gate_codes, gate_scales, up_codes, up_scales, route_ids, group_size, *, out=None):
    shape = grouped_shape(x, gate_codes, gate_scales, route_ids, group_size)
    grouped_shape(x, up_codes, up_scales, route_ids, group_size)
    if shape.per_slot_input:
        raise ValueError("the gate/up projection takes x as [B, K]")
    out = output(out, (shape.batch, shape.slots, shape.n), x.dtype, x.device)
    gate = _grouped_fp32(x, gate_codes, gate_scales, route_ids, group_size)
    up = _grouped_fp32(x, up_codes, up_scales, route_ids, group_size)
    out.copy_(F.silu(gate) * up)
    return out


def _dense_grouped_fp32(x, bank, route_ids) -> torch.Tensor:
    rows = x.float() if x.ndim == 3 else x.float().unsqueeze(1).expand(-1, route_ids.shape[1], -1)
    return torch.einsum("bsk,bsnk->bsn", rows, bank[route_ids.long()].float())


@registry.register(
    "w16a16_grouped_gemv", "reference", backend="torch", description="gather experts, FP32 einsum"
)
def w16a16_grouped_gemv(x, bank, route_ids, *, out=None, out_dtype=None):
    shape = grouped_shape(x, bank, None, route_ids, None, "dense")
    out = output(out, (shape.batch, shape.slots, shape.n), out_dtype or x.dtype, x.device)
    out.copy_(_dense_grouped_fp32(x, bank, route_ids))
    return out


@registry.register(
    "w16a16_grouped_swiglu", "reference", backend="torch", description="two FP32 grouped GEMVs, silu * up"
)
def w16a16_grouped_swiglu(x, gate, up, route_ids, *, out=None):
    shape = dense_swiglu_shape(x, gate, up, route_ids)
    out = output(out, (shape.batch, shape.slots, shape.n), x.dtype, x.device)
    out.copy_(F.silu(_dense_grouped_fp32(x, gate, route_ids)) * _dense_grouped_fp32(x, up, route_ids))
    return out


@registry.register("route_combine", "reference", backend="torch", description="FP32 weighted sum over slots")
def route_combine(y, weights, *, out=None, out_dtype=None):
    batch, _, n = combine_shape(y, weights)
    out = output(out, (batch, n), out_dtype or y.dtype, y.device)
    out.copy_(torch.einsum("bsn,bs->bn", y.float(), weights))
    return out
