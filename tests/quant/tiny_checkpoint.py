"""A tiny Kimi-Linear checkpoint with the real tensor names, sharded like the HF release."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine.quant.layout import KimiDims, checkpoint_tensors

# Every quantised input dimension is a multiple of 64, so group sizes 32 and 64 both apply.
TINY_CONFIG = {
    "model_type": "kimi_linear",
    "vocab_size": 256,
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 2,
    "intermediate_size": 192,
    "moe_intermediate_size": 64,
    "num_experts": 6,
    "num_experts_per_token": 2,
    "num_shared_experts": 1,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "q_lora_rank": None,
    "kv_lora_rank": 64,
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 32,
    "v_head_dim": 32,
    "tie_word_embeddings": False,
    "linear_attn_config": {
        "num_heads": 2,
        "head_dim": 64,
        "short_conv_kernel_size": 4,
        "kda_layers": [1, 2, 4],
        "full_attn_layers": [3],
    },
}


def write_checkpoint(directory: Path, config: dict = TINY_CONFIG, shards: int = 3, seed: int = 0) -> Path:
    """Random weights (BF16, F32 ``A_log``/``dt_bias``) in ``shards`` files + index + config.json."""
    directory.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    specs = checkpoint_tensors(KimiDims.from_config(config))
    names = list(specs)
    per_shard = -(-len(names) // shards)
    weight_map = {}
    for index in range(shards):
        chunk = names[index * per_shard : (index + 1) * per_shard]
        file = f"model-{index + 1:05d}-of-{shards:05d}.safetensors"
        tensors = {}
        for name in chunk:
            spec = specs[name]
            values = torch.randn(spec.shape, generator=generator) * 0.05
            tensors[name] = values.to(spec.dtype)
            weight_map[name] = file
        save_file(tensors, str(directory / file), metadata={"format": "pt"})
    index = {"metadata": {"total_size": sum(s.nbytes for s in specs.values())}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    (directory / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 1024}))
    return directory
