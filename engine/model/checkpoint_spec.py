"""The Hugging Face checkpoint's tensor names, shapes and dtypes for a configuration.

The single source of truth for what a checkpoint holds: the loader validates against it, the synthetic
writer writes it, the GGUF exporter reads it, and the quantiser (engine/quant) plans and checks with it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.model.config import KimiLinearConfig


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype  # the dtype the real checkpoint stores

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


EXPERT_PROJECTIONS = ("w1", "w2", "w3")  # w1 = gate, w3 = up, w2 = down


def layer_prefix(index: int) -> str:
    return f"model.layers.{index}."


def expert_tensor_name(layer: int, expert: int, projection: str) -> str:
    return f"{layer_prefix(layer)}block_sparse_moe.experts.{expert}.{projection}.weight"


def checkpoint_tensors(cfg: KimiLinearConfig) -> list[TensorSpec]:
    """All tensors of the checkpoint, in layer order."""
    bf16, f32 = torch.bfloat16, torch.float32
    h = cfg.hidden_size
    specs = [TensorSpec("model.embed_tokens.weight", (cfg.vocab_size, h), bf16)]
    for i in range(cfg.num_hidden_layers):
        p = layer_prefix(i)
        a = p + "self_attn."
        specs += [
            TensorSpec(p + "input_layernorm.weight", (h,), bf16),
            TensorSpec(p + "post_attention_layernorm.weight", (h,), bf16),
        ]
        if cfg.is_mla_layer(i):
            n = cfg.num_attention_heads
            specs += [
                TensorSpec(a + "q_proj.weight", (n * cfg.qk_head_dim, h), bf16),
                TensorSpec(
                    a + "kv_a_proj_with_mqa.weight", (cfg.kv_lora_rank + cfg.qk_rope_head_dim, h), bf16
                ),
                TensorSpec(a + "kv_a_layernorm.weight", (cfg.kv_lora_rank,), bf16),
                TensorSpec(
                    a + "kv_b_proj.weight",
                    (n * (cfg.qk_nope_head_dim + cfg.v_head_dim), cfg.kv_lora_rank),
                    bf16,
                ),
                TensorSpec(a + "o_proj.weight", (h, n * cfg.v_head_dim), bf16),
            ]
        else:
            d, hd, nh = cfg.kda_dim, cfg.kda_head_dim, cfg.kda_num_heads
            specs += [
                TensorSpec(a + "q_proj.weight", (d, h), bf16),
                TensorSpec(a + "k_proj.weight", (d, h), bf16),
                TensorSpec(a + "v_proj.weight", (d, h), bf16),
                TensorSpec(a + "q_conv1d.weight", (d, 1, cfg.conv_kernel_size), bf16),
                TensorSpec(a + "k_conv1d.weight", (d, 1, cfg.conv_kernel_size), bf16),
                TensorSpec(a + "v_conv1d.weight", (d, 1, cfg.conv_kernel_size), bf16),
                TensorSpec(a + "f_a_proj.weight", (hd, h), bf16),
                TensorSpec(a + "f_b_proj.weight", (d, hd), bf16),
                TensorSpec(a + "A_log", (1, 1, nh, 1), f32),
                TensorSpec(a + "dt_bias", (d,), f32),
                TensorSpec(a + "b_proj.weight", (nh, h), bf16),
                TensorSpec(a + "g_a_proj.weight", (hd, h), bf16),
                TensorSpec(a + "g_b_proj.weight", (d, hd), bf16),
                TensorSpec(a + "o_norm.weight", (hd,), bf16),
                TensorSpec(a + "o_proj.weight", (h, d), bf16),
            ]
        if cfg.is_moe_layer(i):
            m = p + "block_sparse_moe."
            inter = cfg.moe_intermediate_size
            shared = inter * cfg.num_shared_experts
            specs += [
                TensorSpec(m + "gate.weight", (cfg.num_experts, h), bf16),
                TensorSpec(m + "gate.e_score_correction_bias", (cfg.num_experts,), bf16),
            ]
            if cfg.num_shared_experts:
                specs += [
                    TensorSpec(m + "shared_experts.gate_proj.weight", (shared, h), bf16),
                    TensorSpec(m + "shared_experts.up_proj.weight", (shared, h), bf16),
                    TensorSpec(m + "shared_experts.down_proj.weight", (h, shared), bf16),
                ]
            for e in range(cfg.num_experts):
                specs += [
                    TensorSpec(expert_tensor_name(i, e, "w1"), (inter, h), bf16),
                    TensorSpec(expert_tensor_name(i, e, "w2"), (h, inter), bf16),
                    TensorSpec(expert_tensor_name(i, e, "w3"), (inter, h), bf16),
                ]
        else:
            specs += [
                TensorSpec(p + "mlp.gate_proj.weight", (cfg.intermediate_size, h), bf16),
                TensorSpec(p + "mlp.up_proj.weight", (cfg.intermediate_size, h), bf16),
                TensorSpec(p + "mlp.down_proj.weight", (h, cfg.intermediate_size), bf16),
            ]
    specs += [
        TensorSpec("model.norm.weight", (h,), bf16),
        TensorSpec("lm_head.weight", (cfg.vocab_size, h), bf16),
    ]
    return specs
