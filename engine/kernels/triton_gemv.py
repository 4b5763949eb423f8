"""Triton GEMV kernels for batch-1 decode (and small batches): INT4 / INT8 / 16-bit weights, grouped INT4
experts over a route table, and a fused gate/up + SwiGLU.

Layout for bandwidth: weights are row-major with the reduction axis K contiguous and are read as 32-bit
words, four consecutive words per thread (16-byte loads). Each program owns ``BLOCK_N`` output rows of one
batch row (or one route assignment) and a range of K; it keeps a 2-D FP32 accumulator (one partial per
row and word column) and reduces it across threads once, at the end. Split-K spreads short matrices over
more programs; its partial sums are added in a fixed order afterwards (deterministic). Batch rows are the
fastest grid axis, so programs sharing a weight tile run together and re-reads come from L2.

Decoding costs about three instructions per INT4 value, not a conversion: with the word XOR-ed by
0x88888888 every nibble holds ``code + 8``; OR-ing nibble p (bits 4p..4p+3) into the exponent of 2^23 gives
the float ``2^23 + (code + 8) * 16^p`` exactly, one subtraction leaves ``code * 16^p``, and the ``16^-p``
is folded into the activation (a power of two, so exact). Group scales multiply once per word. Compiled
for sm_90 the INT4 main loop is about 10.6 instructions per weight byte (``python -m engine.kernels.aot``).

Every public function launches through a torch custom op (``torch.ops.kimi.*``, registered with a fake
that only declares the in-place write of ``out``), so ``torch.compile`` keeps the kernels in its graph as
opaque calls instead of breaking the graph at a Triton launch. An explicit ``config`` (launch sweeps,
engine/kernels/aot.py) launches directly.

Interpreter-safe (``TRITON_INTERPRET=1``): no ``tl.dot``, no block pointers, no inline asm, no autotune,
every tile dimension a power of two >= 16.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from engine.kernels.signatures import GemvShape, gemv_shape, grouped_shape, output
from engine.kernels.workspace import scratch

FMT_INT4, FMT_INT8, FMT_DENSE = 0, 1, 2
_FORMATS = {"int4": FMT_INT4, "int8": FMT_INT8, "dense": FMT_DENSE}
_VALUES_PER_WORD = {"int4": 8, "int8": 4, "dense": 1}
# Bit pattern of the float 2^23. Passed to the kernels as an argument, not written as a literal: as an
# immediate it takes LOP3's single immediate slot and ptxas re-materialises every nibble mask with a MOV
# (about 1.7 more instructions per weight byte on sm_90, see engine/kernels/aot.py).
_MAGIC = 0x4B000000


@triton.jit
def _int4_tile(
    w_ptr,
    s_ptr,
    x_ptr,
    rn,
    mask_n,
    t,
    KW,
    stride_wn,
    stride_sn,
    magic,
    GROUP: tl.constexpr,
    WORDS: tl.constexpr,
):
    """FP32 partials ``[BLOCK_N, WORDS]`` of K-tile ``t`` (``KW`` words per row); word w holds inputs
    8w..8w+7, nibble i being input 8w+i."""
    rw = t * WORDS + tl.arange(0, WORDS)
    mask_w = rw < KW
    mask = mask_n[:, None] & mask_w[None, :]
    words = tl.load(w_ptr + rn[:, None] * stride_wn + rw[None, :], mask=mask, other=0)
    biased = words.to(tl.uint32, bitcast=True) ^ 0x88888888  # every nibble: code + 8
    shifted = biased >> 12  # nibbles 5..7 move to positions 2..4
    part = tl.zeros(words.shape, dtype=tl.float32)
    for i in tl.static_range(5):
        v = ((biased & (0xF << (4 * i))) | magic).to(tl.float32, bitcast=True) - (8388608.0 + 8.0 * 16**i)
        xi = tl.load(x_ptr + rw * 8 + i, mask=mask_w, other=0.0).to(tl.float32) * (1.0 / 16**i)
        part += v * xi[None, :]
    for j in tl.static_range(2, 5):
        v = ((shifted & (0xF << (4 * j))) | magic).to(tl.float32, bitcast=True) - (8388608.0 + 8.0 * 16**j)
        xi = tl.load(x_ptr + rw * 8 + 3 + j, mask=mask_w, other=0.0).to(tl.float32) * (1.0 / 16**j)
        part += v * xi[None, :]
    scale = tl.load(s_ptr + rn[:, None] * stride_sn + (rw * 8 // GROUP)[None, :], mask=mask, other=0.0)
    return part * scale.to(tl.float32)


@triton.jit
def _int8_tile(
    w_ptr,
    s_ptr,
    x_ptr,
    rn,
    mask_n,
    t,
    KW,
    stride_wn,
    stride_sn,
    magic,
    GROUP: tl.constexpr,
    WORDS: tl.constexpr,
):
    """As :func:`_int4_tile` for INT8: word w holds inputs 4w..4w+3, byte i = input 4w+i."""
    rw = t * WORDS + tl.arange(0, WORDS)
    mask_w = rw < KW
    mask = mask_n[:, None] & mask_w[None, :]
    words = tl.load(w_ptr + rn[:, None] * stride_wn + rw[None, :], mask=mask, other=0)
    biased = words.to(tl.uint32, bitcast=True) ^ 0x80808080  # every byte: code + 128
    shifted = biased >> 16
    part = tl.zeros(words.shape, dtype=tl.float32)
    for i in tl.static_range(2):
        for half in tl.static_range(2):
            src = biased if half == 0 else shifted
            v = ((src & (0xFF << (8 * i))) | magic).to(tl.float32, bitcast=True) - (
                8388608.0 + 128.0 * 256**i
            )
            xi = tl.load(x_ptr + rw * 4 + 2 * half + i, mask=mask_w, other=0.0).to(tl.float32) * (
                1.0 / 256**i
            )
            part += v * xi[None, :]
    scale = tl.load(s_ptr + rn[:, None] * stride_sn + (rw * 4 // GROUP)[None, :], mask=mask, other=0.0)
    return part * scale.to(tl.float32)


@triton.jit
def _dense_tile(w_ptr, x_ptr, rn, mask_n, t, KW, stride_wn, WORDS: tl.constexpr):
    rk = t * WORDS + tl.arange(0, WORDS)
    mask_k = rk < KW
    w = tl.load(
        w_ptr + rn[:, None] * stride_wn + rk[None, :], mask=mask_n[:, None] & mask_k[None, :], other=0.0
    )
    x = tl.load(x_ptr + rk, mask=mask_k, other=0.0)
    return w.to(tl.float32) * x.to(tl.float32)[None, :]


@triton.jit
def _tile(
    w_ptr,
    s_ptr,
    x_ptr,
    rn,
    mask_n,
    t,
    KW,
    stride_wn,
    stride_sn,
    magic,
    FMT: tl.constexpr,
    GROUP: tl.constexpr,
    WORDS: tl.constexpr,
):
    if FMT == 0:
        part = _int4_tile(w_ptr, s_ptr, x_ptr, rn, mask_n, t, KW, stride_wn, stride_sn, magic, GROUP, WORDS)
    elif FMT == 1:
        part = _int8_tile(w_ptr, s_ptr, x_ptr, rn, mask_n, t, KW, stride_wn, stride_sn, magic, GROUP, WORDS)
    else:
        part = _dense_tile(w_ptr, x_ptr, rn, mask_n, t, KW, stride_wn, WORDS)
    return part


@triton.jit
def _gemv_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    ids_ptr,
    out_ptr,
    N,
    KW,
    SLOTS,
    stride_xb,
    stride_xs,
    stride_we,
    stride_se,
    stride_wn,
    stride_sn,
    stride_split,
    tiles_per_split,
    magic,
    FMT: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    WORDS: tl.constexpr,
    ROUTED: tl.constexpr,
):
    """Grid (rows, N blocks, split-K parts). A row is a batch row, or with ROUTED a (batch, slot) assignment
    whose expert is read from ``ids_ptr``. Writes ``out[split, row, n]`` (FP32 partials, or the result)."""
    row = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    if ROUTED:
        expert = tl.load(ids_ptr + row).to(tl.int64)
        w_ptr += expert * stride_we
        s_ptr += expert * stride_se
        x_ptr += (row // SLOTS).to(tl.int64) * stride_xb + (row % SLOTS).to(tl.int64) * stride_xs
    else:
        x_ptr += row.to(tl.int64) * stride_xb
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = rn < N
    acc = tl.zeros([BLOCK_N, WORDS], dtype=tl.float32)
    for i in range(0, tiles_per_split):
        t = pid_k * tiles_per_split + i
        acc += _tile(w_ptr, s_ptr, x_ptr, rn, mask_n, t, KW, stride_wn, stride_sn, magic, FMT, GROUP, WORDS)
    y = tl.sum(acc, axis=1)
    tl.store(out_ptr + pid_k * stride_split + row * N + rn, y.to(out_ptr.dtype.element_ty), mask=mask_n)


@triton.jit
def _grouped_swiglu_kernel(
    x_ptr,
    wg_ptr,
    sg_ptr,
    wu_ptr,
    su_ptr,
    ids_ptr,
    out_ptr,
    N,
    KW,
    SLOTS,
    stride_xb,
    stride_we,
    stride_se,
    stride_wn,
    stride_sn,
    num_tiles,
    magic,
    GROUP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    WORDS: tl.constexpr,
):
    """Grid (B*S assignments, N blocks): gate and up rows of one expert, then ``silu(gate) * up``."""
    row = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(ids_ptr + row).to(tl.int64)
    x_ptr += (row // SLOTS).to(tl.int64) * stride_xb
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = rn < N
    gate = tl.zeros([BLOCK_N, WORDS], dtype=tl.float32)
    up = tl.zeros([BLOCK_N, WORDS], dtype=tl.float32)
    for t in range(0, num_tiles):
        gate += _int4_tile(
            wg_ptr + expert * stride_we,
            sg_ptr + expert * stride_se,
            x_ptr,
            rn,
            mask_n,
            t,
            KW,
            stride_wn,
            stride_sn,
            magic,
            GROUP,
            WORDS,
        )
        up += _int4_tile(
            wu_ptr + expert * stride_we,
            su_ptr + expert * stride_se,
            x_ptr,
            rn,
            mask_n,
            t,
            KW,
            stride_wn,
            stride_sn,
            magic,
            GROUP,
            WORDS,
        )
    g = tl.sum(gate, axis=1)
    hidden = g * tl.sigmoid(g) * tl.sum(up, axis=1)
    tl.store(out_ptr + row * N + rn, hidden.to(out_ptr.dtype.element_ty), mask=mask_n)


# @triton.jit reads TRITON_INTERPRET when a function is decorated. The interpreter needs Triton's own
# jit helpers (tl.zeros, tl.sigmoid, ...) interpreted as well, so it must be set before triton is imported.
KERNELS_INTERPRETED = isinstance(_gemv_kernel, InterpretedFunction)
INTERPRETED = KERNELS_INTERPRETED and isinstance(tl.standard.zeros, InterpretedFunction)


@dataclass(frozen=True)
class LaunchConfig:
    block_n: int
    block_k: int  # inputs per K tile
    split_k: int
    num_warps: int = 4
    num_stages: int = 3


def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 1


# Tiles of 64 rows x 32 words (one 16-byte load per thread per row; a 2-D accumulator of 16 registers).
_TILES = {"int4": (64, 256), "int8": (64, 128), "dense": (32, 128)}


def launch_config(
    fmt: str, rows: int, n: int, k: int, device, *, split: bool = True, block_n: int | None = None
) -> LaunchConfig:
    """A launch configuration from the shape alone (no autotuning, so runs are reproducible).

    ``rows`` is the number of batch rows or route assignments. Split-K doubles until the grid has about
    four waves of programs per SM or each part would get fewer than two K tiles.
    """
    tile_n, block_k = _TILES[fmt]
    tile_n = block_n or tile_n
    tiles = triton.cdiv(k, block_k)
    programs = triton.cdiv(n, tile_n) * rows
    target = 4 * _sm_count(torch.device(device))
    split_k = 1
    while split and programs * split_k < target and tiles // (2 * split_k) >= 2 and split_k < 16:
        split_k *= 2
    return LaunchConfig(tile_n, block_k, split_k)


def _words(fmt: str, data: torch.Tensor) -> torch.Tensor:
    """Packed codes as int32 words (the kernels' 16-byte loads need K to fill whole words)."""
    if fmt == "dense":
        return data
    if data.shape[-1] % 4 or data.data_ptr() % 4:
        raise ValueError(
            f"{fmt} rows of {data.shape[-1]} bytes are not whole 32-bit words (K % {2 * _VALUES_PER_WORD[fmt]})"
        )
    return data.view(torch.int32)


def _launch(
    fmt, x, data, scales, ids, target, rows, slots, n, k, stride_xb, stride_xs, group, cfg: LaunchConfig
):
    words = _words(fmt, data)
    per_word = _VALUES_PER_WORD[fmt]
    if cfg.block_k % per_word or cfg.block_k // per_word < 16:
        raise ValueError(f"block_k {cfg.block_k} must hold at least 16 words of {per_word} values")
    tiles_per_split = triton.cdiv(triton.cdiv(k, cfg.block_k), cfg.split_k)
    grid = (rows, triton.cdiv(n, cfg.block_n), cfg.split_k)
    _gemv_kernel[grid](
        x, words, words if scales is None else scales, words if ids is None else ids, target, n, k // per_word, slots,
        stride_xb, stride_xs,
        words.stride(0) if ids is not None else 0,
        scales.stride(0) if ids is not None else 0,
        words.stride(-2), 0 if scales is None else scales.stride(-2),
        rows * n, tiles_per_split, _MAGIC,
        FMT=_FORMATS[fmt], GROUP=group or 1, BLOCK_N=cfg.block_n, WORDS=cfg.block_k // per_word,
        ROUTED=ids is not None, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip


def _finish(target: torch.Tensor, out: torch.Tensor, split_k: int) -> torch.Tensor:
    if split_k > 1:
        # Fixed-order reduction of the split-K partials: deterministic, unlike atomics.
        out.copy_(target.sum(dim=0).view(out.shape))
    return out


def _gemv_into(fmt, x, data, scales, group, out, config: LaunchConfig | None) -> None:
    shape = GemvShape(x.shape[0], data.shape[0], x.shape[1])
    cfg = config or launch_config(fmt, shape.batch, shape.n, shape.k, x.device)
    target = out if cfg.split_k == 1 else scratch((cfg.split_k, shape.batch, shape.n), x.device)
    _launch(fmt, x, data, scales, None, target, shape.batch, 1, shape.n, shape.k, x.stride(0), 0, group, cfg)
    _finish(target, out, cfg.split_k)


def _grouped_gemv_into(x, codes, scales, route_ids, group_size, out, config: LaunchConfig | None) -> None:
    shape = grouped_shape(x, codes, scales, route_ids, group_size)
    rows = shape.batch * shape.slots
    cfg = config or launch_config("int4", rows, shape.n, shape.k, x.device)
    target = out if cfg.split_k == 1 else scratch((cfg.split_k, rows, shape.n), x.device)
    stride_xs = shape.k if shape.per_slot_input else 0
    stride_xb = shape.slots * shape.k if shape.per_slot_input else shape.k
    _launch(
        "int4", x, codes, scales, route_ids, target, rows, shape.slots, shape.n, shape.k, stride_xb, stride_xs,
        group_size, cfg,
    )  # fmt: skip
    _finish(target, out, cfg.split_k)


def _grouped_swiglu_into(
    x, gate_codes, gate_scales, up_codes, up_scales, route_ids, group_size, out, config: LaunchConfig | None
) -> None:
    shape = grouped_shape(x, gate_codes, gate_scales, route_ids, group_size)
    rows = shape.batch * shape.slots
    # Two accumulators: half the rows per program of the plain GEMV; no split-K (SiLU needs whole sums).
    cfg = config or launch_config("int4", rows, shape.n, shape.k, x.device, split=False, block_n=32)
    gate_words, up_words = _words("int4", gate_codes), _words("int4", up_codes)
    grid = (rows, triton.cdiv(shape.n, cfg.block_n))
    _grouped_swiglu_kernel[grid](
        x, gate_words, gate_scales, up_words, up_scales, route_ids, out, shape.n, shape.k // 8, shape.slots, shape.k,
        gate_words.stride(0), gate_scales.stride(0), gate_words.stride(1), gate_scales.stride(1),
        triton.cdiv(shape.k, cfg.block_k), _MAGIC,
        GROUP=group_size, BLOCK_N=cfg.block_n, WORDS=cfg.block_k // 8,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip


# The custom ops: checked, allocated arguments in, `out` written in place. group_size 0 means "none".
@torch.library.custom_op("kimi::gemv", mutates_args=("out",))
def _gemv_op(fmt: str, x: torch.Tensor, data: torch.Tensor, scales: torch.Tensor | None, group_size: int,
             out: torch.Tensor) -> None:  # fmt: skip
    _gemv_into(fmt, x, data, scales, group_size or None, out, None)


@torch.library.custom_op("kimi::grouped_gemv", mutates_args=("out",))
def _grouped_gemv_op(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, route_ids: torch.Tensor,
                     group_size: int, out: torch.Tensor) -> None:  # fmt: skip
    _grouped_gemv_into(x, codes, scales, route_ids, group_size, out, None)


@torch.library.custom_op("kimi::grouped_swiglu", mutates_args=("out",))
def _grouped_swiglu_op(x: torch.Tensor, gate_codes: torch.Tensor, gate_scales: torch.Tensor, up_codes: torch.Tensor,
                       up_scales: torch.Tensor, route_ids: torch.Tensor, group_size: int,
                       out: torch.Tensor) -> None:  # fmt: skip
    _grouped_swiglu_into(x, gate_codes, gate_scales, up_codes, up_scales, route_ids, group_size, out, None)


for _op in (_gemv_op, _grouped_gemv_op, _grouped_swiglu_op):
    _op.register_fake(lambda *args: None)  # writes `out`, returns nothing: no shapes to compute

LAUNCH_DIRECTLY = [
    False
]  # aot.capture: launch without the custom ops, whose fakes would swallow meta tensors


@contextmanager
def direct_launches() -> Iterator[None]:
    """Within, the public functions launch their kernels directly instead of through the custom ops
    (the AOT compiler intercepts those launches on meta tensors; dispatch would run the fakes)."""
    LAUNCH_DIRECTLY[0] = True
    try:
        yield
    finally:
        LAUNCH_DIRECTLY[0] = False


def _gemv(fmt, x, data, scales, group, out, out_dtype, config: LaunchConfig | None):
    shape = gemv_shape(fmt, x, data, scales, group)
    out = output(out, (shape.batch, shape.n), out_dtype or x.dtype, x.device)
    if x.stride(1) != 1:
        x = x.contiguous()
    if config is None and not LAUNCH_DIRECTLY[0]:
        torch.ops.kimi.gemv(fmt, x, data, scales, group or 0, out)
    else:
        _gemv_into(fmt, x, data, scales, group, out, config)
    return out


def w4a16_gemv(x, codes, scales, group_size, *, out=None, out_dtype=None, config=None):
    return _gemv("int4", x, codes, scales, group_size, out, out_dtype, config)


def w8a16_gemv(x, codes, scales, group_size, *, out=None, out_dtype=None, config=None):
    return _gemv("int8", x, codes, scales, group_size, out, out_dtype, config)


def w16a16_gemv(x, weight, *, out=None, out_dtype=None, config=None):
    return _gemv("dense", x, weight, None, None, out, out_dtype, config)


def w4a16_grouped_gemv(x, codes, scales, route_ids, group_size, *, out=None, out_dtype=None, config=None):
    shape = grouped_shape(x, codes, scales, route_ids, group_size)
    out = output(out, (shape.batch, shape.slots, shape.n), out_dtype or x.dtype, x.device)
    if config is None and not LAUNCH_DIRECTLY[0]:
        torch.ops.kimi.grouped_gemv(x, codes, scales, route_ids, group_size, out)
    else:
        _grouped_gemv_into(x, codes, scales, route_ids, group_size, out, config)
    return out


def w4a16_grouped_swiglu(
    x, gate_codes, gate_scales, up_codes, up_scales, route_ids, group_size, *, out=None, config=None
):
    shape = grouped_shape(x, gate_codes, gate_scales, route_ids, group_size)
    if grouped_shape(x, up_codes, up_scales, route_ids, group_size) != shape:
        raise ValueError("gate and up banks must have the same shape")
    if shape.per_slot_input:
        raise ValueError("the gate/up projection takes x as [B, K]")
    out = output(out, (shape.batch, shape.slots, shape.n), x.dtype, x.device)
    args = (x, gate_codes, gate_scales, up_codes, up_scales, route_ids, group_size, out)
    if config is None and not LAUNCH_DIRECTLY[0]:
        torch.ops.kimi.grouped_swiglu(*args)
    else:
        _grouped_swiglu_into(*args, config)
    return out


def triton_unavailable(device_type: str) -> str | None:
    """Why these kernels cannot run on ``device_type`` now (None when they can)."""
    if device_type == "cuda":
        if not torch.cuda.is_available():
            return "CUDA is not available"
        if KERNELS_INTERPRETED:
            return (
                "TRITON_INTERPRET=1 was set when engine.kernels was imported, so the kernels are interpreted"
            )
        return None
    if device_type == "cpu":
        if INTERPRETED:
            return None
        if KERNELS_INTERPRETED:
            return (
                "TRITON_INTERPRET=1 was set after triton itself was imported; the interpreter needs it "
                "before the first `import triton`"
            )
        return (
            "Triton kernels run on the CPU only in the interpreter; set TRITON_INTERPRET=1 before triton "
            "is first imported (e.g. in the environment)"
        )
    return f"no Triton backend for {device_type}"
