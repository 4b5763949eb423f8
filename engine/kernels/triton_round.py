"""Rounding to the activation dtype that agrees everywhere: the Triton interpreter truncates FP32 -> BF16
casts (and ignores ``fp_downcast_rounding``), the GPU and torch round to nearest even. Kernels that round
intermediates where the eager code does (engine/kernels/triton_norm.py, triton_kda.py) round through
:func:`round_to`, so interpreter checks see the GPU's values."""

import triton
import triton.language as tl


@triton.jit
def round_to(x, dtype: tl.constexpr):
    """FP32 ``x`` rounded to nearest even in ``dtype`` (BF16 by hand, exact after; others by the cast)."""
    if dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        x = bits.to(tl.float32, bitcast=True)
    return x.to(dtype)
