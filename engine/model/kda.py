"""Kimi Delta Attention (KDA): gated delta rule with a per-channel decay, plus its short convolutions.

Per head, with state S [d_k, d_v] and per-token decay g (log space, <= 0, one value per key channel):
    S' = diag(exp(g_t)) S
    S  = S' + beta_t * k_t (v_t - S'^T k_t)^T
    o_t = S^T q_t / sqrt(d_k)
`kda_recurrent_step` runs that for one token (decode); `kda_chunked` computes the same thing 64 tokens at a
time (prefill). Both work in FP32 and update the state in place.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from engine.model.cache import KDAState
from engine.model.config import KimiLinearConfig
from engine.model.linear import Linear, SharedInputLinears
from engine.model.norm import GatedRMSNorm, gated_rms_norm

CHUNK_SIZE = 64
SUB_CHUNK = 16  # inside a chunk, decays are formed element by element only within blocks this long
EXP_FLOOR = -80.0  # e^-80 = 1.8e-35: intra-block decays below it are taken as it
_GROUP_ELEMENTS = 1 << 26  # bound on the largest temporary of the batched (state-independent) phase
_INPUT_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "f_a_proj", "b_proj", "g_a_proj")  # all read x

# A KDA prefill kernel: `kda_chunked`'s signature and contract (q, k, v, g, beta, state -> o; state updated).
ChunkedKernel = Callable[..., torch.Tensor]


def l2_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last axis (fla's in-kernel q/k normalisation, not F.normalize)."""
    return x / torch.sqrt(x.pow(2).sum(-1, keepdim=True) + eps)


def kda_decay(f: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor, num_heads: int) -> torch.Tensor:
    """g = -exp(A_log[h]) * softplus(f + dt_bias), FP32, shape [..., H, d_k]."""
    x = (f.float() + dt_bias.float()).unflatten(-1, (num_heads, -1))
    return -torch.exp(a_log.float().reshape(num_heads, 1)) * F.softplus(x)


def kda_recurrent_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> torch.Tensor:
    """One token. q, k [B, H, d_k] (normalised, q already scaled), v [B, H, d_v], g [B, H, d_k],
    beta [B, H]; state [B, H, d_k, d_v] FP32, updated in place. Returns o [B, H, d_v].

    Both products read the old state, so it is read once and written once: with d = exp(g),
        prediction = S'^T k = S^T (d k),   S'^T q = S^T (d q),   delta = beta (v - prediction),
        o = S_new^T q = S'^T q + (k . q) delta,   S_new = d S + k delta^T.
    The reductions are written as broadcast products summed over d_k (not matmuls), so that Inductor fuses
    each into one pass over the state and the update into one in-place pass (a matmul after the in-place
    update made it copy the state to a transposed buffer and reduce column by column)."""
    decay = g.exp().unsqueeze(-1)  # [B, H, d_k, 1]
    prediction = (state * (decay * k.unsqueeze(-1))).sum(-2)
    recalled = (state * (decay * q.unsqueeze(-1))).sum(-2)
    delta = beta.unsqueeze(-1) * (v - prediction)
    out = recalled + (k * q).sum(-1, keepdim=True) * delta
    state.mul_(decay).add_(k.unsqueeze(-1) * delta.unsqueeze(-2))
    return out


def kda_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    chunk_size: int = CHUNK_SIZE,
) -> torch.Tensor:
    """Many tokens. q, k [B, T, H, d_k], v [B, T, H, d_v], g [B, T, H, d_k], beta [B, T, H]; state as in
    `kda_recurrent_step`. Returns o [B, T, H, d_v].

    Within a chunk, with gamma_t = cumsum(g) from the chunk start and S0 the state entering the chunk, the
    delta-rule update vectors U (rows u_t = beta_t (v_t - S'_t^T k_t)) solve a unit-lower-triangular system:
        (I + diag(beta) A) U = diag(beta) V - diag(beta) (K * e^gamma) S0,   A_ts = sum_c k_tc k_sc e^(gamma_tc - gamma_sc), s < t
    so U = U0 - W S0 with U0, W independent of S0 (computed for many chunks at once), and then
        O     = (Q * e^gamma) S0 + M U,                                    M_ts = sum_c q_tc k_sc e^(gamma_tc - gamma_sc), s <= t
        S_end = e^gamma_end * S0 + (K * e^(gamma_end - gamma))^T U
    is all that runs chunk after chunk. Every exponent formed is <= 0, so nothing overflows.

    Heads are independent. On the CPU they run one at a time, so each pass's temporaries stay in the
    core's cache (all heads at once ran up to several times slower at a few hundred tokens).
    """
    if q.device.type != "cpu" or q.shape[2] == 1:
        return _kda_chunked_heads(q, k, v, g, beta, state, chunk_size)
    heads = [slice(h, h + 1) for h in range(q.shape[2])]
    return torch.cat(
        [_kda_chunked_heads(q[:, :, h], k[:, :, h], v[:, :, h], g[:, :, h], beta[:, :, h], state[:, h], chunk_size)
         for h in heads],
        dim=2,
    )  # fmt: skip


def _kda_chunked_heads(q, k, v, g, beta, state, chunk_size):
    """`kda_chunked` over all of the given heads at once."""
    batch, n_tokens, heads, _ = q.shape
    pad = -n_tokens % chunk_size  # zero tokens (beta = 0, g = 0) leave the state and the real outputs alone
    q, k, v, g = (F.pad(x.transpose(1, 2), (0, 0, 0, pad)) for x in (q, k, v, g))  # [B, H, T', .]
    beta = F.pad(beta.transpose(1, 2), (0, pad))

    def chunked(x):
        return x.unflatten(2, (-1, chunk_size))  # [B, H, N, C, .]

    q, k, v, g, beta = chunked(q), chunked(k), chunked(v), chunked(g), chunked(beta)
    n_chunks = q.shape[2]
    out = torch.empty_like(v)
    # A copy: the graph reads the entering state, so overwriting it in place would break autograd (training).
    s = state.clone()
    # Phase 1 is batched over groups of chunks, sized so its largest temporary stays near _GROUP_ELEMENTS.
    per_chunk = batch * heads * chunk_size * SUB_CHUNK * q.shape[-1]
    group = max(1, _GROUP_ELEMENTS // per_chunk)
    for first in range(0, n_chunks, group):
        part = slice(first, min(first + group, n_chunks))
        gamma = g[:, :, part].cumsum(-2)
        a, m = _intra_chunk_scores(q[:, :, part], k[:, :, part], gamma)
        bp = beta[:, :, part].unsqueeze(-1)
        lower = torch.eye(chunk_size, dtype=q.dtype, device=q.device) + bp * a
        w = torch.linalg.solve_triangular(
            lower, bp * k[:, :, part] * gamma.exp(), upper=False, unitriangular=True
        )
        u0 = torch.linalg.solve_triangular(lower, bp * v[:, :, part], upper=False, unitriangular=True)
        q_in = q[:, :, part] * gamma.exp()  # reads the entering state
        k_out = k[:, :, part] * (gamma[..., -1:, :] - gamma).exp()  # writes the leaving state
        end_decay = gamma[..., -1, :].exp().unsqueeze(-1)
        # Phase 2: chunk after chunk.
        for i, n in enumerate(range(part.start, part.stop)):
            u = u0[:, :, i] - w[:, :, i] @ s
            out[:, :, n] = q_in[:, :, i] @ s + m[:, :, i] @ u
            s = end_decay[:, :, i] * s + k_out[:, :, i].transpose(-1, -2) @ u
    state.copy_(s)
    return out.flatten(2, 3)[:, :, :n_tokens].transpose(1, 2)


def _intra_chunk_scores(
    q: torch.Tensor, k: torch.Tensor, gamma: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """A (strictly lower) and M (lower, with diagonal) of `kda_chunked` for chunks q, k, gamma [..., C, d_k].

    Inside blocks of SUB_CHUNK tokens the decay e^(gamma_t - gamma_s) is formed element by element; between
    a block and the tokens after it, it factors through the block's last token b as
    e^(gamma_t - gamma_b) * e^(gamma_b - gamma_s) (both exponents <= 0), so those entries are matmuls.
    """
    size = q.shape[-2]
    a = q.new_zeros(*q.shape[:-1], size)
    m = q.new_zeros(*q.shape[:-1], size)
    for start in range(0, size, SUB_CHUNK):
        block = slice(start, min(start + SUB_CHUNK, size))
        kb, gb = k[..., block, :], gamma[..., block, :]
        # [.., t, s, d_k]; entries above the diagonal (s > t) are dropped by tril below, so clamping their
        # exponents to 0 only keeps them finite. The floor keeps exp off its slow path for arguments far
        # below FP32's range (measured 6x slower); e^EXP_FLOOR is below any term that can show.
        decay = (gb.unsqueeze(-2) - gb.unsqueeze(-3)).clamp(EXP_FLOOR, 0).exp()
        k_decayed = kb.unsqueeze(-3) * decay
        a[..., block, block] = (k_decayed * kb.unsqueeze(-2)).sum(-1).tril(-1)
        m[..., block, block] = (k_decayed * q[..., block, :].unsqueeze(-2)).sum(-1).tril()
        if block.stop < size:
            later = slice(block.stop, size)
            boundary = gamma[..., block.stop - 1 : block.stop, :]
            k_from = (kb * (boundary - gb).exp()).transpose(-1, -2)  # [.., d_k, n]
            to_later = (gamma[..., later, :] - boundary).exp()
            a[..., later, block] = (k[..., later, :] * to_later) @ k_from
            m[..., later, block] = (q[..., later, :] * to_later) @ k_from
    return a, m


def short_conv_step(x: torch.Tensor, window: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`ShortConv.step` for x [B, D]: window [B, D, K-1] (updated in place), weight [D, 1, K] -> [B, D]."""
    taps = weight[:, 0].float()  # [D, K]
    y = (window.float() * taps[:, :-1]).sum(-1) + x.float() * taps[:, -1]
    if window.shape[-1]:
        window.copy_(torch.cat([window[..., 1:], x.unsqueeze(-1).to(window.dtype)], dim=-1))
    return F.silu(y.to(x.dtype))


def kda_decode_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    f: torch.Tensor,
    b: torch.Tensor,
    gate: torch.Tensor,
    conv: torch.Tensor,
    q_taps: torch.Tensor,
    k_taps: torch.Tensor,
    v_taps: torch.Tensor,
    a_log: torch.Tensor,
    dt_bias: torch.Tensor,
    norm_weight: torch.Tensor,
    state: torch.Tensor,
    *,
    l2_eps: float,
    norm_eps: float,
    f_b_weight: torch.Tensor | None = None,
    g_b_weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """One token of a KDA layer between its projections and o_proj, eager (the reference of the fused
    `kda_decode_step` kernel, engine/kernels/triton_kda.py).

    q, k, v [B, D] (projections before the short convolutions), f [B, D] (f_b_proj's output), b [B, H]
    (b_proj's), gate [B, D] (g_b_proj's); conv [B, 3, D, K-1] and state [B, H, d_k, d_v] FP32 are updated
    in place; taps [D, 1, K]; a_log [.., H, ..] and dt_bias [D] FP32; norm_weight [d_v]. Returns the gated
    output norm [B, D] in the gate's dtype. With ``f_b_weight`` / ``g_b_weight`` [D, R] (dense f_b_proj /
    g_b_proj), f / gate are the low-rank f_a_proj / g_a_proj outputs [B, R], projected here."""
    if f_b_weight is not None:
        f = F.linear(f, f_b_weight)
    if g_b_weight is not None:
        gate = F.linear(gate, g_b_weight)
    heads = b.shape[-1]
    q = short_conv_step(q, conv[:, 0], q_taps)
    k = short_conv_step(k, conv[:, 1], k_taps)
    v = short_conv_step(v, conv[:, 2], v_taps)
    g = kda_decay(f, a_log, dt_bias, heads)
    beta = torch.sigmoid(b.float())
    head_dim = q.shape[-1] // heads
    q = l2_normalize(q.float().unflatten(-1, (heads, -1)), l2_eps) * head_dim**-0.5
    k = l2_normalize(k.float().unflatten(-1, (heads, -1)), l2_eps)
    o = kda_recurrent_step(q, k, v.float().unflatten(-1, (heads, -1)), g, beta, state)
    return gated_rms_norm(o, gate.unflatten(-1, (heads, -1)), norm_weight, norm_eps).flatten(-2)


def _low_rank(projection: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(x, the weight) for a plain `Linear` the decode step applies itself, else (projection(x), None).
    A `Linear` with a decode GEMV bound (the CPU's) runs it here: faster than the step's own matmul."""
    if type(projection) is Linear and projection.decode_gemv is None:
        return x, projection.weight
    return projection(x), None


class ShortConv(nn.Module):
    """Causal depthwise convolution over time followed by SiLU; `weight` is [D, 1, K] as in the checkpoint."""

    def __init__(self, dim: int, kernel_size: int, *, dtype=None, device=None):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim, 1, kernel_size, dtype=dtype, device=device))

    def forward(self, x: torch.Tensor, window: torch.Tensor) -> torch.Tensor:
        """x [B, T, D]; window [B, D, K-1] holds the previous K-1 inputs and is updated in place."""
        if x.shape[1] == 1:
            return self.step(x, window)
        seq = torch.cat([window.to(x.dtype), x.transpose(1, 2)], dim=-1)
        window.copy_(seq[..., seq.shape[-1] - window.shape[-1] :])
        y = F.conv1d(seq, self.weight.to(x.dtype), groups=seq.shape[1])
        return F.silu(y).transpose(1, 2)

    def step(self, x: torch.Tensor, window: torch.Tensor) -> torch.Tensor:
        """`forward` for one token x [B, 1, D]: the K-tap weighted sum of the window and x, accumulated in
        FP32 and rounded once as conv1d does, then the window rolls by one. A convolution call per token
        costs more than the arithmetic; this is elementwise work a compiler fuses with its neighbours."""
        return short_conv_step(x[:, 0], window, self.weight).unsqueeze(1)


class KimiDeltaAttention(nn.Module):
    def __init__(
        self, cfg: KimiLinearConfig, *, chunked_kernel: ChunkedKernel | None = None, dtype=None, device=None
    ):
        super().__init__()
        self.cfg = cfg
        h, d, hd, nh = cfg.hidden_size, cfg.kda_dim, cfg.kda_head_dim, cfg.kda_num_heads
        kw = {"dtype": dtype, "device": device}
        self.q_proj = Linear(h, d, **kw)
        self.k_proj = Linear(h, d, **kw)
        self.v_proj = Linear(h, d, **kw)
        self.q_conv1d = ShortConv(d, cfg.conv_kernel_size, **kw)
        self.k_conv1d = ShortConv(d, cfg.conv_kernel_size, **kw)
        self.v_conv1d = ShortConv(d, cfg.conv_kernel_size, **kw)
        self.f_a_proj = Linear(h, hd, **kw)
        self.f_b_proj = Linear(hd, d, **kw)
        self.A_log = nn.Parameter(torch.empty(1, 1, nh, 1, dtype=torch.float32, device=device))
        self.dt_bias = nn.Parameter(torch.empty(d, dtype=torch.float32, device=device))
        self.b_proj = Linear(h, nh, **kw)
        self.g_a_proj = Linear(h, hd, **kw)
        self.g_b_proj = Linear(hd, d, **kw)
        self.o_norm = GatedRMSNorm(hd, cfg.rms_norm_eps, **kw)
        self.o_proj = Linear(d, h, **kw)
        # The prefill (several tokens) kernel: `kda_chunked` unless the builder (engine/runtime/builder.py)
        # constructs the model with another of the same contract (fla's chunk_kda on a GPU).
        self.chunked_kernel = chunked_kernel or kda_chunked
        # The one-token kernel, same signature as `kda_decode_step`; a runtime may bind the fused Triton
        # variant (engine/kernels/fused.py) on a GPU.
        self.decode_kernel = kda_decode_step
        self._input_projections: SharedInputLinears | None = None

    def fuse_input_projections(self) -> None:
        """Run the six projections of the layer input as one GEMM (those that are plain `Linear`s; a runtime
        calls this at load). Weights must not change after."""
        self._input_projections = SharedInputLinears(self, _INPUT_PROJECTIONS)

    def _project_input(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        if self._input_projections is not None:
            return self._input_projections(self, x)
        return {name: getattr(self, name)(x) for name in _INPUT_PROJECTIONS}

    def forward(self, x: torch.Tensor, state: KDAState | None) -> torch.Tensor:
        """x [B, T, hidden]. With a state, continue from it and update it; without, start from zeros.
        A single token takes the recurrent step, several tokens the chunked form."""
        cfg = self.cfg
        batch, n_tokens, _ = x.shape
        nh = cfg.kda_num_heads
        if state is None:
            conv = x.new_zeros(batch, 3, cfg.kda_dim, cfg.conv_kernel_size - 1)
            recurrent = x.new_zeros(batch, nh, cfg.kda_head_dim, cfg.kda_head_dim, dtype=torch.float32)
        else:
            conv, recurrent = state.conv, state.recurrent
        p = self._project_input(x)
        if n_tokens == 1:
            # Dense f_b_proj / g_b_proj (the plans keep them) are applied inside the step (the fused
            # kernel reads each head's rows of them: two launches fewer); others run here.
            f, f_b = _low_rank(self.f_b_proj, p["f_a_proj"][:, 0])
            gate, g_b = _low_rank(self.g_b_proj, p["g_a_proj"][:, 0])
            o = self.decode_kernel(
                p["q_proj"][:, 0], p["k_proj"][:, 0], p["v_proj"][:, 0], f, p["b_proj"][:, 0], gate, conv,
                self.q_conv1d.weight, self.k_conv1d.weight, self.v_conv1d.weight, self.A_log, self.dt_bias,
                self.o_norm.weight, recurrent, l2_eps=cfg.kda_l2norm_eps, norm_eps=self.o_norm.eps,
                f_b_weight=f_b, g_b_weight=g_b,
            )  # fmt: skip
            return self.o_proj(o.unsqueeze(1))
        q = self.q_conv1d(p["q_proj"], conv[:, 0])
        k = self.k_conv1d(p["k_proj"], conv[:, 1])
        v = self.v_conv1d(p["v_proj"], conv[:, 2])
        g = kda_decay(self.f_b_proj(p["f_a_proj"]), self.A_log, self.dt_bias, nh)
        beta = torch.sigmoid(p["b_proj"].float())
        eps = cfg.kda_l2norm_eps
        q = l2_normalize(q.float().unflatten(-1, (nh, -1)), eps) * cfg.kda_head_dim**-0.5
        k = l2_normalize(k.float().unflatten(-1, (nh, -1)), eps)
        v = v.float().unflatten(-1, (nh, -1))
        o = self.chunked_kernel(q, k, v, g, beta, recurrent)
        gate = self.g_b_proj(p["g_a_proj"]).unflatten(-1, (nh, -1))
        return self.o_proj(self.o_norm(o, gate).flatten(-2))
