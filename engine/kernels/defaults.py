"""Shipped defaults per device type; pinned by tests/kernels/test_kernel_defaults.py.

On CUDA every operation defaults to its Triton variant, so an ordinary run uses the same kernels the
benchmarks measure. On the CPU the defaults are the references (the Triton variants would only run in the
interpreter, which is for tests); select them explicitly there.
"""

SHIPPED_DEFAULTS: dict[str, dict[str, str]] = {
    "cuda": {
        "w4a16_gemv": "triton",
        "w8a16_gemv": "triton",
        "w16a16_gemv": "triton",
        "w4a16_grouped_gemv": "triton",
        "w4a16_grouped_swiglu": "triton_fused",
        "route_combine": "triton",
    },
    "cpu": {
        "w4a16_gemv": "reference",
        "w8a16_gemv": "reference",
        "w16a16_gemv": "reference",
        "w4a16_grouped_gemv": "reference",
        "w4a16_grouped_swiglu": "reference",
        "route_combine": "reference",
    },
}
