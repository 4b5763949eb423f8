"""Random inputs for each operation at a given shape: what the equivalence checker and benchmarks feed in.

Shapes are plain JSON-able dicts: gemv ops ``{B, N, K, group}`` (plus ``out``: "bf16" or "fp32"; dense
``weight``: "bf16" or "fp32"), grouped ops ``{B, S, E, N, K, group}`` (plus
``per_slot`` for a ``[B, S, K]`` input), ``route_combine`` ``{B, S, N}``; the fused decode ops ``rms_norm``
``{B, H, residual}``, ``kda_decode_step`` ``{B, H, d, taps, low_rank}``, ``route_topk`` ``{B, E, k, renormalize,
scaling, shared}`` (``act``: "bf16" or "fp32" activations). Codes cover the whole signed
range (the INT4 decoder must handle -8 as well as the encoder's -7..7), scales are near ``1/sqrt(K)`` in
magnitude, of either sign (the ``signed`` rounding stores negative ones), so outputs are O(1), and route tables hold distinct experts. Inputs are drawn on the target
device with a generator there (``torch.Generator(device)``), so full-size cases are cheap on a GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

ACTIVATION = torch.bfloat16
SCALE = torch.bfloat16
OUT_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass
class Case:
    args: tuple
    kwargs: dict
    out_shape: tuple[int, ...]
    out_dtype: torch.dtype
    mutated: tuple[int, ...] = ()  # positions of arguments the op updates in place (state): checked too


def _x(shape: tuple[int, ...], gen: torch.Generator | None, device) -> torch.Tensor:
    return torch.randn(shape, generator=gen, device=device).to(ACTIVATION)


def _scales(shape: tuple[int, ...], magnitude: float, gen, device) -> torch.Tensor:
    """Scales of 0.5-1.5 x ``magnitude``, each of a random sign."""
    size = (torch.rand(shape, generator=gen, device=device) + 0.5) * magnitude
    negative = torch.rand(shape, generator=gen, device=device) < 0.5
    return torch.where(negative, -size, size).to(SCALE)


def _int4_bank(lead: tuple[int, ...], n: int, k: int, group: int, gen, device):
    codes = torch.randint(0, 256, (*lead, n, k // 2), generator=gen, dtype=torch.uint8, device=device)
    return codes, _scales((*lead, n, k // group), 1 / k**0.5, gen, device)


def _routes(batch: int, slots: int, experts: int, gen, device) -> torch.Tensor:
    """Distinct experts across the whole table when the bank is large enough (the most bytes a kernel
    can be asked to read; what traffic.op_bytes counts), else distinct within each row."""
    if slots > experts:
        raise ValueError(f"{slots} slots cannot hold distinct experts out of {experts}")
    if batch * slots <= experts:
        return (
            torch.randperm(experts, generator=gen, device=device)[: batch * slots]
            .view(batch, slots)
            .to(torch.int32)
        )
    rows = [torch.randperm(experts, generator=gen, device=device)[:slots] for _ in range(batch)]
    return torch.stack(rows).to(torch.int32)


def _gemv_case(fmt: str) -> Callable[[dict, torch.Generator | None, torch.device | str], Case]:
    def build(shape: dict, gen: torch.Generator | None, device) -> Case:
        b, n, k = shape["B"], shape["N"], shape["K"]
        # An FP32 x holds BF16 values, as the model's activations do; `native` multiplies in the weight's dtype.
        x = _x((b, k), gen, device).to(_activation(shape))
        out_dtype = OUT_DTYPES[shape.get("out", "bf16")]
        args: tuple
        if fmt == "int4":
            codes, scales = _int4_bank((), n, k, shape["group"], gen, device)
            args = (x, codes, scales, shape["group"])
        elif fmt == "int8":
            codes = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8, device=device)
            scales = _scales((n, k // shape["group"]), 1 / (64 * k**0.5), gen, device)
            args = (x, codes, scales, shape["group"])
        else:
            weight = OUT_DTYPES[shape.get("weight", "bf16")]  # FP32: the router's logits weight
            args = (x, (torch.randn((n, k), generator=gen, device=device) / k**0.5).to(weight))
        return Case(args, {"out_dtype": out_dtype}, (b, n), out_dtype)

    return build


def _grouped_case(shape: dict, gen: torch.Generator | None, device) -> Case:
    b, s, e, n, k, g = (shape[key] for key in ("B", "S", "E", "N", "K", "group"))
    x = _x((b, s, k) if shape.get("per_slot") else (b, k), gen, device)
    codes, scales = _int4_bank((e,), n, k, g, gen, device)
    return Case((x, codes, scales, _routes(b, s, e, gen, device), g), {}, (b, s, n), ACTIVATION)


def _swiglu_case(shape: dict, gen: torch.Generator | None, device) -> Case:
    b, s, e, n, k, g = (shape[key] for key in ("B", "S", "E", "N", "K", "group"))
    gate = _int4_bank((e,), n, k, g, gen, device)
    up = _int4_bank((e,), n, k, g, gen, device)
    args = (_x((b, k), gen, device), *gate, *up, _routes(b, s, e, gen, device), g)
    return Case(args, {}, (b, s, n), ACTIVATION)


def _dense_bank(e: int, n: int, k: int, shape: dict, gen, device) -> torch.Tensor:
    return (torch.randn((e, n, k), generator=gen, device=device) / k**0.5).to(
        OUT_DTYPES[shape.get("weight", "bf16")]
    )


def _dense_grouped_case(shape: dict, gen: torch.Generator | None, device) -> Case:
    b, s, e, n, k = (shape[key] for key in ("B", "S", "E", "N", "K"))
    act, out = _activation(shape), OUT_DTYPES[shape.get("out", "bf16")]
    x = torch.randn((b, s, k) if shape.get("per_slot") else (b, k), generator=gen, device=device).to(act)
    args = (x, _dense_bank(e, n, k, shape, gen, device), _routes(b, s, e, gen, device))
    return Case(args, {"out_dtype": out}, (b, s, n), out)


def _dense_swiglu_case(shape: dict, gen: torch.Generator | None, device) -> Case:
    b, s, e, n, k = (shape[key] for key in ("B", "S", "E", "N", "K"))
    act = _activation(shape)
    gate, up = (_dense_bank(e, n, k, shape, gen, device) for _ in range(2))
    x = torch.randn((b, k), generator=gen, device=device).to(act)
    return Case((x, gate, up, _routes(b, s, e, gen, device)), {}, (b, s, n), act)


def _combine_case(shape: dict, gen: torch.Generator | None, device) -> Case:
    b, s, n = shape["B"], shape["S"], shape["N"]
    weights = torch.rand((b, s), generator=gen, device=device)
    return Case((_x((b, s, n), gen, device), weights), {}, (b, n), ACTIVATION)


def _activation(shape: dict) -> torch.dtype:
    return OUT_DTYPES[shape.get("act", "bf16")]


def _rms_norm_case(shape: dict, gen: torch.Generator | None, device) -> Case:
    b, h, act = shape["B"], shape["H"], _activation(shape)
    x = torch.randn((b, h), generator=gen, device=device).to(act)
    weight = (torch.rand(h, generator=gen, device=device) + 0.5).to(act)
    kwargs = (
        {"residual": torch.randn((b, h), generator=gen, device=device).to(act)}
        if shape.get("residual")
        else {}
    )
    return Case((x, weight, 1e-5), kwargs, (b, h), act)


def _kda_step_case(shape: dict, gen: torch.Generator | None, device) -> Case:
    """The state and windows hold earlier tokens (not zeros); f near the trained range (decays in (0, 1))."""
    b, heads, d, taps, act = shape["B"], shape["H"], shape["d"], shape["taps"], _activation(shape)
    dim = heads * d

    def randn(*size, scale=1.0):
        return torch.randn(size, generator=gen, device=device) * scale

    q, k, v = (randn(b, dim).to(act) for _ in range(3))
    rank = shape.get("low_rank")  # f and gate as f_a/g_a rows and the f_b/g_b weights
    f, gate = (randn(b, rank or dim).to(act) for _ in range(2))
    kwargs = {"l2_eps": 1e-6, "norm_eps": 1e-5}
    if rank:
        kwargs |= {name: randn(dim, rank, scale=rank**-0.5).to(act) for name in ("f_b_weight", "g_b_weight")}
    conv = randn(b, 3, dim, taps - 1).to(act)
    q_taps, k_taps, v_taps = (randn(dim, 1, taps, scale=0.5).to(act) for _ in range(3))
    args = (q, k, v, f, randn(b, heads).to(act), gate, conv, q_taps, k_taps, v_taps, randn(1, 1, heads, 1) * 0.5,
            randn(dim), (torch.rand(d, generator=gen, device=device) + 0.5).to(act), randn(b, heads, d, d, scale=0.1))  # fmt: skip
    return Case(args, kwargs, (b, dim), act, mutated=(6, 13))


def _route_case(shape: dict, gen: torch.Generator | None, device) -> Case:
    b, e = shape["B"], shape["E"]
    logits = torch.randn((b, e), generator=gen, device=device) * 2
    bias = torch.randn(e, generator=gen, device=device) * 0.1
    args = (logits, bias, shape["k"], shape["renormalize"], shape["scaling"])
    shared = shape.get("shared")
    return Case(args, {"shared_slot": shared}, (b, shape["k"] + (shared is not None)), torch.float32)


CASES: dict[str, Callable[[dict, torch.Generator | None, torch.device | str], Case]] = {
    "w4a16_gemv": _gemv_case("int4"),
    "w8a16_gemv": _gemv_case("int8"),
    "w16a16_gemv": _gemv_case("dense"),
    "w16a16_grouped_gemv": _dense_grouped_case,
    "w16a16_grouped_swiglu": _dense_swiglu_case,
    "w4a16_grouped_gemv": _grouped_case,
    "w4a16_grouped_swiglu": _swiglu_case,
    "route_combine": _combine_case,
    "rms_norm": _rms_norm_case,
    "kda_decode_step": _kda_step_case,
    "route_topk": _route_case,
}
