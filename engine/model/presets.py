"""Named configurations: `full` is Kimi-Linear-48B-A3B; `tiny` and `small` keep its layout at smaller sizes;
`wide` has the full model's widths (every GEMV the real model runs, at its real size) in four layers."""

from __future__ import annotations

import dataclasses
from typing import Any

from engine.model.config import KimiLinearConfig
from engine.model.synthetic_tokenizer import special_base

# Special-token ids of the real tokenizer: 163,584 byte-pair tokens, then 256 reserved special tokens.
_REAL_SPECIAL_BASE = 163_584


def _mla_every_fourth(n_layers: int) -> tuple[int, ...]:
    """The real pattern: three KDA layers then one MLA layer, and the last layer is always MLA (zero-based)."""
    full = {i for i in range(3, n_layers, 4)} | {n_layers - 1}
    return tuple(sorted(full))


# What every size keeps of the real model: the short-conv width, one shared expert, a dense first layer,
# the routing scale and renormalisation, the norms' epsilon.
_KIMI_LINEAR_CONSTANTS: dict[str, Any] = dict(
    conv_kernel_size=4,
    num_shared_experts=1,
    first_k_dense_replace=1,
    routed_scaling_factor=2.446,
    moe_renormalize=True,
    rms_norm_eps=1e-5,
)


def _config(vocab: int, special_base: int, **fields) -> KimiLinearConfig:
    return KimiLinearConfig(
        vocab_size=vocab,
        bos_token_id=special_base,  # [BOS]
        eos_token_id=special_base + 2,  # <|im_end|>
        pad_token_id=special_base + 255,  # [PAD]
        **_KIMI_LINEAR_CONSTANTS,
        **fields,
    )


FULL = _config(
    163_840,
    _REAL_SPECIAL_BASE,
    hidden_size=2304,
    num_hidden_layers=27,
    intermediate_size=9216,
    num_attention_heads=32,
    kv_lora_rank=512,
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,
    v_head_dim=128,
    kda_num_heads=32,
    kda_head_dim=128,
    full_attn_layers=_mla_every_fourth(27),  # one-based 4, 8, ..., 24, 27
    num_experts=256,
    num_experts_per_token=8,
    moe_intermediate_size=1024,
)

# Synthetic checkpoints use the BPE trained here (engine/model/synthetic_tokenizer.py): as many ranks as the
# vocabulary leaves after 256 special tokens (at most its trained 16,128), then the special tokens.
TINY = _config(
    4096,
    special_base(4096),
    hidden_size=128,
    num_hidden_layers=4,  # KDA, KDA, KDA, MLA: the real relative pattern
    intermediate_size=256,
    num_attention_heads=2,
    kv_lora_rank=64,
    qk_nope_head_dim=32,
    qk_rope_head_dim=16,
    v_head_dim=32,
    kda_num_heads=2,
    kda_head_dim=64,
    full_attn_layers=_mla_every_fourth(4),
    num_experts=8,
    num_experts_per_token=2,
    moe_intermediate_size=64,
)

SMALL = _config(
    16_384,
    special_base(16_384),
    hidden_size=512,
    num_hidden_layers=8,  # MLA at one-based 4 and 8
    intermediate_size=2048,
    num_attention_heads=8,
    kv_lora_rank=128,
    qk_nope_head_dim=64,
    qk_rope_head_dim=32,
    v_head_dim=64,
    kda_num_heads=8,
    kda_head_dim=128,
    full_attn_layers=_mla_every_fourth(8),
    num_experts=64,
    num_experts_per_token=8,
    moe_intermediate_size=128,
)

# The real widths (hidden, KDA and MLA heads, dense MLP, expert width, vocabulary) with 4 layers (KDA, KDA,
# KDA, MLA; layer 0 dense) and 32 experts top-8: per-op sizes and overhead look like the real model's.
WIDE = dataclasses.replace(
    FULL,
    bos_token_id=special_base(FULL.vocab_size),  # the synthetic tokenizer's special ids, as _config sets
    eos_token_id=special_base(FULL.vocab_size) + 2,
    pad_token_id=special_base(FULL.vocab_size) + 255,
    num_hidden_layers=4,
    full_attn_layers=_mla_every_fourth(4),
    num_experts=32,
)

PRESETS: dict[str, KimiLinearConfig] = {"tiny": TINY, "small": SMALL, "wide": WIDE, "full": FULL}


def preset(name: str) -> KimiLinearConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise KeyError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}") from None
