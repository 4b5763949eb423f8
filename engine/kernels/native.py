"""The dense GEMVs through torch's own matmul in the weight's dtype (FP32 accumulation).

``w16a16_gemv``: the reference converts the whole weight to FP32 on every call, which on the CPU costs more
than the multiply (for a BF16 LM head, several times the bytes it reads); this variant reads the weight as
stored, rounding activations and results to the weight's dtype (at most BF16's rounding: its stated
precision). The dense grouped ops: one batched matrix-vector product per route over the gathered experts,
the form `engine.model.moe.expert_ffn` itself runs when no kernel is bound (so selecting these leaves a
dense expert bank unbound).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.kernels import reference, registry  # noqa: F401  (reference defines the operations)
from engine.kernels.signatures import dense_swiglu_shape, gemv_shape, grouped_shape, output


@registry.register(
    "w16a16_gemv",
    "native",
    backend="torch",
    description="F.linear in the weight's dtype: the weight read as stored, no FP32 copy",
    precision=torch.bfloat16,
    many_rows=True,
)
def w16a16_gemv(x, weight, *, out=None, out_dtype=None):
    shape = gemv_shape("dense", x, weight, None, None)
    out = output(out, (shape.batch, shape.n), out_dtype or x.dtype, x.device)
    out.copy_(F.linear(x.to(weight.dtype), weight))
    return out


def _gathered(x: torch.Tensor, bank: torch.Tensor, route_ids: torch.Tensor) -> torch.Tensor:
    batch, slots = route_ids.shape
    rows = x if x.ndim == 3 else x.unsqueeze(1).expand(-1, slots, -1)
    products = torch.bmm(bank[route_ids.reshape(-1)], rows.reshape(batch * slots, -1, 1).to(bank.dtype))
    return products.view(batch, slots, -1)


@registry.register(
    "w16a16_grouped_gemv",
    "native",
    backend="torch",
    description="gathered experts, torch.bmm in the bank's dtype",
    precision=torch.bfloat16,
)
def w16a16_grouped_gemv(x, bank, route_ids, *, out=None, out_dtype=None):
    shape = grouped_shape(x, bank, None, route_ids, None, "dense")
    out = output(out, (shape.batch, shape.slots, shape.n), out_dtype or x.dtype, x.device)
    out.copy_(_gathered(x, bank, route_ids))
    return out


@registry.register(
    "w16a16_grouped_swiglu",
    "native",
    backend="torch",
    description="gathered experts, two torch.bmm in the banks' dtype, silu * up",
    precision=torch.bfloat16,
)
def w16a16_grouped_swiglu(x, gate, up, route_ids, *, out=None):
    shape = dense_swiglu_shape(x, gate, up, route_ids)
    out = output(out, (shape.batch, shape.slots, shape.n), x.dtype, x.device)
    out.copy_(F.silu(_gathered(x, gate, route_ids)) * _gathered(x, up, route_ids))
    return out
