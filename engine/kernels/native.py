"""``w16a16_gemv`` through torch's own matmul in the weight's dtype (BF16/FP16 GEMV, FP32 accumulation).

The reference converts the whole weight to FP32 on every call, which on the CPU costs more than the
multiply (for a BF16 LM head, several times the bytes it reads); this variant reads the weight as stored,
rounding activations and results to the weight's dtype (at most BF16's rounding: its stated precision).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.kernels import reference, registry  # noqa: F401  (reference defines the operations)
from engine.kernels.signatures import gemv_shape, output


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
