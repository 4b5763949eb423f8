"""Multi-head latent attention without positional encoding (Kimi-Linear's full-attention layers).

Per token: q = q_proj(x) -> per head [q_nope | q_pe]; c = kv_a_proj_with_mqa(x) -> [latent | k_pe];
the latent is RMS-normalised and expanded by kv_b_proj into per-head [k_nope | v]; each head's key is
[k_nope | k_pe] with k_pe shared by all heads. No rotary transform is applied anywhere.

Only [normalised latent | k_pe] is cached. Prefill expands the cached latents and runs ordinary causal
attention (`scaled_dot_product_attention`); decode folds kv_b_proj into the query and the output instead
(weight absorption) and attends in the latent space, so it never expands the cache.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.model.cache import MLAState
from engine.model.config import KimiLinearConfig
from engine.model.linear import Linear
from engine.model.norm import RMSNorm


class MultiheadLatentAttention(nn.Module):
    def __init__(self, cfg: KimiLinearConfig, *, dtype=None, device=None):
        super().__init__()
        self.cfg = cfg
        kw = {"dtype": dtype, "device": device}
        h, n = cfg.hidden_size, cfg.num_attention_heads
        self.q_proj = Linear(h, n * cfg.qk_head_dim, **kw)
        self.kv_a_proj_with_mqa = Linear(h, cfg.kv_lora_rank + cfg.qk_rope_head_dim, **kw)
        self.kv_a_layernorm = RMSNorm(cfg.kv_lora_rank, cfg.mla_latent_norm_eps, **kw)
        self.kv_b_proj = Linear(cfg.kv_lora_rank, n * (cfg.qk_nope_head_dim + cfg.v_head_dim), **kw)
        self.o_proj = Linear(n * cfg.v_head_dim, h, **kw)
        self.scale = cfg.qk_head_dim**-0.5
        self._absorbed: tuple[torch.Tensor, torch.Tensor] | None = None

    def compress(self, x: torch.Tensor) -> torch.Tensor:
        """The per-token cache entry [normalised latent | k_pe], shape [..., kv_lora_rank + rope]."""
        c = self.kv_a_proj_with_mqa(x)
        latent, k_pe = c.split([self.cfg.kv_lora_rank, self.cfg.qk_rope_head_dim], dim=-1)
        return torch.cat([self.kv_a_layernorm(latent), k_pe], dim=-1)

    def forward(self, x: torch.Tensor, state: MLAState | None, start: int = 0) -> torch.Tensor:
        """Plain attention for x [B, T, hidden] at positions start..start+T-1. With a state, the new
        entries are written at those positions and the queries attend to everything cached before them."""
        cfg = self.cfg
        batch, n_tokens, _ = x.shape
        n = cfg.num_attention_heads
        q = self.q_proj(x).view(batch, n_tokens, n, cfg.qk_head_dim).transpose(1, 2)
        entries = self.compress(x)
        if state is None:
            if start:
                raise ValueError("a start position needs a cache")
            kv = entries
        else:
            state.kv[:, start : start + n_tokens] = entries
            kv = state.kv[:, : start + n_tokens]
        n_keys = kv.shape[1]
        latent, k_pe = kv.split([cfg.kv_lora_rank, cfg.qk_rope_head_dim], dim=-1)
        expanded = self.kv_b_proj(latent).view(batch, n_keys, n, cfg.qk_nope_head_dim + cfg.v_head_dim)
        k_nope, v = expanded.transpose(1, 2).split([cfg.qk_nope_head_dim, cfg.v_head_dim], dim=-1)
        k = torch.cat([k_nope, k_pe.unsqueeze(1).expand(batch, n, n_keys, cfg.qk_rope_head_dim)], dim=-1)
        if start == 0:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
        else:  # queries sit at the end of the key range: query i sees keys 0..start+i
            allowed = torch.ones(n_tokens, n_keys, dtype=torch.bool, device=x.device).tril(start)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=self.scale)
        return self.o_proj(o.transpose(1, 2).reshape(batch, n_tokens, n * cfg.v_head_dim))

    def absorbed_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """kv_b_proj per head as (W_k [H, nope, L], W_v [H, v, L]), the matrices decode folds into the query
        and the output. Cached after `freeze_absorbed_weights()`."""
        if self._absorbed is not None:
            return self._absorbed
        cfg = self.cfg
        nope = cfg.qk_nope_head_dim
        w = self.kv_b_proj.dense_weight().view(
            cfg.num_attention_heads, nope + cfg.v_head_dim, cfg.kv_lora_rank
        )
        return w[:, :nope], w[:, nope:]

    def freeze_absorbed_weights(self) -> None:
        """Compute the absorbed matrices once (for a non-dense kv_b_proj, `dense_weight()` converts: a
        runtime calls this at load so decode does not convert per token). Weights must not change after."""
        self._absorbed = None
        self._absorbed = self.absorbed_weights()

    def decode(
        self, x: torch.Tensor, state: MLAState, position: torch.Tensor, slots: torch.Tensor
    ) -> torch.Tensor:
        """Absorbed attention for one token per sequence x [B, 1, hidden], row b written at device index
        `position[b]` (position [B], or [1] for sequences that advance together); attends over all
        `max_len` slots with those after its own position masked (static shapes). A position past the
        last slot (an idle row of a continuous batch) writes the last slot instead."""
        cfg = self.cfg
        batch = x.shape[0]
        n, nope = cfg.num_attention_heads, cfg.qk_nope_head_dim
        q = self.q_proj(x).view(batch, n, cfg.qk_head_dim)
        at = position.clamp(max=state.kv.shape[1] - 1).expand(batch).view(batch, 1, 1)
        entry = self.compress(x)  # [B, 1, L + rope]
        state.kv.scatter_(1, at.expand(batch, 1, entry.shape[-1]), entry)
        w_k, w_v = self.absorbed_weights()  # [H, nope, L], [H, v, L]
        # The reductions form was measured on the CPU only; a compiled CUDA step keeps cuBLAS's matmuls.
        fused = torch.compiler.is_compiling() and state.kv.device.type == "cpu"
        attend = _attend_as_reductions if fused else _attend_as_matmuls
        o = attend(q[..., :nope], q[..., nope:], w_k, w_v, state, slots > at, self.scale)
        return self.o_proj(o.reshape(batch, 1, n * cfg.v_head_dim).to(x.dtype))


def _attend_as_matmuls(q_nope, q_rope, w_k, w_v, state: MLAState, masked, scale: float) -> torch.Tensor:
    """Absorbed attention of one token per sequence: q_nope [B, H, nope], q_rope [B, H, rope], w_k
    [H, nope, L], w_v [H, v, L], the cache's kv [B, max_len, L + rope] (latent = its first L), masked
    [B, 1, max_len] (True: not attended). Returns o [B, H, v]. Matmuls in the cache's dtype, softmax in
    FP32: the eager form (and the CUDA-graph one)."""
    q_latent = torch.einsum("bhn,hnl->bhl", q_nope, w_k)
    q_cat = torch.cat([q_latent, q_rope], dim=-1)  # [B, H, L + rope]
    scores = (q_cat @ state.kv.transpose(1, 2)).float() * scale  # [B, H, max_len]
    probs = torch.softmax(scores.masked_fill(masked, float("-inf")), dim=-1).to(state.kv.dtype)
    return torch.einsum("bhl,hvl->bhv", probs @ state.latent, w_v)


def _attend_as_reductions(q_nope, q_rope, w_k, w_v, state: MLAState, masked, scale: float) -> torch.Tensor:
    """`_attend_as_matmuls` as broadcast products summed in FP32, for a compiled CPU step: Inductor fuses each
    into one loop that reads the cache and the weights in place; its batched-matmul calls at these sizes
    cost more than that (measured on the CPU: the small model's step was 1.2x slower at one row, 1.3x at
    four). Eagerly these products would be materialised ([B, H, max_len, L]): eager keeps the matmuls."""
    q_latent = (q_nope.float().unsqueeze(-1) * w_k.float()).sum(-2)  # [B, H, L]
    q_cat = torch.cat([q_latent, q_rope.float()], dim=-1)
    scores = (q_cat.unsqueeze(2) * state.kv.float().unsqueeze(1)).sum(-1) * scale  # [B, H, max_len]
    probs = torch.softmax(scores.masked_fill(masked, float("-inf")), dim=-1)
    context = (probs.unsqueeze(-1) * state.latent.float().unsqueeze(1)).sum(-2)  # [B, H, L]
    return (context.unsqueeze(-2) * w_v.float()).sum(-1)
