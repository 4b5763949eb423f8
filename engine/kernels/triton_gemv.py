"""Triton GEMV kernels for batch-1 decode (and small batches): INT4 / INT8 / 16-bit weights, grouped INT4
experts over a route table, and a fused gate/up + SwiGLU.

Layout for bandwidth: weights are row-major with the reduction axis K contiguous and are read as 32-bit
words, four consecutive words per thread (16-byte loads, ``evict_first``: each is read once). Each program
owns ``BLOCK_N`` output rows of one batch row (or one route assignment) and a range of K tiles; the next
tile's words are loaded before the current one is decoded (a register double buffer). Batch rows are the
fastest grid axis, so programs sharing a weight tile run together and re-reads come from L2.

Decoding costs about three instructions per INT4 value, not a conversion: with the word XOR-ed by
0x88888888 every nibble holds ``code + 8``; OR-ing nibble p (bits 4p..4p+3) into the exponent of 2^23 gives
the float ``2^23 + (code + 8) * 16^p`` exactly, one subtraction leaves ``code * 16^p``. x is permuted once
per GEMV (``_permute_kernel``) to FP32 code-position-major with the ``16^-p`` folded in (a power of two,
so exact): the loop reads it as 128-bit vectors in the words' own order. Products are summed per scale
group and each group sum multiplied once by its scale (``[BLOCK_N, groups]`` scales per tile, loaded once,
in the sums' register layout). Compiled for sm_90 the INT4 loop has no barrier and no spill and takes
about 8.5 instructions per weight byte on Triton 3.6 and 3.9 (``kimi-engine kernels --compile sm_90``).

Split-K spreads short matrices over more programs, with a split that divides the K tiles (no idle or
short part). Each part stores an FP32 partial; the last part to arrive at its output block (an atomic
counter, re-armed by that part) adds the partials in a fixed order and writes the output dtype: one
kernel, deterministic.

Every public function launches through a torch custom op (``torch.ops.kimi.*``, registered with a fake
that only declares the in-place write of ``out``), so ``torch.compile`` keeps the kernels in its graph as
opaque calls instead of breaking the graph at a Triton launch. An explicit ``config`` (launch sweeps,
engine/kernel_tools/aot.py) launches directly.

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
from engine.kernels.workspace import counters, scratch

FMT_INT4, FMT_INT8, FMT_DENSE = 0, 1, 2
_FORMATS = {"int4": FMT_INT4, "int8": FMT_INT8, "dense": FMT_DENSE}
_VALUES_PER_WORD = {"int4": 8, "int8": 4, "dense": 1}
# Bit pattern of the float 2^23. Passed to the kernels as an argument, not written as a literal: as an
# immediate it takes LOP3's single immediate slot and ptxas re-materialises every nibble mask with a MOV
# (about 1.7 more instructions per weight byte on sm_90, see engine/kernel_tools/aot.py).
_MAGIC = 0x4B000000


@triton.jit
def _load_words(w_ptr, rn, mask_n, t, end, stride_wn, GPT: tl.constexpr, WPT: tl.constexpr):
    """Weight words of K-tile ``t`` as ``[BLOCK_N, GPT, WPT]``: GPT scale groups (or parts of one) of WPT
    words, words from ``end`` on masked (the end of K or of this split's part: a prefetch past the last
    tile loads nothing). Loaded as a 2-D tile and reshaped, so every Triton lays it out K-fastest with
    16-byte loads (Triton 3.6 spread a 3-D load's threads over rows instead: uncoalesced, x unshared).
    Streamed once, so ``evict_first`` keeps x and the scales in cache."""
    col = t * (GPT * WPT) + tl.arange(0, GPT * WPT)
    mask = mask_n[:, None] & (col < end)[None, :]
    words = tl.load(
        w_ptr + rn[:, None] * stride_wn + col[None, :], mask=mask, other=0, eviction_policy="evict_first"
    )
    return tl.reshape(words, [rn.shape[0], GPT, WPT])


@triton.jit
def _group_sums(words, xp_ptr, t, KW, magic, FMT: tl.constexpr, GPT: tl.constexpr, WPT: tl.constexpr):
    """Unscaled FP32 dot products ``[BLOCK_N, GPT]`` of K-tile ``t``, one per (row, scale group part).

    ``xp`` is x nibble-major (see :func:`_permute_kernel`): row p holds the inputs of code position p of
    every word, already multiplied by the power of two the position's decode leaves in the value."""
    col = t * (GPT * WPT) + tl.arange(0, GPT)[:, None] * WPT + tl.arange(0, WPT)[None, :]
    mask_w = col < KW
    part = tl.zeros(words.shape, dtype=tl.float32)
    if FMT == 0:
        biased = words.to(tl.uint32, bitcast=True) ^ 0x88888888  # every nibble: code + 8
        shifted = biased >> 12  # nibbles 5..7 move to positions 2..4 (below the mantissa's top)
        for p in tl.static_range(5):
            v = ((biased & (0xF << (4 * p))) | magic).to(tl.float32, bitcast=True) - (8388608.0 + 8.0 * 16**p)
            part += v * tl.load(xp_ptr + p * KW + col, mask=mask_w, other=0.0)[None, :, :]
        for p in tl.static_range(2, 5):
            v = ((shifted & (0xF << (4 * p))) | magic).to(tl.float32, bitcast=True) - (
                8388608.0 + 8.0 * 16**p
            )
            part += v * tl.load(xp_ptr + (p + 3) * KW + col, mask=mask_w, other=0.0)[None, :, :]
    else:
        biased = words.to(tl.uint32, bitcast=True) ^ 0x80808080  # every byte: code + 128
        shifted = biased >> 16  # bytes 2, 3 move to positions 0, 1
        for half in tl.static_range(2):
            for p in tl.static_range(2):
                src = biased if half == 0 else shifted
                v = ((src & (0xFF << (8 * p))) | magic).to(tl.float32, bitcast=True) - (
                    8388608.0 + 128.0 * 256**p
                )
                part += v * tl.load(xp_ptr + (2 * half + p) * KW + col, mask=mask_w, other=0.0)[None, :, :]
    return tl.sum(part, axis=2)


@triton.jit
def _scales(s_ptr, rn, mask_n, t, KW, stride_sn, scale_step, PER_WORD: tl.constexpr, GROUP: tl.constexpr,
            GPT: tl.constexpr, WPT: tl.constexpr):  # fmt: skip
    """The ``[BLOCK_N, GPT]`` scales of K-tile ``t``: one per group part, no redundant loads.

    When each part is a whole group the columns are ``t * scale_step + g`` with ``scale_step`` (= GPT) a
    runtime argument: Triton then sees columns contiguous but not 16-byte aligned and lays the load out
    like the per-group sums (threads along K first, one scale each), so no layout conversion, and no
    shared-memory round trip with barriers, is needed in the loop (Triton 3.6 converted otherwise)."""
    g = tl.arange(0, GPT)
    first = t * (GPT * WPT) + g * WPT  # first word of each part
    mask = mask_n[:, None] & (first < KW)[None, :]
    if WPT * PER_WORD == GROUP:
        col = t * scale_step + g
    else:
        col = first * PER_WORD // GROUP
    s = tl.load(s_ptr + rn[:, None] * stride_sn + col[None, :], mask=mask, other=0.0)
    return s.to(tl.float32)


@triton.jit
def _permute_kernel(x_ptr, xp_ptr, KW, stride_xr, PER_WORD: tl.constexpr, BLOCK_W: tl.constexpr):
    """x ``[rows, K]`` (any float dtype) -> FP32 code-position-major ``xp[rows, PER_WORD, K / PER_WORD]``:
    ``xp[r, p, w] = x[r, PER_WORD * w + p] * 2^-e(p)``, where ``2^e(p)`` is the power of two the decode of
    position p leaves in its value (a power of two, so exact). The GEMV loop then reads x as 128-bit
    vectors in the weight words' own order instead of 16-bit loads strided by a word."""
    row = tl.program_id(0).to(tl.int64)
    rw = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    p = tl.arange(0, PER_WORD)
    mask = (rw < KW)[None, :]
    x = tl.load(x_ptr + row * stride_xr + rw[None, :] * PER_WORD + p[:, None], mask=mask, other=0.0)
    if PER_WORD == 8:
        exponent = 4 * tl.where(p < 5, p, p - 3)  # nibbles 5..7 are decoded from the word shifted by 12
    else:
        exponent = 8 * (p % 2)  # bytes 2, 3 are decoded from the word shifted by 16
    factor = ((127 - exponent) << 23).to(tl.float32, bitcast=True)  # 2^-exponent, exactly
    out = xp_ptr + row * (PER_WORD * KW) + p[:, None] * KW + rw[None, :]
    tl.store(out, x.to(tl.float32) * factor[:, None], mask=mask)


@triton.jit
def _quantised_dot(xp_ptr, w_ptr, s_ptr, rn, mask_n, first, tiles, KW, stride_wn, stride_sn, magic,
                   FMT: tl.constexpr, GROUP: tl.constexpr, BLOCK_N: tl.constexpr, GPT: tl.constexpr,
                   WPT: tl.constexpr):  # fmt: skip
    """``[BLOCK_N, GPT]`` FP32 partial dot products of K-tiles ``first .. first + tiles - 1``. Per tile:
    sums per scale group, then one multiply by the tile's ``[BLOCK_N, GPT]`` scales; the next tile's
    words are loaded before this tile is decoded (a register double buffer: no shared memory, no
    barrier in the loop)."""
    acc = tl.zeros([BLOCK_N, GPT], dtype=tl.float32)
    end = tl.minimum(KW, (first + tiles) * (GPT * WPT))
    words = _load_words(w_ptr, rn, mask_n, first, end, stride_wn, GPT, WPT)
    for i in range(0, tiles):
        t = first + i
        following = _load_words(w_ptr, rn, mask_n, t + 1, end, stride_wn, GPT, WPT)
        sums = _group_sums(words, xp_ptr, t, KW, magic, FMT, GPT, WPT)
        acc += sums * _scales(s_ptr, rn, mask_n, t, KW, stride_sn, GPT, 8 // (FMT + 1), GROUP, GPT, WPT)
        words = following
    return acc


@triton.jit
def _dense_dot(
    x_ptr, w_ptr, rn, mask_n, first, tiles, K, stride_wn, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr
):
    """``[BLOCK_N, BLOCK_K]`` FP32 partials of 16-bit weight rows, next tile prefetched as above."""
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    offsets = rn[:, None] * stride_wn + rk[None, :]
    end = tl.minimum(K, (first + tiles) * BLOCK_K)
    mask = mask_n[:, None] & (first * BLOCK_K + rk < end)[None, :]
    w = tl.load(w_ptr + first * BLOCK_K + offsets, mask=mask, other=0.0, eviction_policy="evict_first")
    for i in range(0, tiles):
        k0 = (first + i) * BLOCK_K
        live = mask_n[:, None] & (k0 + BLOCK_K + rk < end)[None, :]
        following = tl.load(
            w_ptr + k0 + BLOCK_K + offsets, mask=live, other=0.0, eviction_policy="evict_first"
        )
        # x as a full [BLOCK_N, BLOCK_K] tile (row stride 0): it gets the weights' register layout, so the
        # broadcast needs no shared-memory layout conversion (2 barriers per iteration otherwise).
        x = tl.load(x_ptr + k0 + rk[None, :] + 0 * rn[:, None], mask=(k0 + rk < K)[None, :], other=0.0)
        acc += w.to(tl.float32) * x.to(tl.float32)
        w = following
    return acc


@triton.jit
def _finish_rows(y, out_ptr, part_ptr, count_ptr, row, pid_n, pid_k, rn, mask_n, N, ROWS,
                 SPLIT_K: tl.constexpr):  # fmt: skip
    """Store ``y`` (FP32 ``[BLOCK_N]``) as output row ``row``. With split-K every part stores its FP32
    partial; the part that arrives last at the (row, N block) counter adds all parts in a fixed order
    (deterministic), writes the output dtype and re-arms the counter: no extra kernel."""
    if SPLIT_K == 1:
        tl.store(out_ptr + row * N + rn, y.to(out_ptr.dtype.element_ty), mask=mask_n)
    else:
        tl.store(part_ptr + (pid_k * ROWS + row) * N + rn, y, mask=mask_n)
        tl.debug_barrier()  # every thread's partial is stored before the counter is released
        counter = count_ptr + row * tl.num_programs(1) + pid_n
        if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == SPLIT_K - 1:
            total = tl.zeros(y.shape, dtype=tl.float32)
            for s in tl.static_range(SPLIT_K):
                offsets = (s * ROWS + row) * N + rn
                total += tl.load(part_ptr + offsets, mask=mask_n, other=0.0, cache_modifier=".cg")
            tl.store(out_ptr + row * N + rn, total.to(out_ptr.dtype.element_ty), mask=mask_n)
            tl.store(counter, 0)


# The scale row stride is not specialised (see _scales).
@triton.jit(do_not_specialize=["stride_sn"])
def _gemv_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    ids_ptr,
    out_ptr,
    part_ptr,
    count_ptr,
    N,
    KW,
    SLOTS,
    stride_xb,
    stride_xs,
    stride_we,
    stride_se,
    stride_wn,
    stride_sn,
    tiles_per_split,
    magic,
    FMT: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    GPT: tl.constexpr,
    WPT: tl.constexpr,
    ROUTED: tl.constexpr,
    SPLIT_K: tl.constexpr,
):
    """Grid (rows, N blocks, split-K parts). A row is a batch row, or with ROUTED a (batch, slot) assignment
    whose expert is read from ``ids_ptr``. x is the permuted FP32 ``xp`` for INT4/INT8 (``KW`` words per
    row) and the activations themselves for 16-bit weights (``KW`` = K); a K-tile is ``GPT * WPT`` words."""
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
    first = pid_k * tiles_per_split
    tiles = tl.minimum(tiles_per_split, tl.cdiv(KW, GPT * WPT) - first)
    if FMT == 2:
        acc = _dense_dot(x_ptr, w_ptr, rn, mask_n, first, tiles, KW, stride_wn, BLOCK_N, GPT * WPT)
    else:
        acc = _quantised_dot(
            x_ptr,
            w_ptr,
            s_ptr,
            rn,
            mask_n,
            first,
            tiles,
            KW,
            stride_wn,
            stride_sn,
            magic,
            FMT,
            GROUP,
            BLOCK_N,
            GPT,
            WPT,
        )
    y = tl.sum(acc, axis=1)
    _finish_rows(
        y, out_ptr, part_ptr, count_ptr, row, pid_n, pid_k, rn, mask_n, N, tl.num_programs(0), SPLIT_K
    )


# The scale row stride is not specialised (see _scales).
@triton.jit(do_not_specialize=["stride_sn"])
def _grouped_swiglu_kernel(
    xp_ptr,
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
    GPT: tl.constexpr,
    WPT: tl.constexpr,
):
    """Grid (B*S assignments, N blocks): gate and up rows of one expert, then ``silu(gate) * up``."""
    row = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(ids_ptr + row).to(tl.int64)
    xp_ptr += (row // SLOTS).to(tl.int64) * stride_xb
    wg_ptr += expert * stride_we
    wu_ptr += expert * stride_we
    sg_ptr += expert * stride_se
    su_ptr += expert * stride_se
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = rn < N
    gate = tl.zeros([BLOCK_N, GPT], dtype=tl.float32)
    up = tl.zeros([BLOCK_N, GPT], dtype=tl.float32)
    gate_words = _load_words(wg_ptr, rn, mask_n, 0, KW, stride_wn, GPT, WPT)
    up_words = _load_words(wu_ptr, rn, mask_n, 0, KW, stride_wn, GPT, WPT)
    for t in range(0, num_tiles):
        next_gate = _load_words(wg_ptr, rn, mask_n, t + 1, KW, stride_wn, GPT, WPT)
        next_up = _load_words(wu_ptr, rn, mask_n, t + 1, KW, stride_wn, GPT, WPT)
        gate += _group_sums(gate_words, xp_ptr, t, KW, magic, 0, GPT, WPT) * _scales(
            sg_ptr, rn, mask_n, t, KW, stride_sn, GPT, 8, GROUP, GPT, WPT
        )
        up += _group_sums(up_words, xp_ptr, t, KW, magic, 0, GPT, WPT) * _scales(
            su_ptr, rn, mask_n, t, KW, stride_sn, GPT, 8, GROUP, GPT, WPT
        )
        gate_words, up_words = next_gate, next_up
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

    ``rows`` is the number of batch rows or route assignments. Split-K takes the smallest split (at most
    16) that divides the K tiles into parts of two or more and fills about four waves of programs per SM,
    or the largest such split when none does: every part gets the same number of tiles, none is idle.
    """
    tile_n, block_k = _TILES[fmt]
    tile_n = block_n or tile_n
    tiles = triton.cdiv(k, block_k)
    programs = triton.cdiv(n, tile_n) * rows
    target = 4 * _sm_count(torch.device(device))
    split_k = 1
    if split and programs < target:
        even = [s for s in range(2, 17) if tiles % s == 0 and tiles // s >= 2]
        enough = [s for s in even if programs * s >= target]
        split_k = min(enough) if enough else max(even, default=1)
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


def _tile_shape(fmt: str, group: int | None, words: int) -> tuple[int, int]:
    """``(GPT, WPT)``: a K-tile of ``words`` words as GPT parts of WPT words, each part inside one scale
    group. WPT is at most 4 words (one 16-byte load per thread): then the per-part sums stay inside a
    thread and the ``[BLOCK_N, GPT]`` scales load in the sums' own register layout (wider parts made
    Triton convert layouts through shared memory, with barriers in the loop). Larger groups load a
    scale once per part."""
    if fmt == "dense":
        return 1, words
    if group is None:
        raise ValueError(f"{fmt} weights need a group size")
    group_words = group // _VALUES_PER_WORD[fmt]
    part = min(group_words & -group_words, 4)
    return words // part, part


def permuted(fmt: str, x: torch.Tensor) -> torch.Tensor:
    """x ``[rows, K]`` as the FP32 position-major ``[rows, P, K / P]`` the INT4 (P = 8) and INT8 (P = 4)
    GEMV loops read (see ``_permute_kernel``); one small launch per GEMV."""
    per_word = _VALUES_PER_WORD[fmt]
    rows, k = x.shape
    xp = scratch((rows, per_word, k // per_word), x.device)
    grid = (rows, triton.cdiv(k // per_word, _PERMUTE_WORDS))
    _permute_kernel[grid](x, xp, k // per_word, x.stride(0), PER_WORD=per_word, BLOCK_W=_PERMUTE_WORDS)
    return xp


_PERMUTE_WORDS = 128


def _launch(
    fmt, x, data, scales, ids, out, rows, slots, n, k, stride_xb, stride_xs, group, cfg: LaunchConfig
):
    """One GEMV launch; ``x`` is already permuted for INT4/INT8 (strides in its FP32 elements)."""
    words = _words(fmt, data)
    per_word = _VALUES_PER_WORD[fmt]
    if cfg.block_k % per_word or cfg.block_k // per_word < 16:
        raise ValueError(f"block_k {cfg.block_k} must hold at least 16 words of {per_word} values")
    gpt, wpt = _tile_shape(fmt, group, cfg.block_k // per_word)
    tiles_per_split = triton.cdiv(triton.cdiv(k, cfg.block_k), cfg.split_k)
    grid = (rows, triton.cdiv(n, cfg.block_n), cfg.split_k)
    parts, counts = out, out
    if cfg.split_k > 1:
        parts = scratch((cfg.split_k, rows, n), x.device)
        counts = counters(rows * grid[1], x.device)
    _gemv_kernel[grid](
        x, words, words if scales is None else scales, words if ids is None else ids, out, parts, counts,
        n, k // per_word, slots, stride_xb, stride_xs,
        words.stride(0) if ids is not None else 0,
        scales.stride(0) if ids is not None else 0,
        words.stride(-2), 0 if scales is None else scales.stride(-2),
        tiles_per_split, _MAGIC,
        FMT=_FORMATS[fmt], GROUP=group or 1, BLOCK_N=cfg.block_n, GPT=gpt, WPT=wpt,
        ROUTED=ids is not None, SPLIT_K=cfg.split_k, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip


def _gemv_into(fmt, x, data, scales, group, out, config: LaunchConfig | None) -> None:
    shape = GemvShape(x.shape[0], data.shape[0], x.shape[1])
    cfg = config or launch_config(fmt, shape.batch, shape.n, shape.k, x.device)
    if fmt == "dense":
        _launch(fmt, x, data, None, None, out, shape.batch, 1, shape.n, shape.k, x.stride(0), 0, None, cfg)
        return
    xp = permuted(fmt, x)
    _launch(fmt, xp, data, scales, None, out, shape.batch, 1, shape.n, shape.k, xp.stride(0), 0, group, cfg)


def _grouped_gemv_into(x, codes, scales, route_ids, group_size, out, config: LaunchConfig | None) -> None:
    shape = grouped_shape(x, codes, scales, route_ids, group_size)
    rows = shape.batch * shape.slots
    cfg = config or launch_config("int4", rows, shape.n, shape.k, x.device)
    xp = permuted("int4", x.reshape(-1, shape.k))  # [B or B*S, 8, K/8]
    row = xp.stride(0)
    stride_xs, stride_xb = (row, shape.slots * row) if shape.per_slot_input else (0, row)
    _launch(
        "int4", xp, codes, scales, route_ids, out, rows, shape.slots, shape.n, shape.k, stride_xb, stride_xs,
        group_size, cfg,
    )  # fmt: skip


def _grouped_swiglu_into(
    x, gate_codes, gate_scales, up_codes, up_scales, route_ids, group_size, out, config: LaunchConfig | None
) -> None:
    shape = grouped_shape(x, gate_codes, gate_scales, route_ids, group_size)
    rows = shape.batch * shape.slots
    # Two accumulators: half the rows per program of the plain GEMV; no split-K (SiLU needs whole sums).
    cfg = config or launch_config("int4", rows, shape.n, shape.k, x.device, split=False, block_n=32)
    gate_words, up_words = _words("int4", gate_codes), _words("int4", up_codes)
    gpt, wpt = _tile_shape("int4", group_size, cfg.block_k // 8)
    xp = permuted("int4", x)
    grid = (rows, triton.cdiv(shape.n, cfg.block_n))
    _grouped_swiglu_kernel[grid](
        xp, gate_words, gate_scales, up_words, up_scales, route_ids, out, shape.n, shape.k // 8, shape.slots,
        xp.stride(0), gate_words.stride(0), gate_scales.stride(0), gate_words.stride(1), gate_scales.stride(1),
        triton.cdiv(shape.k, cfg.block_k), _MAGIC,
        GROUP=group_size, BLOCK_N=cfg.block_n, GPT=gpt, WPT=wpt,
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
