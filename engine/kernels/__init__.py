"""Decode kernels behind a registry: ``get(op, variant=None, device=None)`` returns the function to call.

Operations (signatures in engine/kernels/reference.py): w4a16_gemv, w8a16_gemv, w16a16_gemv,
w16a16_grouped_gemv, w16a16_grouped_swiglu (dense expert banks),
w4a16_grouped_gemv, w4a16_grouped_swiglu, route_combine; and the fused decode operations rms_norm,
kda_decode_step, route_topk (triton_norm.py, triton_kda.py, triton_router.py; bound by fused.py). ``linear(x, weight)`` dispatches a
:class:`~engine.codec.LinearWeight` to the GEMV for its format.
"""

from engine.kernels import cpp_cpu, fused, int4pack, native, reference, variants  # noqa: F401  (define the operations, register variants)
from engine.kernels.linear import GEMV_FOR_FORMAT, linear, linear_fn
from engine.kernels.registry import (
    DEFAULT_SELECTION,
    ENV_VAR,
    KernelSelectionError,
    KernelUnavailable,
    Selection,
    Variant,
    env_selection,
    get,
    named_choices,
    operations,
    resolve,
    select,
    unavailable_reason,
    unused_env_entries,
)

__all__ = [
    "DEFAULT_SELECTION",
    "ENV_VAR",
    "GEMV_FOR_FORMAT",
    "KernelSelectionError",
    "KernelUnavailable",
    "Selection",
    "Variant",
    "env_selection",
    "get",
    "linear",
    "linear_fn",
    "named_choices",
    "operations",
    "resolve",
    "select",
    "unavailable_reason",
    "unused_env_entries",
]
