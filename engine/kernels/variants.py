"""Registration of the Triton variants of every operation."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.kernels import registry, triton_combine, triton_gemv
from engine.kernels.signatures import grouped_shape, output

_GEMV = (
    "x permuted FP32 position-major, K-contiguous 16-byte weight loads with the next tile prefetched, "
    "per-group sums times the group scales, split-K reduced in the kernel"
)

registry.register("w4a16_gemv", "triton", backend="triton", description=_GEMV)(triton_gemv.w4a16_gemv)
registry.register("w8a16_gemv", "triton", backend="triton", description=_GEMV)(triton_gemv.w8a16_gemv)
registry.register("w16a16_gemv", "triton", backend="triton", description=_GEMV)(triton_gemv.w16a16_gemv)
registry.register(
    "w4a16_grouped_gemv", "triton", backend="triton", description="route table -> expert rows; " + _GEMV
)(triton_gemv.w4a16_grouped_gemv)
registry.register(
    "w4a16_grouped_swiglu",
    "triton_fused",
    backend="triton",
    description="one launch: gate and up rows of each routed expert, two FP32 accumulators, silu(gate) * up",
)(triton_gemv.w4a16_grouped_swiglu)
registry.register("route_combine", "triton", backend="triton", description="FP32 sum over slots in order")(
    triton_combine.route_combine
)


@registry.register(
    "w4a16_grouped_swiglu",
    "triton",
    backend="triton",
    description="two split-K grouped GEMV launches with FP32 outputs, then silu(gate) * up in PyTorch",
)
def grouped_swiglu_unfused(
    x, gate_codes, gate_scales, up_codes, up_scales, route_ids, group_size, *, out=None
):
    shape = grouped_shape(x, gate_codes, gate_scales, route_ids, group_size)
    if shape.per_slot_input:
        raise ValueError("the gate/up projection takes x as [B, K]")
    out = output(out, (shape.batch, shape.slots, shape.n), x.dtype, x.device)
    gate = triton_gemv.w4a16_grouped_gemv(
        x, gate_codes, gate_scales, route_ids, group_size, out_dtype=torch.float32
    )
    up = triton_gemv.w4a16_grouped_gemv(x, up_codes, up_scales, route_ids, group_size, out_dtype=gate.dtype)
    out.copy_(F.silu(gate) * up)
    return out


registry.set_triton_availability(triton_gemv.triton_unavailable)
