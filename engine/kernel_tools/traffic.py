"""Compulsory DRAM bytes of one operation call: each input read once, each output written once.

The numerator of "achieved bandwidth": weights (codes + scales) of the rows actually used (for grouped
ops only the distinct experts the route table touches), activations, route data and outputs. Split-K
partials and repeated reads are not counted: they are the kernel's overhead, not useful traffic.
"""

from __future__ import annotations

import torch

from engine.codec import quantized_nbytes

ACTIVATION_BYTES = 2  # BF16
_OUT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


def weight_bytes(fmt: str, n: int, k: int, group: int | None) -> int:
    """Stored bytes of one ``[n, k]`` weight in ``fmt`` (``int4``, ``int8`` or ``dense`` BF16)."""
    if fmt == "dense":
        return n * k * ACTIVATION_BYTES
    if group is None:
        raise ValueError(f"{fmt} weights need a group size")
    return quantized_nbytes((n, k), fmt, group, torch.bfloat16)


def op_bytes(op: str, shape: dict, *, unique_experts: int | None = None) -> int:
    """Bytes one call of ``op`` at ``shape`` (a shapes.py / cases.py dict) must move.

    ``unique_experts`` is the number of distinct bank slots in the route table (default: ``B * S``
    capped at ``E``, i.e. no two assignments share an expert).
    """
    b = shape["B"]
    if op in ("w4a16_gemv", "w8a16_gemv", "w16a16_gemv"):
        fmt = {"w4a16_gemv": "int4", "w8a16_gemv": "int8", "w16a16_gemv": "dense"}[op]
        n, k = shape["N"], shape["K"]
        out = _OUT_BYTES[shape.get("out", "bf16")]
        weights = weight_bytes(fmt, n, k, shape.get("group")) * (2 if shape.get("weight") == "fp32" else 1)
        return weights + b * k * ACTIVATION_BYTES + b * n * out
    if op == "route_combine":
        s, n = shape["S"], shape["N"]
        return b * s * n * ACTIVATION_BYTES + b * s * 4 + b * n * ACTIVATION_BYTES
    if op in ("w4a16_grouped_gemv", "w4a16_grouped_swiglu"):
        s, e, n, k = shape["S"], shape["E"], shape["N"], shape["K"]
        experts = min(b * s, e) if unique_experts is None else unique_experts
        banks = 2 if op == "w4a16_grouped_swiglu" else 1
        x_rows = b * s if shape.get("per_slot") else b
        routes = b * s * 4
        return (
            banks * experts * weight_bytes("int4", n, k, shape["group"])
            + x_rows * k * ACTIVATION_BYTES
            + routes
            + b * s * n * ACTIVATION_BYTES
        )
    if op in ("w16a16_grouped_gemv", "w16a16_grouped_swiglu"):
        s, e, n, k = shape["S"], shape["E"], shape["N"], shape["K"]
        experts = min(b * s, e) if unique_experts is None else unique_experts
        banks = 2 if op == "w16a16_grouped_swiglu" else 1
        weight = _OUT_BYTES[shape.get("weight", "bf16")]
        x_rows = b * s if shape.get("per_slot") else b
        act, out = _OUT_BYTES[shape.get("act", "bf16")], _OUT_BYTES[shape.get("out", "bf16")]
        return banks * experts * n * k * weight + x_rows * k * act + b * s * 8 + b * s * n * out
    if op == "rms_norm":
        act = _OUT_BYTES[shape.get("act", "bf16")]
        rows = b * shape["H"] * act
        return shape["H"] * act + (4 if shape.get("residual") else 2) * rows
    if op == "kda_decode_step":
        act = _OUT_BYTES[shape.get("act", "bf16")]
        heads, d, taps = shape["H"], shape["d"], shape["taps"]
        dim = heads * d
        state = 2 * b * heads * d * d * 4  # read and written once
        windows = 2 * b * 3 * dim * (taps - 1) * act
        rank = shape.get("low_rank")
        rows = 4 * b * dim * act + 2 * b * (rank or dim) * act + b * heads * act  # q, k, v, out; f, gate; b
        low_rank = 2 * dim * rank * act if rank else 0  # f_b and g_b weights
        return state + windows + rows + low_rank + 3 * dim * taps * act + dim * 4 + d * act + heads * 4
    if op == "route_topk":
        slots = shape["k"] + ("shared" in shape)
        return b * shape["E"] * 4 + shape["E"] * 4 + b * slots * (4 + 8)
    raise ValueError(f"no byte count for operation {op!r}")
