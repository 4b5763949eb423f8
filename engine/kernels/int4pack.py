"""W4A16 on the CPU through torch's own INT4 kernel (``aten._weight_int4pack_mm_for_cpu``), BF16 activations.

The artifact's symmetric codes repack exactly: torch's kernel computes ``(q - 8) * scale + zero`` per
group from unsigned nibbles ``q``, so ``q = code + 8`` with ``zero = 0`` and our scales reproduces
``code * scale`` bit for bit (checked by tests/kernels/test_int4pack.py). The packed layout is made once at
load (``pack``); the kernel needs ``N`` to be a multiple of 16, so the packed rows are padded with code 0
(a zero weight), the scales keep the real ``N`` (padded per call when it is not a multiple of 16: only
tiny projections) and the padding is cut from the output. Activations are rounded to BF16 (its FP32-activation path
is a slow scalar loop), so results carry BF16 precision whatever ``out`` is. Scales must be BF16: FP16 scales
do not convert exactly and are refused.

Expert banks run as a custom op (``kimi_int4pack::grouped_gemv``): opaque to torch.compile, it reads
the route ids from host memory (on the CPU there is no device to synchronise with) and multiplies each
route's expert in place, with no gathered copy of the bank. A one-expert bank with many rows is the
prefill form: one GEMM over all the rows routed to that expert.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.codec import unpack_int4
from engine.kernels import reference, registry  # noqa: F401  (reference defines the operations)
from engine.kernels.signatures import output

ACTIVATION = torch.bfloat16
ROW_MULTIPLE = 16  # the packer's requirement on N
_mm = torch.ops.aten._weight_int4pack_mm_for_cpu.default


def _variant(op: str, description: str):
    """Register ``int4pack`` for ``op``: the artifact's codes packed at load, BF16 results, a GEMM."""
    return registry.register(
        op,
        "int4pack",
        backend="torch-cpu",
        description=description,
        pack=pack,
        precision=torch.bfloat16,
        many_rows=True,
    )


def pack(codes: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Artifact INT4 ``codes [..., N, K/2]`` + BF16 ``scales [..., N, K/G]`` -> torch's int4pack
    ``[..., N16, K/2]`` (N padded to a multiple of 16) and ``scales_and_zeros [..., K/G, N, 2]``."""
    if codes.dtype != torch.uint8 or codes.device.type != "cpu":
        raise ValueError(f"int4pack packs uint8 codes on the CPU, got {codes.dtype} on {codes.device}")
    if scales.dtype != torch.bfloat16:
        raise ValueError(
            f"int4pack needs BF16 scales ({scales.dtype} does not convert exactly); select reference"
        )
    flat = codes.reshape(-1, *codes.shape[-2:])  # one matrix at a time: a bank's int32 copy would be large
    packed = torch.stack([_pack_matrix(matrix) for matrix in flat]).reshape(
        *codes.shape[:-2], -1, codes.shape[-1]
    )
    both = torch.stack([scales, torch.zeros_like(scales)], dim=-1).transpose(-3, -2)
    return packed, both.contiguous()


def _pack_matrix(codes: torch.Tensor) -> torch.Tensor:
    unsigned = unpack_int4(codes).to(torch.int32) + 8
    unsigned = F.pad(unsigned, (0, 0, 0, -codes.shape[0] % ROW_MULTIPLE), value=8)  # code 0: a zero weight
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(unsigned, 1)


def _check(x_k: int, packed: torch.Tensor, scales: torch.Tensor, group: int, lead: int) -> None:
    if packed.ndim != lead + 2 or scales.ndim != lead + 3 or packed.dtype != torch.uint8:
        raise ValueError("int4pack weights must come from engine.kernels.int4pack.pack")
    if packed.shape[-1] * 2 != x_k or scales.shape[-3] * group != x_k:
        raise ValueError(
            f"int4pack weight has {packed.shape[-1]} columns and {scales.shape[-3]} groups of {group}, "
            f"expected {x_k // 2} columns for K={x_k}"
        )


def _kernel(x: torch.Tensor, packed: torch.Tensor, group: int, scales: torch.Tensor) -> torch.Tensor:
    """``x [M, K] @ W^T`` for one packed matrix, ``[M, N]`` with the padding cut off."""
    n = scales.shape[-2]
    if packed.shape[0] != n:
        scales = F.pad(scales, (0, 0, 0, packed.shape[0] - n), value=0.0)
    return _mm(x, packed, group, scales)[:, :n]


@_variant("w4a16_gemv", "torch's CPU int4pack GEMM (BF16 activations), codes repacked as code+8 at load")
def w4a16_gemv(x, packed, scales_and_zeros, group_size, *, out=None, out_dtype=None):
    _check(x.shape[-1], packed, scales_and_zeros, group_size, 0)
    out = output(out, (x.shape[0], scales_and_zeros.shape[-2]), out_dtype or x.dtype, x.device)
    out.copy_(_kernel(x.to(ACTIVATION).contiguous(), packed, group_size, scales_and_zeros))
    return out


@torch.library.custom_op("kimi_int4pack::grouped_gemv", mutates_args=("out",), device_types="cpu")
def _grouped(
    x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, route_ids: torch.Tensor, group: int,
    out: torch.Tensor,
) -> None:  # fmt: skip
    """``out[b, s] = x[b(, s)] @ bank[route_ids[b, s]]^T``; x is BF16 [B, K] or [B, S, K]."""
    if packed.shape[0] == 1 and x.ndim == 2:  # one expert for every row: a GEMM (prefill)
        out.copy_(_kernel(x, packed[0], group, scales[0]).unsqueeze(1).expand_as(out))
        return
    ids = route_ids.tolist()  # host memory on the CPU: no device synchronisation
    rows = [
        x[b, s : s + 1] if x.ndim == 3 else x[b : b + 1]
        for b, slots in enumerate(ids)
        for s in range(len(slots))
    ]
    experts = [e for slots in ids for e in slots]
    results = [_kernel(row, packed[e], group, scales[e]) for row, e in zip(rows, experts, strict=True)]
    torch.cat(results, out=out.view(-1, out.shape[-1]))


@_grouped.register_fake
def _(x, packed, scales, route_ids, group, out) -> None:
    return None


@_variant(
    "w4a16_grouped_gemv",
    "each route's expert through torch's CPU int4pack GEMM (a custom op; no gathered copy)",
)
def w4a16_grouped_gemv(x, packed, scales_and_zeros, route_ids, group_size, *, out=None, out_dtype=None):
    _check(x.shape[-1], packed, scales_and_zeros, group_size, 1)
    batch, slots = route_ids.shape
    out = output(out, (batch, slots, scales_and_zeros.shape[-2]), out_dtype or x.dtype, x.device)
    result = out if out.dtype == ACTIVATION else torch.empty(out.shape, dtype=ACTIVATION)
    _grouped(x.to(ACTIVATION).contiguous(), packed, scales_and_zeros, route_ids, group_size, result)
    if result is not out:
        out.copy_(result)
    return out


@_variant(
    "w4a16_grouped_swiglu", "gate and up through the int4pack grouped GEMV (BF16), silu(gate) * up in FP32"
)
def w4a16_grouped_swiglu(x, gate, gate_scales, up, up_scales, route_ids, group_size, *, out=None):
    batch, slots = route_ids.shape
    if x.ndim != 2:
        raise ValueError("the gate/up projection takes x as [B, K]")
    out = output(out, (batch, slots, gate_scales.shape[-2]), x.dtype, x.device)
    g = w4a16_grouped_gemv(x, gate, gate_scales, route_ids, group_size, out_dtype=ACTIVATION)
    u = w4a16_grouped_gemv(x, up, up_scales, route_ids, group_size, out_dtype=ACTIVATION)
    out.copy_(F.silu(g.float()) * u.float())
    return out
