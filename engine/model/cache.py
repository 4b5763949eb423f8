"""Per-sequence decode state, preallocated to a maximum length.

Layout, for a batch of B sequences that advance together:
- KDA layer: `conv` [B, 3, D, K-1] (the last K-1 inputs of the q, k, v short convolutions, activation dtype)
  and `recurrent` [B, H, d_k, d_v] (the delta-rule state, always FP32).
- MLA layer: `kv` [B, max_len, kv_lora_rank + qk_rope_head_dim], the normalised latent then the shared
  64-wide key slice per token (activation dtype). Nothing else is cached: decode attends in latent space.

`length` (host int) is the number of tokens written; `position` (a device tensor [B] holding the same number
per sequence) is what a decode step reads, so a step never needs the host value and can be captured in a
CUDA graph. Sequences of a continuous batch (engine/runtime/batch.py) sit at different positions: each row
writes its own slot and masks the slots after it; the host `length` is then the longest row's.
A runner that replays captured steps must call `advance(n)` itself (the Python-side increment is not part
of the graph).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.model.config import KimiLinearConfig


class CacheFullError(RuntimeError):
    """More tokens than the cache was allocated for."""


@dataclass
class KDAState:
    conv: torch.Tensor
    recurrent: torch.Tensor

    @classmethod
    def zeros(
        cls,
        config: KimiLinearConfig,
        batch_size: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> KDAState:
        """The state before the first token: `conv` in the activation dtype, `recurrent` in FP32."""
        conv = torch.zeros(
            batch_size, 3, config.kda_dim, config.conv_kernel_size - 1, dtype=dtype, device=device
        )
        recurrent = torch.zeros(
            batch_size,
            config.kda_num_heads,
            config.kda_head_dim,
            config.kda_head_dim,
            dtype=torch.float32,
            device=device,
        )
        return cls(conv=conv, recurrent=recurrent)


@dataclass
class MLAState:
    kv: torch.Tensor
    kv_lora_rank: int

    @property
    def latent(self) -> torch.Tensor:
        return self.kv[..., : self.kv_lora_rank]

    @property
    def k_pe(self) -> torch.Tensor:
        return self.kv[..., self.kv_lora_rank :]


class SequenceCache:
    def __init__(
        self,
        config: KimiLinearConfig,
        max_len: int,
        *,
        batch_size: int = 1,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ):
        if max_len < 1:
            raise ValueError(f"max_len must be positive, got {max_len}")
        self.config = config
        self.max_len = max_len
        self.batch_size = batch_size
        self.dtype = dtype
        self.layers: list[KDAState | MLAState] = []
        for i in range(config.num_hidden_layers):
            if config.is_mla_layer(i):
                width = config.kv_lora_rank + config.qk_rope_head_dim
                kv = torch.zeros(batch_size, max_len, width, dtype=dtype, device=device)
                self.layers.append(MLAState(kv=kv, kv_lora_rank=config.kv_lora_rank))
            else:
                self.layers.append(KDAState.zeros(config, batch_size, dtype=dtype, device=device))
        self.position = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.slots = torch.arange(max_len, device=device)  # slot index per cache row, for the decode mask
        self.length = 0

    @property
    def device(self) -> torch.device:
        return self.position.device

    def tensors(self) -> list[torch.Tensor]:
        out = []
        for state in self.layers:
            out += [state.kv] if isinstance(state, MLAState) else [state.conv, state.recurrent]
        return out + [self.position]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def check_room(self, n_tokens: int) -> None:
        if self.length + n_tokens > self.max_len:
            raise CacheFullError(
                f"cache holds {self.length} of {self.max_len} tokens; {n_tokens} more do not fit"
            )

    def advance(self, n_tokens: int) -> None:
        """Record `n_tokens` written on the host side (the device `position` is advanced by the model)."""
        self.length += n_tokens

    def reset(self) -> None:
        """Empty the cache in place (buffer addresses are kept)."""
        for t in self.tensors():
            t.zero_()
        self.length = 0

    def copy_from(self, other: SequenceCache) -> None:
        """Overwrite this cache with `other`'s contents in place (snapshot restore without new buffers)."""
        if other.max_len != self.max_len or other.batch_size != self.batch_size:
            raise ValueError("copy_from needs a cache of the same max_len and batch size")
        for dst, src in zip(self.tensors(), other.tensors(), strict=True):
            dst.copy_(src)
        self.length = other.length
