"""One KDA decode token as a single Triton kernel, and its reference (the model's eager step).

Between a KDA layer's projections and its o_proj, per sequence b and head h (engine/model/kda.py,
`kda_decode_step`):

    q, k, v  = silu(short_conv(window, x))           4-tap causal conv over [window | x]; window rolls by one
    g        = -exp(A_log[h]) * softplus(f + dt_bias) beta = sigmoid(b[h])
    q, k     = l2_normalize(q) / sqrt(d_k), l2_normalize(k)
    S'       = diag(exp(g)) S;   delta = beta (v - S'^T k);   o = S'^T q + (k . q) delta;   S = S' + k delta^T
    out      = rmsnorm(o) * norm_weight * sigmoid(gate)

Shapes: q, k, v, f, gate [B, D] with D = H * d (d_k = d_v = d), b [B, H], conv [B, 3, D, K-1] and the FP32
state [B, H, d, d] updated in place; out [B, D] in the gate's dtype. Given ``f_b_weight`` / ``g_b_weight``
[D, R] (the dense f_b_proj / g_b_proj), f / gate are the low-rank [B, R] rows and each program projects its
head's channels itself (it reads only its rows of the weights: two GEMV launches fewer per layer). The eager step takes about sixty
launches per layer; this takes one: a program per (sequence, head) holds the head's state tile in
registers, reads it once and writes it once. It rounds where the eager code rounds (the convolution's
sum and its SiLU to the activation dtype, the rolled window to the cache's dtype), so the two differ by
FP32 summation order and the SiLU/softplus formulas only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels import registry
from engine.kernels.triton_gemv import LAUNCH_DIRECTLY
from engine.kernels.triton_round import round_to
from engine.model.kda import kda_decode_step

registry.define(
    "kda_decode_step",
    "out[B,D] = gated norm of one delta-rule step after the 4-tap short convs (state [B,H,d,d] in place)",
)


def _check(q, k, v, f, b, gate, conv, q_taps, state, f_b_weight, g_b_weight) -> tuple[int, int, int, int]:
    batch, dim = q.shape
    heads = b.shape[-1]
    head = dim // heads
    taps = q_taps.shape[-1]
    for name, t in (("k", k), ("v", v)):
        if t.shape != (batch, dim):
            raise ValueError(f"kda_decode_step: {name} is {tuple(t.shape)}, q is {(batch, dim)}")
    for name, t, weight in (("f", f, f_b_weight), ("gate", gate, g_b_weight)):
        width = dim if weight is None else weight.shape[-1]
        if t.shape != (batch, width) or (weight is not None and weight.shape != (dim, width)):
            raise ValueError(f"kda_decode_step: {name} {tuple(t.shape)} does not give [B, {dim}]")
    if b.shape != (batch, heads) or dim % heads:
        raise ValueError(f"kda_decode_step: b {tuple(b.shape)} does not split D={dim} into heads")
    if conv.shape != (batch, 3, dim, taps - 1):
        raise ValueError(f"kda_decode_step: conv {tuple(conv.shape)}, expected {(batch, 3, dim, taps - 1)}")
    if state.shape != (batch, heads, head, head) or state.dtype != torch.float32:
        raise ValueError(
            f"kda_decode_step: state {tuple(state.shape)} {state.dtype} is not [B, H, d, d] FP32"
        )
    return batch, dim, heads, taps


@registry.register("kda_decode_step", "reference", backend="torch", description="the model's eager step")
def kda_decode_reference(q, k, v, f, b, gate, conv, q_taps, k_taps, v_taps, a_log, dt_bias, norm_weight,
                         state, *, l2_eps, norm_eps, f_b_weight=None, g_b_weight=None, out=None):  # fmt: skip
    _check(q, k, v, f, b, gate, conv, q_taps, state, f_b_weight, g_b_weight)
    result = kda_decode_step(q, k, v, f, b, gate, conv, q_taps, k_taps, v_taps, a_log, dt_bias, norm_weight,
                             state, l2_eps=l2_eps, norm_eps=norm_eps, f_b_weight=f_b_weight,
                             g_b_weight=g_b_weight)  # fmt: skip
    if out is None:
        return result
    out.copy_(result)
    return out


@triton.jit
def _conv_step(x_ptr, win_ptr, w_ptr, c, TAPS: tl.constexpr):
    """SiLU of the TAPS-tap convolution of channels ``c`` (FP32, rounded as the eager code rounds); the
    window rolls by one. Each thread reads its channels' window before it overwrites them."""
    x = tl.load(x_ptr + c)
    y = tl.zeros(c.shape, dtype=tl.float32)
    if TAPS > 1:
        current = tl.load(win_ptr + c * (TAPS - 1))
        for j in tl.static_range(TAPS - 1):
            y += current.to(tl.float32) * tl.load(w_ptr + c * TAPS + j).to(tl.float32)
            if j + 2 < TAPS:
                following = tl.load(win_ptr + c * (TAPS - 1) + j + 1)
            else:
                following = round_to(x.to(tl.float32), win_ptr.dtype.element_ty)
            tl.store(win_ptr + c * (TAPS - 1) + j, following)
            current = following
    y += x.to(tl.float32) * tl.load(w_ptr + c * TAPS + TAPS - 1).to(tl.float32)
    y = round_to(y, x_ptr.dtype.element_ty).to(tl.float32)
    return round_to(y * tl.sigmoid(y), x_ptr.dtype.element_ty).to(tl.float32)


@triton.jit
def _row(x_ptr, w_ptr, c, R: tl.constexpr, LOW_RANK: tl.constexpr):
    """Channels ``c`` of a [D] row as FP32: loaded, or with LOW_RANK the product of the [R] low-rank row
    with those channels' rows of the [D, R] weight (FP32 sums rounded to the row's dtype, as F.linear)."""
    if LOW_RANK:
        r = tl.arange(0, R)
        low = tl.load(x_ptr + r).to(tl.float32)
        rows = tl.load(w_ptr + c[:, None] * R + r[None, :]).to(tl.float32)
        return round_to(tl.sum(rows * low[None, :], axis=1), x_ptr.dtype.element_ty).to(tl.float32)
    return tl.load(x_ptr + c).to(tl.float32)


@triton.jit
def _kda_decode_kernel(q_ptr, k_ptr, v_ptr, f_ptr, b_ptr, gate_ptr, conv_ptr, qw_ptr, kw_ptr, vw_ptr,
                       alog_ptr, dtb_ptr, nw_ptr, s_ptr, out_ptr, fbw_ptr, gbw_ptr, stride_q, stride_k, stride_v, stride_f,
                       stride_b, stride_g, stride_cb, stride_cw, D, H, l2_eps, norm_eps, scale,
                       TAPS: tl.constexpr, DK: tl.constexpr, R_F: tl.constexpr, R_G: tl.constexpr,
                       LOW_F: tl.constexpr, LOW_G: tl.constexpr):  # fmt: skip
    """Grid (B, H): one (sequence, head) per program, its [DK, DK] state tile in registers."""
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    rk = tl.arange(0, DK)
    c = h * DK + rk  # this head's channels
    window = conv_ptr + b * stride_cb
    q = _conv_step(q_ptr + b * stride_q, window, qw_ptr, c, TAPS)
    k = _conv_step(k_ptr + b * stride_k, window + stride_cw, kw_ptr, c, TAPS)
    v = _conv_step(v_ptr + b * stride_v, window + 2 * stride_cw, vw_ptr, c, TAPS)
    q = q / tl.sqrt(tl.sum(q * q, axis=0) + l2_eps) * scale
    k = k / tl.sqrt(tl.sum(k * k, axis=0) + l2_eps)
    f = _row(f_ptr + b * stride_f, fbw_ptr, c, R_F, LOW_F) + tl.load(dtb_ptr + c).to(tl.float32)
    softplus = tl.where(f > 20.0, f, tl.log(1.0 + tl.exp(tl.minimum(f, 20.0))))  # torch's threshold 20
    decay = tl.exp(-tl.exp(tl.load(alog_ptr + h).to(tl.float32)) * softplus)
    beta = tl.sigmoid(tl.load(b_ptr + b * stride_b + h).to(tl.float32))
    tile = s_ptr + (b * H + h) * DK * DK + rk[:, None] * DK + rk[None, :]
    state = tl.load(tile)
    prediction = tl.sum(state * (decay * k)[:, None], axis=0)
    recalled = tl.sum(state * (decay * q)[:, None], axis=0)
    delta = beta * (v - prediction)
    o = recalled + tl.sum(k * q, axis=0) * delta
    tl.store(tile, state * decay[:, None] + k[:, None] * delta[None, :])
    o = o * tl.rsqrt(tl.sum(o * o, axis=0) / DK + norm_eps)
    gate = _row(gate_ptr + b * stride_g, gbw_ptr, c, R_G, LOW_G)
    y = o * tl.load(nw_ptr + rk).to(tl.float32) * tl.sigmoid(gate)
    tl.store(out_ptr + b * D + c, round_to(y, out_ptr.dtype.element_ty))


def _launch(q, k, v, f, b, gate, conv, q_taps, k_taps, v_taps, a_log, dt_bias, norm_weight, state, out,
            f_b_weight, g_b_weight, l2_eps: float, norm_eps: float) -> None:  # fmt: skip
    batch, dim = q.shape
    heads = b.shape[-1]
    head = dim // heads
    _kda_decode_kernel[(batch, heads)](
        q, k, v, f, b, gate, conv, q_taps, k_taps, v_taps, a_log, dt_bias, norm_weight, state, out,
        f if f_b_weight is None else f_b_weight, gate if g_b_weight is None else g_b_weight,
        q.stride(0), k.stride(0), v.stride(0), f.stride(0), b.stride(0), gate.stride(0), conv.stride(0),
        conv.stride(1), dim, heads, l2_eps, norm_eps, head**-0.5,
        TAPS=q_taps.shape[-1], DK=head, R_F=f.shape[-1], R_G=gate.shape[-1], LOW_F=f_b_weight is not None,
        LOW_G=g_b_weight is not None, num_warps=16 if head >= 128 else 4,
    )  # fmt: skip


@torch.library.custom_op("kimi::kda_decode_step", mutates_args=("conv", "state", "out"))
def _kda_decode_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, f: torch.Tensor, b: torch.Tensor,
                   gate: torch.Tensor, conv: torch.Tensor, q_taps: torch.Tensor, k_taps: torch.Tensor,
                   v_taps: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor, norm_weight: torch.Tensor,
                   state: torch.Tensor, out: torch.Tensor, f_b_weight: torch.Tensor | None,
                   g_b_weight: torch.Tensor | None, l2_eps: float, norm_eps: float) -> None:  # fmt: skip
    _launch(q, k, v, f, b, gate, conv, q_taps, k_taps, v_taps, a_log, dt_bias, norm_weight, state, out,
            f_b_weight, g_b_weight, l2_eps, norm_eps)  # fmt: skip


_kda_decode_op.register_fake(lambda *args: None)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """A [B, X] tensor whose rows are contiguous (a view of a wider projection output stays a view)."""
    return t if t.stride(-1) == 1 else t.contiguous()


@registry.register(
    "kda_decode_step",
    "triton",
    backend="triton",
    description="one program per (sequence, head), state in registers",
)
def kda_decode_triton(q, k, v, f, b, gate, conv, q_taps, k_taps, v_taps, a_log, dt_bias, norm_weight, state,
                      *, l2_eps, norm_eps, f_b_weight=None, g_b_weight=None, out=None):  # fmt: skip
    batch, dim, heads, _ = _check(q, k, v, f, b, gate, conv, q_taps, state, f_b_weight, g_b_weight)
    head = dim // heads
    ranks = [w.shape[-1] for w in (f_b_weight, g_b_weight) if w is not None]
    if any(n & (n - 1) for n in [head, *ranks]) or not (conv.is_contiguous() and state.is_contiguous()):
        raise ValueError(
            "kda_decode_step (triton): needs power-of-two head and low-rank sizes and contiguous conv/state"
        )
    if out is None:
        out = torch.empty(batch, dim, dtype=gate.dtype, device=gate.device)
    q, k, v, f, b, gate = (_rows(t) for t in (q, k, v, f, b, gate))
    taps = tuple(t.contiguous() for t in (q_taps, k_taps, v_taps))
    weights = tuple(None if w is None else w.contiguous() for w in (f_b_weight, g_b_weight))
    args = (q, k, v, f, b, gate, conv, *taps, a_log.contiguous(), dt_bias, norm_weight, state, out, *weights)
    (_launch if LAUNCH_DIRECTLY[0] else torch.ops.kimi.kda_decode_step)(*args, l2_eps, norm_eps)
    return out
