"""Kimi-Linear checkpoint layout: the dimensions a HF ``config.json`` implies and every tensor it names.

Used to plan quantisation, count the bytes a decode step reads and build the kernels' shape tables,
so all three agree with the real checkpoint (kimi-linear.md §1.8).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_FULL_ATTENTION_LAYERS = [4, 8, 12, 16, 20, 24, 27]

# The published Kimi-Linear-48B-A3B configuration (the fields this package reads; one-based layer lists).
REFERENCE_CONFIG: dict = {
    "model_type": "kimi_linear",
    "vocab_size": 163840,
    "hidden_size": 2304,
    "num_hidden_layers": 27,
    "num_attention_heads": 32,
    "intermediate_size": 9216,
    "moe_intermediate_size": 1024,
    "num_experts": 256,
    "num_experts_per_token": 8,
    "num_shared_experts": 1,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "q_lora_rank": None,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "linear_attn_config": {
        "num_heads": 32,
        "head_dim": 128,
        "short_conv_kernel_size": 4,
        "full_attn_layers": _FULL_ATTENTION_LAYERS,
        "kda_layers": [i for i in range(1, 28) if i not in _FULL_ATTENTION_LAYERS],
    },
}


def _field(config: dict, *names: str, default=None):
    """A config value under any of its HF spellings (e.g. ``num_experts`` / ``num_local_experts``)."""
    for name in names:
        if name in config:
            return config[name]
    if default is not None:
        return default
    raise KeyError(f"config.json lacks {' / '.join(names)}")


@dataclass(frozen=True)
class KimiDims:
    """The dimensions of a Kimi-Linear model; layer indices are zero-based."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    intermediate_size: int
    moe_intermediate_size: int
    num_experts: int
    experts_per_token: int
    num_shared_experts: int
    first_dense_layers: int
    moe_layer_freq: int
    mla_heads: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    kda_heads: int
    kda_head_dim: int
    conv_size: int
    kda_layers: tuple[int, ...]
    mla_layers: tuple[int, ...]
    tied_embeddings: bool

    @classmethod
    def from_config(cls, config: dict) -> KimiDims:
        if config.get("q_lora_rank") is not None:
            raise ValueError("MLA with a low-rank query (q_lora_rank) is not a Kimi-Linear layout")
        linear = config.get("linear_attn_config") or {}
        num_layers = int(config["num_hidden_layers"])
        mla_layers = tuple(i - 1 for i in linear.get("full_attn_layers", ()))
        kda_layers = tuple(i - 1 for i in linear.get("kda_layers", ()))
        if sorted(mla_layers + kda_layers) != list(range(num_layers)):
            raise ValueError(
                "linear_attn_config must assign every layer (one-based) to exactly one of "
                "kda_layers / full_attn_layers"
            )
        return cls(
            vocab_size=int(config["vocab_size"]),
            hidden_size=int(config["hidden_size"]),
            num_layers=num_layers,
            intermediate_size=int(config["intermediate_size"]),
            moe_intermediate_size=int(config["moe_intermediate_size"]),
            num_experts=int(_field(config, "num_experts", "num_local_experts", "n_routed_experts")),
            experts_per_token=int(_field(config, "num_experts_per_token", "num_experts_per_tok")),
            num_shared_experts=int(_field(config, "num_shared_experts", "n_shared_experts", default=0)),
            first_dense_layers=int(config.get("first_k_dense_replace", 0)),
            moe_layer_freq=int(config.get("moe_layer_freq", 1)),
            mla_heads=int(config["num_attention_heads"]),
            kv_lora_rank=int(config["kv_lora_rank"]),
            qk_nope_head_dim=int(config["qk_nope_head_dim"]),
            qk_rope_head_dim=int(config["qk_rope_head_dim"]),
            v_head_dim=int(config["v_head_dim"]),
            kda_heads=int(_field(linear, "num_heads")),
            kda_head_dim=int(_field(linear, "head_dim")),
            conv_size=int(_field(linear, "short_conv_kernel_size")),
            kda_layers=tuple(sorted(kda_layers)),
            mla_layers=tuple(sorted(mla_layers)),
            tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        )

    def is_moe(self, layer: int) -> bool:
        return layer >= self.first_dense_layers and layer % self.moe_layer_freq == 0

    @property
    def moe_layers(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.num_layers) if self.is_moe(i))

    @property
    def shared_intermediate_size(self) -> int:
        return self.moe_intermediate_size * self.num_shared_experts


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


def checkpoint_tensors(dims: KimiDims, dtype: torch.dtype = torch.bfloat16) -> dict[str, TensorSpec]:
    """Every tensor of the HF checkpoint with its shape and dtype, in checkpoint order."""
    h, bf = dims.hidden_size, dtype
    tensors: dict[str, TensorSpec] = {"model.embed_tokens.weight": TensorSpec((dims.vocab_size, h), bf)}

    def add(name: str, shape: tuple[int, ...], dt: torch.dtype = bf) -> None:
        tensors[name] = TensorSpec(shape, dt)

    kda_width = dims.kda_heads * dims.kda_head_dim
    for i in range(dims.num_layers):
        p = f"model.layers.{i}."
        add(p + "input_layernorm.weight", (h,))
        add(p + "post_attention_layernorm.weight", (h,))
        if i in dims.kda_layers:
            a = p + "self_attn."
            for proj in ("q", "k", "v"):
                add(f"{a}{proj}_proj.weight", (kda_width, h))
                add(f"{a}{proj}_conv1d.weight", (kda_width, 1, dims.conv_size))
            add(a + "f_a_proj.weight", (dims.kda_head_dim, h))
            add(a + "f_b_proj.weight", (kda_width, dims.kda_head_dim))
            add(a + "A_log", (1, 1, dims.kda_heads, 1), torch.float32)
            add(a + "dt_bias", (kda_width,), torch.float32)
            add(a + "b_proj.weight", (dims.kda_heads, h))
            add(a + "g_a_proj.weight", (dims.kda_head_dim, h))
            add(a + "g_b_proj.weight", (kda_width, dims.kda_head_dim))
            add(a + "o_norm.weight", (dims.kda_head_dim,))
            add(a + "o_proj.weight", (h, kda_width))
        else:
            a = p + "self_attn."
            qk_head = dims.qk_nope_head_dim + dims.qk_rope_head_dim
            add(a + "q_proj.weight", (dims.mla_heads * qk_head, h))
            add(a + "kv_a_proj_with_mqa.weight", (dims.kv_lora_rank + dims.qk_rope_head_dim, h))
            add(a + "kv_a_layernorm.weight", (dims.kv_lora_rank,))
            kv_width = dims.mla_heads * (dims.qk_nope_head_dim + dims.v_head_dim)
            add(a + "kv_b_proj.weight", (kv_width, dims.kv_lora_rank))
            add(a + "o_proj.weight", (h, dims.mla_heads * dims.v_head_dim))
        if dims.is_moe(i):
            m = p + "block_sparse_moe."
            add(m + "gate.weight", (dims.num_experts, h))
            add(m + "gate.e_score_correction_bias", (dims.num_experts,))
            if dims.num_shared_experts:
                width = dims.shared_intermediate_size
                add(m + "shared_experts.gate_proj.weight", (width, h))
                add(m + "shared_experts.up_proj.weight", (width, h))
                add(m + "shared_experts.down_proj.weight", (h, width))
            for e in range(dims.num_experts):
                add(f"{m}experts.{e}.w1.weight", (dims.moe_intermediate_size, h))
                add(f"{m}experts.{e}.w2.weight", (h, dims.moe_intermediate_size))
                add(f"{m}experts.{e}.w3.weight", (dims.moe_intermediate_size, h))
        else:
            add(p + "mlp.gate_proj.weight", (dims.intermediate_size, h))
            add(p + "mlp.up_proj.weight", (dims.intermediate_size, h))
            add(p + "mlp.down_proj.weight", (h, dims.intermediate_size))
    add("model.norm.weight", (h,))
    if not dims.tied_embeddings:
        add("lm_head.weight", (dims.vocab_size, h))
    return tensors
