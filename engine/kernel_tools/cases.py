"""Random inputs for each operation at a given shape: what the equivalence checker and benchmarks feed in.

Shapes are plain JSON-able dicts: gemv ops ``{B, N, K, group}`` (plus ``out``: "bf16" or "fp32"), grouped ops ``{B, S, E, N, K, group}`` (plus
``per_slot`` for a ``[B, S, K]`` input), ``route_combine`` ``{B, S, N}``. Codes cover the whole signed
range (the INT4 decoder must handle -8 as well as the encoder's -7..7), scales are near ``1/sqrt(K)`` so
outputs are O(1), and route tables hold distinct experts. Inputs are drawn on the target
device with a generator there (``torch.Generator(device)``), so full-size cases are cheap on a GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

ACTIVATION = torch.bfloat16
SCALE = torch.bfloat16
OUT_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass
class Case:
    args: tuple
    kwargs: dict
    out_shape: tuple[int, ...]
    out_dtype: torch.dtype


def _x(shape: tuple[int, ...], gen: torch.Generator, device) -> torch.Tensor:
    return torch.randn(shape, generator=gen, device=device).to(ACTIVATION)


def _int4_bank(lead: tuple[int, ...], n: int, k: int, group: int, gen, device):
    codes = torch.randint(0, 256, (*lead, n, k // 2), generator=gen, dtype=torch.uint8, device=device)
    scales = (torch.rand((*lead, n, k // group), generator=gen, device=device) + 0.5) / k**0.5
    return codes, scales.to(SCALE)


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


def _gemv_case(fmt: str) -> Callable[[dict, torch.Generator, torch.device], Case]:
    def build(shape: dict, gen: torch.Generator, device) -> Case:
        b, n, k = shape["B"], shape["N"], shape["K"]
        x = _x((b, k), gen, device)
        out_dtype = OUT_DTYPES[shape.get("out", "bf16")]
        if fmt == "int4":
            codes, scales = _int4_bank((), n, k, shape["group"], gen, device)
            args = (x, codes, scales, shape["group"])
        elif fmt == "int8":
            codes = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8, device=device)
            scales = (torch.rand((n, k // shape["group"]), generator=gen, device=device) + 0.5) / (
                64 * k**0.5
            )
            args = (x, codes, scales.to(SCALE), shape["group"])
        else:
            args = (x, (torch.randn((n, k), generator=gen, device=device) / k**0.5).to(ACTIVATION))
        return Case(args, {"out_dtype": out_dtype}, (b, n), out_dtype)

    return build


def _grouped_case(shape: dict, gen: torch.Generator, device) -> Case:
    b, s, e, n, k, g = (shape[key] for key in ("B", "S", "E", "N", "K", "group"))
    x = _x((b, s, k) if shape.get("per_slot") else (b, k), gen, device)
    codes, scales = _int4_bank((e,), n, k, g, gen, device)
    return Case((x, codes, scales, _routes(b, s, e, gen, device), g), {}, (b, s, n), ACTIVATION)


def _swiglu_case(shape: dict, gen: torch.Generator, device) -> Case:
    b, s, e, n, k, g = (shape[key] for key in ("B", "S", "E", "N", "K", "group"))
    gate = _int4_bank((e,), n, k, g, gen, device)
    up = _int4_bank((e,), n, k, g, gen, device)
    args = (_x((b, k), gen, device), *gate, *up, _routes(b, s, e, gen, device), g)
    return Case(args, {}, (b, s, n), ACTIVATION)


def _combine_case(shape: dict, gen: torch.Generator, device) -> Case:
    b, s, n = shape["B"], shape["S"], shape["N"]
    weights = torch.rand((b, s), generator=gen, device=device)
    return Case((_x((b, s, n), gen, device), weights), {}, (b, n), ACTIVATION)


CASES: dict[str, Callable[[dict, torch.Generator, torch.device], Case]] = {
    "w4a16_gemv": _gemv_case("int4"),
    "w8a16_gemv": _gemv_case("int8"),
    "w16a16_gemv": _gemv_case("dense"),
    "w4a16_grouped_gemv": _grouped_case,
    "w4a16_grouped_swiglu": _swiglu_case,
    "route_combine": _combine_case,
}
