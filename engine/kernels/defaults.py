"""Shipped defaults per device type; pinned by tests/kernels/test_kernel_defaults.py.

On CUDA every operation defaults to its Triton variant, so an ordinary run uses the same kernels the
benchmarks measure. On the CPU the W4A16 operations default to torch's own int4pack kernels and the BF16
GEMV (the LM head) to torch's matmul in BF16, which decode measured faster than the references (they
dequantise or convert the weight to FP32 on every call): `python -m runners decode --quant default
--kernels reference,default`. The rest stay the references (the Triton variants would only run in the
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
        "rms_norm": "triton",
        "kda_decode_step": "triton",
        "route_topk": "triton",
    },
    "cpu": {
        "w4a16_gemv": "int4pack",
        "w8a16_gemv": "reference",
        "w16a16_gemv": "native",
        "w4a16_grouped_gemv": "int4pack",
        "w4a16_grouped_swiglu": "int4pack",
        "route_combine": "reference",
        "rms_norm": "reference",
        "kda_decode_step": "reference",
        "route_topk": "reference",
    },
}
