"""Shipped defaults per device type; pinned by tests/kernels/test_kernel_defaults.py.

On CUDA every operation defaults to its Triton variant, so an ordinary run uses the same kernels the
benchmarks measure; the dense expert banks keep torch's gathered bmm ("native": no Triton variant yet).
On the CPU the expert banks (INT4 and dense) and the dense GEMV (the LM head, and every projection of a
dense model at decode) default to our C++ kernels (engine/kernels/cpp_cpu.py: one call over all routes;
the weight read as stored, once for all rows, where torch's BF16 matmul at one row and its FP32 matmul at
2 to 8 rows measured several times slower) and the dense W4A16 GEMV to torch's own int4pack kernel, which
the compiled decode step measured faster than our C++ one for those shapes:
`python -m runners decode --quant default --kernels reference,int4pack,cpp,default`. The rest stay the
references (the Triton variants would only run in the interpreter, which is for tests); select them
explicitly there.
"""

SHIPPED_DEFAULTS: dict[str, dict[str, str]] = {
    "cuda": {
        "w4a16_gemv": "triton",
        "w8a16_gemv": "triton",
        "w16a16_gemv": "triton",
        "w16a16_grouped_gemv": "native",
        "w16a16_grouped_swiglu": "native",
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
        "w16a16_gemv": "cpp",
        "w16a16_grouped_gemv": "cpp",
        "w16a16_grouped_swiglu": "cpp",
        "w4a16_grouped_gemv": "cpp",
        "w4a16_grouped_swiglu": "cpp",
        "route_combine": "reference",
        "rms_norm": "reference",
        "kda_decode_step": "reference",
        "route_topk": "reference",
    },
}

# What a shipped default gives way to where it cannot run (our C++ kernels on a machine without a C++
# compiler or ninja): torch's own kernels, which need no build. Used with a warning naming the reason,
# never silently; a variant chosen by argument or KIMI_KERNELS never falls back.
SHIPPED_FALLBACKS: dict[str, dict[str, str]] = {
    "cpu": {
        "w16a16_gemv": "native",
        "w16a16_grouped_gemv": "native",
        "w16a16_grouped_swiglu": "native",
        "w4a16_grouped_gemv": "int4pack",
        "w4a16_grouped_swiglu": "int4pack",
    },
}
