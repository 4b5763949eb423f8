"""The whole causal LM. Module and parameter names mirror the checkpoint's tensor names, except that each
layer's routed experts are stacked into `block_sparse_moe.experts.{w1,w2,w3}`."""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from engine.model.cache import KDAState, MLAState, SequenceCache
from engine.model.config import KimiLinearConfig
from engine.model.kda import ChunkedKernel, KimiDeltaAttention
from engine.model.linear import Linear
from engine.model.mla import MultiheadLatentAttention
from engine.model.mlp import MLP
from engine.model.moe import SparseMoE
from engine.model.norm import RMSNorm


class DecoderLayer(nn.Module):
    """Pre-norm block: h += attn(norm(h)); h += ffn(norm(h)). The FFN is called `mlp` (dense) or
    `block_sparse_moe` (MoE), as in the checkpoint."""

    def __init__(
        self,
        cfg: KimiLinearConfig,
        index: int,
        *,
        kda_chunked_kernel: ChunkedKernel | None = None,
        dtype=None,
        device=None,
    ):
        super().__init__()
        kw = {"dtype": dtype, "device": device}
        self.is_mla = cfg.is_mla_layer(index)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **kw)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **kw)
        self.self_attn: MultiheadLatentAttention | KimiDeltaAttention
        if self.is_mla:
            self.self_attn = MultiheadLatentAttention(cfg, **kw)
        else:
            self.self_attn = KimiDeltaAttention(cfg, chunked_kernel=kda_chunked_kernel, **kw)
        if cfg.is_moe_layer(index):
            self.block_sparse_moe = SparseMoE(cfg, **kw)
        else:
            self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size, **kw)

    @property
    def ffn(self) -> nn.Module:
        return self.block_sparse_moe if hasattr(self, "block_sparse_moe") else self.mlp

    def forward(self, x: torch.Tensor, state: KDAState | MLAState | None, start: int) -> torch.Tensor:
        normed = self.input_layernorm(x)
        x = x + (self.self_attn(normed, state, start) if self.is_mla else self.self_attn(normed, state))
        return x + self.ffn(self.post_attention_layernorm(x))

    def decode(
        self, x: torch.Tensor, state: KDAState | MLAState, cache: SequenceCache, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One token: ``x + residual`` (the previous layer's FFN output, None for the first layer) is this
        layer's input, its add fused with the input norm; returns (input + attention, FFN output): the
        caller adds the FFN output into the next norm the same way."""
        if residual is None:
            normed = self.input_layernorm(x)
        else:
            x, normed = self.input_layernorm.add_forward(x, residual)
        if self.is_mla:
            # is_mla: the attention is MultiheadLatentAttention and the state its MLAState
            mla, mla_state = cast(MultiheadLatentAttention, self.self_attn), cast(MLAState, state)
            attn = mla.decode(normed, mla_state, cache.position, cache.slots)
        else:
            attn = self.self_attn(normed, state)
        x, normed = self.post_attention_layernorm.add_forward(x, attn)  # one fused launch on a GPU
        return x, self.ffn(normed)


class KimiLinearModel(nn.Module):
    def __init__(
        self,
        cfg: KimiLinearConfig,
        *,
        kda_chunked_kernel: ChunkedKernel | None = None,
        dtype=None,
        device=None,
    ):
        super().__init__()
        # An nn.Embedding, or a quantised table with the same forward (engine.quant.packed.PackedEmbedding).
        self.embed_tokens: nn.Module = nn.Embedding(
            cfg.vocab_size, cfg.hidden_size, dtype=dtype, device=device
        )
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, i, kda_chunked_kernel=kda_chunked_kernel, dtype=dtype, device=device)
            for i in range(cfg.num_hidden_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype, device=device)


class KimiLinearForCausalLM(nn.Module):
    """Inference-only Kimi-Linear.

    - `forward(token_ids)`: logits for every position of a fresh sequence (no cache), for scoring/tests.
    - `prefill(token_ids, cache)`: append tokens to the cache; logits of the last position only.
    - `decode_step(token_ids, cache)`: one token per sequence; writes only into preallocated cache
      buffers, reads its position from the device, no host sync (CUDA-graph capturable).

    `kda_chunked_kernel` is the KDA layers' prefill kernel (default `engine.model.kda.kda_chunked`); the
    runtime builds the model through engine/runtime/builder.py, which chooses it.
    """

    def __init__(
        self,
        cfg: KimiLinearConfig,
        *,
        dtype: torch.dtype = torch.float32,
        device=None,
        kda_chunked_kernel: ChunkedKernel | None = None,
    ):
        super().__init__()
        self.config = cfg
        self.model = KimiLinearModel(cfg, kda_chunked_kernel=kda_chunked_kernel, dtype=dtype, device=device)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, dtype=dtype, device=device)
        self.requires_grad_(False)

    # Read from the final norm, which every weight format keeps dense: the embedding and the head may be
    # packed modules.
    @property
    def dtype(self) -> torch.dtype:
        return self.model.norm.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.model.norm.weight.device

    def new_cache(self, max_len: int, *, batch_size: int = 1) -> SequenceCache:
        return SequenceCache(
            self.config, max_len, batch_size=batch_size, device=self.device, dtype=self.dtype
        )

    def _layers(self, x: torch.Tensor, cache: SequenceCache | None) -> torch.Tensor:
        start = 0 if cache is None else cache.length
        for i, layer in enumerate(self.model.layers):
            x = layer(x, None if cache is None else cache.layers[i], start)
        return self.model.norm(x)

    @torch.no_grad()
    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        """token_ids [B, T] -> logits [B, T, vocab]."""
        return self.logits(token_ids)

    def logits(self, token_ids: torch.Tensor) -> torch.Tensor:
        """`forward` without its no_grad: the training forward (engine/training) differentiates through it."""
        return self.lm_head(self._layers(self.model.embed_tokens(token_ids), None))

    @torch.no_grad()
    def prefill(self, token_ids: torch.Tensor, cache: SequenceCache) -> torch.Tensor:
        """token_ids [B, T] appended after the cache's current length -> logits [B, vocab] of the last one."""
        _check_batch(token_ids, cache)
        cache.check_room(token_ids.shape[1])
        hidden = self._layers(self.model.embed_tokens(token_ids), cache)
        cache.position.add_(token_ids.shape[1])
        cache.advance(token_ids.shape[1])
        return self.lm_head(hidden[:, -1])

    @torch.no_grad()
    def decode_step(self, token_ids: torch.Tensor, cache: SequenceCache) -> torch.Tensor:
        """token_ids [B] (one new token per sequence) -> logits [B, vocab]."""
        _check_batch(token_ids.view(-1, 1), cache)
        cache.check_room(1)
        logits = self.decode_tensors(token_ids, cache)
        cache.advance(1)
        return logits

    @torch.no_grad()
    def decode_tensors(self, token_ids: torch.Tensor, cache: SequenceCache) -> torch.Tensor:
        """The device work of `decode_step` alone (embedding -> layers -> norm -> head, then the device
        position += 1): it never reads the host-side length, so it can be compiled or graph-captured once
        per cache and replayed. The caller checks room first and advances the host length after."""
        x = self.model.embed_tokens(token_ids.view(-1, 1))
        residual: torch.Tensor | None = None
        layers = cast("list[DecoderLayer]", self.model.layers)  # an nn.ModuleList of them
        for layer, state in zip(layers, cache.layers, strict=True):
            x, residual = layer.decode(x, state, cache, residual)
        assert residual is not None, "a model has at least one layer"
        logits = self.lm_head(self.model.norm.add_forward(x[:, 0], residual[:, 0])[1])
        cache.position.add_(1)
        return logits


def _check_batch(t: torch.Tensor, cache: SequenceCache) -> None:
    if t.shape[0] != cache.batch_size:
        raise ValueError(f"batch of {t.shape[0]} sequences for a cache of {cache.batch_size}")
