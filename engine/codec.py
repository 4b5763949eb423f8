"""Weight codecs: symmetric INT4 / INT8 with one scale per group of inputs.

This plain-PyTorch code is the reference every kernel is checked against.

Conventions (see docs/INT4.md):
- a weight is ``[..., N, K]`` (``N`` outputs, ``K`` inputs = the reduction axis);
- groups run along ``K``: group ``j`` of row ``n`` covers inputs ``j*G .. j*G+G-1``;
- (rounding ``"absmax"``, the default) ``scale = absmax(group) / QMAX`` rounded to the scale dtype (BF16 or FP16); codes are
  ``round(w / scale)`` computed against the *rounded* scale, so encoder and decoder share one grid;
  INT4 codes lie in ``[-7, 7]`` and INT8 codes in ``[-127, 127]`` (the decoders accept -8 / -128 too);
- INT4 packs two codes per byte: input ``2j`` in the **low** nibble, ``2j+1`` in the **high** nibble,
  each a two's-complement 4-bit value;
- dequantised value = ``code * scale`` in FP32, which is exact (a BF16/FP16 scale times a small integer).

Rounding ``"signed"`` keeps that layout and uses all sixteen INT4 levels, as llama.cpp's ``Q4_0`` does: the
group's extreme value (largest magnitude, with its sign) sets ``scale = extreme / -(QMAX + 1)``, so it encodes
as ``-(QMAX + 1)`` exactly and the scale may be negative; codes lie in ``[-QMAX - 1, QMAX]``, and a value of
the other sign as large as the extreme clamps to ``QMAX`` (at most one step off). The step is ``1/(QMAX+1)``
of the extreme instead of ``1/QMAX``.

Rounding ``"mse"`` keeps that layout but chooses each group's scale by a small search (as llama.cpp's
``make_qx_quants`` does): candidate scales around ``absmax / QMAX``, each refined to the least-squares scale
of its codes, with codes over the decoders' full range ``[-QMAX-1, QMAX]``; the group keeps whichever of the
candidates and the ``absmax`` encoding has the smallest squared error, so it is never worse than ``absmax``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

INT4_MAX = 7
INT8_MAX = 127
FORMATS = ("int4", "int8", "dense")
SCALE_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
ROUNDINGS = ("absmax", "signed", "mse")
# "mse" search: candidate scales absmax / (QMAX * ratio), from a scale that clips the largest values to one
# that leaves the top code unused.
_MSE_RATIOS = tuple(0.85 + 0.015 * i for i in range(26))


class CodecError(ValueError):
    """A tensor cannot be encoded as asked (wrong shape, group size or non-finite values)."""


@dataclass(frozen=True)
class LinearWeight:
    """A linear layer's weight in one storage format; leading axes (e.g. an expert bank) are allowed.

    - ``int4``: ``data`` uint8 ``[..., N, K/2]``, ``scales`` ``[..., N, K/G]``;
    - ``int8``: ``data`` int8 ``[..., N, K]``, ``scales`` ``[..., N, K/G]``;
    - ``dense``: ``data`` float ``[..., N, K]`` (BF16/FP16/FP32), no scales.
    """

    format: str
    data: torch.Tensor
    scales: torch.Tensor | None = None
    group_size: int | None = None

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise CodecError(f"unknown weight format {self.format!r}; expected one of {FORMATS}")
        if self.format == "dense":
            if self.scales is not None or self.group_size is not None:
                raise CodecError("a dense weight has no scales or group size")
            return
        if self.scales is None or self.group_size is None:
            raise CodecError(f"an {self.format} weight needs scales and a group size")
        expected = (*self.data.shape[:-1], self.in_features // self.group_size)
        if tuple(self.scales.shape) != expected:
            raise CodecError(
                f"{self.format} scales have shape {tuple(self.scales.shape)}, expected {expected} "
                f"for data {tuple(self.data.shape)} and group size {self.group_size}"
            )

    @property
    def in_features(self) -> int:
        return self.data.shape[-1] * 2 if self.format == "int4" else self.data.shape[-1]

    @property
    def out_features(self) -> int:
        return self.data.shape[-2]

    @property
    def shape(self) -> tuple[int, ...]:
        """The logical (dequantised) shape ``[..., N, K]``."""
        return (*self.data.shape[:-1], self.in_features)

    @property
    def nbytes(self) -> int:
        scale_bytes = 0 if self.scales is None else self.scales.numel() * self.scales.element_size()
        return self.data.numel() * self.data.element_size() + scale_bytes

    def to(self, device: torch.device | str) -> LinearWeight:
        scales = None if self.scales is None else self.scales.to(device)
        return LinearWeight(self.format, self.data.to(device), scales, self.group_size)


def _groups_and_absmax(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    if weight.ndim < 2:
        raise CodecError(f"only matrices can be quantised, got shape {tuple(weight.shape)}")
    k = weight.shape[-1]
    if group_size <= 0 or group_size % 2 or k % group_size:
        raise CodecError(
            f"input dimension {k} is not a multiple of the group size {group_size} (even, > 0); "
            "refusing to pad"
        )
    grouped = weight.float().reshape(*weight.shape[:-1], k // group_size, group_size)
    absmax = grouped.abs().amax(-1)
    if not torch.isfinite(absmax).all():
        raise CodecError("weight contains inf or NaN; refusing to quantise")
    return grouped, absmax


def _stored_scales(scales: torch.Tensor, scale_dtype: torch.dtype) -> torch.Tensor:
    scales = scales.to(scale_dtype)
    # An all-zero (or underflowing) group encodes as zeros under any scale; 1.0 keeps decoding finite.
    return torch.where(scales == 0, torch.ones_like(scales), scales)


def _codes(grouped: torch.Tensor, scales: torch.Tensor, low: int, qmax: int) -> torch.Tensor:
    """Nearest codes against the stored scales (one grid for encoder and decoder)."""
    return torch.round(grouped / scales.float().unsqueeze(-1)).clamp_(low, qmax)


def _squared_error(grouped: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return (codes * scales.float().unsqueeze(-1) - grouped).square().sum(-1)


def _scales_and_codes(
    weight: torch.Tensor, group_size: int, qmax: int, scale_dtype: torch.dtype, rounding: str = "absmax"
) -> tuple[torch.Tensor, torch.Tensor]:
    if rounding not in ROUNDINGS:
        raise CodecError(f"unknown rounding {rounding!r}; expected one of {ROUNDINGS}")
    grouped, absmax = _groups_and_absmax(weight, group_size)
    if rounding == "signed":
        extreme = grouped.gather(-1, grouped.abs().argmax(-1, keepdim=True)).squeeze(-1)
        scales = _stored_scales(extreme / -(qmax + 1), scale_dtype)
    else:
        scales = _stored_scales(absmax / qmax, scale_dtype)
    if not torch.isfinite(scales).all():
        raise CodecError(f"a group scale overflows {scale_dtype}; use BF16 scales")
    codes = _codes(grouped, scales, -qmax - (rounding == "signed"), qmax)
    if rounding == "mse":
        codes, scales = _search_scales(grouped, absmax, codes, scales, qmax, scale_dtype)
    return codes.reshape(weight.shape).to(torch.int8), scales


def _search_scales(grouped, absmax, codes, scales, qmax: int, scale_dtype: torch.dtype):
    """Per group, the candidate scale (and its codes) with the smallest squared error; the given
    ``absmax`` encoding is the first candidate, replaced only by a strictly smaller error."""
    best = _squared_error(grouped, codes, scales)
    for ratio in _MSE_RATIOS:
        trial = _codes(
            grouped, (absmax / (qmax * ratio)).clamp_min(torch.finfo(torch.float32).tiny), -qmax - 1, qmax
        )
        # The least-squares scale of these codes, then the nearest codes against it once stored.
        fitted = (trial * grouped).sum(-1) / trial.square().sum(-1).clamp_min(1)
        candidate = _stored_scales(fitted, scale_dtype)
        trial = _codes(grouped, candidate, -qmax - 1, qmax)
        error = _squared_error(grouped, trial, candidate)
        better = (error < best) & torch.isfinite(candidate.float()) & (candidate > 0)  # NaN compares false
        best = torch.where(better, error, best)
        scales = torch.where(better, candidate, scales)
        codes = torch.where(better.unsqueeze(-1), trial, codes)
    return codes, scales


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """Pack signed codes in [-8, 7] (int8 ``[..., K]``, K even) into uint8 ``[..., K/2]``."""
    if codes.shape[-1] % 2:
        raise CodecError(f"cannot pack an odd number of INT4 codes ({codes.shape[-1]})")
    nibbles = codes.to(torch.int16) & 0xF
    return (nibbles[..., 0::2] | (nibbles[..., 1::2] << 4)).to(torch.uint8)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_int4`: uint8 ``[..., K/2]`` -> signed int8 ``[..., K]``."""
    if packed.dtype != torch.uint8:
        raise CodecError(f"packed INT4 codes must be uint8, got {packed.dtype}")
    as_int = packed.to(torch.int16)
    low, high = as_int & 0xF, as_int >> 4
    signed = torch.stack((low, high), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)
    return ((signed ^ 8) - 8).to(torch.int8)


def quantize(
    weight: torch.Tensor,
    fmt: str,
    group_size: int,
    scale_dtype: torch.dtype = torch.bfloat16,
    rounding: str = "absmax",
) -> LinearWeight:
    """Encode a float weight ``[..., N, K]`` as ``int4`` or ``int8`` with per-group scales, chosen by
    ``rounding`` (``"absmax"``: absmax / QMAX; ``"signed"``: the signed extreme / -(QMAX + 1), sixteen INT4
    levels; ``"mse"``: the squared-error search)."""
    if fmt == "int4":
        codes, scales = _scales_and_codes(weight, group_size, INT4_MAX, scale_dtype, rounding)
        return LinearWeight("int4", pack_int4(codes), scales, group_size)
    if fmt == "int8":
        codes, scales = _scales_and_codes(weight, group_size, INT8_MAX, scale_dtype, rounding)
        return LinearWeight("int8", codes, scales, group_size)
    raise CodecError(f"cannot quantise to {fmt!r}; expected 'int4' or 'int8'")


def integer_codes(weight: LinearWeight) -> torch.Tensor:
    """The signed integer codes ``[..., N, K]`` of a quantised weight."""
    if weight.format == "int4":
        return unpack_int4(weight.data)
    if weight.format == "int8":
        return weight.data
    raise CodecError("a dense weight has no integer codes")


def dequantize(weight: LinearWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The weight as a float tensor ``[..., N, K]``; exact in FP32 (rounded once if ``dtype`` is narrower)."""
    if weight.format == "dense":
        return weight.data.to(dtype)
    codes = integer_codes(weight).float()
    group, scales = group_scales(weight)
    grouped = codes.reshape(*codes.shape[:-1], codes.shape[-1] // group, group)
    values = grouped * scales.float().unsqueeze(-1)
    return values.reshape(codes.shape).to(dtype)


def roundtrip_error_bound(weight: LinearWeight, rounding: str = "absmax") -> torch.Tensor:
    """Per-element bound on ``|dequantize(quantize(w, rounding=rounding)) - w|`` in FP32, shaped like the
    weight, for the ``absmax`` and ``signed`` roundings.

    Codes are nearest-integer against the stored scale. Under ``absmax``, ``absmax / scale <= QMAX / (1 - u)``
    with ``u`` the scale dtype's unit roundoff, which stays below ``QMAX + 0.5``: no element is ever clamped
    by more than half a step. Under ``signed`` a value of the other sign as large as the extreme lies
    ``QMAX + 1`` steps out and clamps to ``QMAX``: a whole step. The small factor covers FP32 division rounding.
    """
    if rounding not in ("absmax", "signed"):
        raise CodecError(f"no element-wise bound for rounding {rounding!r}")
    group, scales = group_scales(weight)
    steps = 0.5 if rounding == "absmax" else 1.0
    bound = steps * scales.float().abs() * (1 + 2**-16)
    return bound.repeat_interleave(group, dim=-1)


def group_squared_error(weight: LinearWeight, original: torch.Tensor) -> torch.Tensor:
    """Squared error of each group of a quantised weight against ``original`` (FP32, ``[..., N, K/G]``)."""
    group, scales = group_scales(weight)
    codes = integer_codes(weight).float()
    grouped = original.float().reshape(*codes.shape[:-1], codes.shape[-1] // group, group)
    return _squared_error(grouped, codes.reshape(grouped.shape), scales)


def group_scales(weight: LinearWeight) -> tuple[int, torch.Tensor]:
    """(group size, scales) of a quantized weight."""
    if weight.group_size is None or weight.scales is None:
        raise CodecError("a dense weight has no groups or scales")
    return weight.group_size, weight.scales


def quantized_nbytes(shape: tuple[int, ...], fmt: str, group_size: int, scale_dtype: torch.dtype) -> int:
    """Bytes stored for a ``[..., N, K]`` weight in ``fmt`` (codes + scales)."""
    *lead, k = shape
    rows = 1
    for dim in lead:
        rows *= dim
    scale_bytes = rows * (k // group_size) * scale_dtype.itemsize
    if fmt == "int4":
        return rows * k // 2 + scale_bytes
    if fmt == "int8":
        return rows * k + scale_bytes
    raise CodecError(f"no quantised size for format {fmt!r}")
