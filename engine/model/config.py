"""Model configuration, read from a Hugging Face `config.json` (Moonshot field names or transformers' aliases)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A config.json the engine cannot run (unsupported variant or inconsistent fields)."""


@dataclass(frozen=True)
class KimiLinearConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int  # dense SwiGLU of the first `first_k_dense_replace` layers
    # MLA (full attention, no positional encoding)
    num_attention_heads: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    # KDA (linear attention)
    kda_num_heads: int
    kda_head_dim: int
    conv_kernel_size: int
    full_attn_layers: tuple[int, ...]  # zero-based indices of the MLA layers; every other layer is KDA
    # MoE
    num_experts: int
    num_experts_per_token: int
    num_shared_experts: int
    moe_intermediate_size: int
    first_k_dense_replace: int
    routed_scaling_factor: float
    moe_renormalize: bool
    rms_norm_eps: float
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None

    # MLA's kv_a_layernorm is built without the config eps in the reference code (class default 1e-6).
    mla_latent_norm_eps = 1e-6
    # q and k are L2-normalised as x / sqrt(sum(x^2) + eps) (fla's use_qk_l2norm_in_kernel).
    kda_l2norm_eps = 1e-6

    def __post_init__(self) -> None:
        bad = [i for i in self.full_attn_layers if not 0 <= i < self.num_hidden_layers]
        if bad:
            raise ConfigError(f"full_attn_layers {bad} outside 0..{self.num_hidden_layers - 1}")
        if not 0 < self.num_experts_per_token <= self.num_experts:
            raise ConfigError(
                f"num_experts_per_token={self.num_experts_per_token} with {self.num_experts} experts"
            )
        if not 0 <= self.first_k_dense_replace <= self.num_hidden_layers:
            raise ConfigError(f"first_k_dense_replace={self.first_k_dense_replace} out of range")

    # -- layer layout -------------------------------------------------------------------------------
    def is_mla_layer(self, index: int) -> bool:
        return index in self.full_attn_layers

    def is_moe_layer(self, index: int) -> bool:
        return index >= self.first_k_dense_replace

    @property
    def kda_layers(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.num_hidden_layers) if i not in self.full_attn_layers)

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def kda_dim(self) -> int:
        return self.kda_num_heads * self.kda_head_dim

    # -- (de)serialisation --------------------------------------------------------------------------
    @classmethod
    def from_file(cls, path: str | Path) -> KimiLinearConfig:
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError as e:
            raise ConfigError(f"no config.json at {path}") from e
        return cls.from_hf_dict(raw)

    @classmethod
    def from_hf_dict(cls, raw: dict[str, Any]) -> KimiLinearConfig:
        """Parse Moonshot's config.json; transformers' attribute names are accepted as aliases."""

        def get(*names: str, default: Any = _REQUIRED) -> Any:
            for name in names:
                if name in raw:
                    return raw[name]
            if default is _REQUIRED:
                raise ConfigError(f"config.json lacks {' / '.join(names)}")
            return default

        model_type = raw.get("model_type", "kimi_linear")
        if model_type != "kimi_linear":
            raise ConfigError(f"model_type {model_type!r} is not kimi_linear")
        if get("q_lora_rank", default=None) is not None:
            raise ConfigError(
                "q_lora_rank is set: only the direct q_proj MLA variant (Kimi-Linear) is supported"
            )
        if not get("mla_use_nope", default=True):
            raise ConfigError("mla_use_nope=false (rotary MLA) is not supported: Kimi-Linear's MLA is NoPE")
        if get("moe_router_activation_func", default="sigmoid") != "sigmoid":
            raise ConfigError("only the sigmoid router (moe_router_activation_func='sigmoid') is supported")
        if get("num_expert_group", "n_group", default=1) != 1 or get("topk_group", default=1) != 1:
            raise ConfigError("grouped top-k with more than one group is not supported (Kimi-Linear uses 1)")
        if get("tie_word_embeddings", default=False):
            raise ConfigError("tied embeddings are not supported (Kimi-Linear has an untied head)")
        if get("moe_layer_freq", default=1) != 1:
            raise ConfigError("moe_layer_freq != 1 is not supported")
        if get("num_nextn_predict_layers", default=0):
            raise ConfigError("multi-token-prediction layers are not supported")

        n_layers = int(get("num_hidden_layers"))
        lin = raw.get("linear_attn_config") or {}
        full = _full_attention_layers(raw, lin, n_layers)
        n_heads = int(get("num_attention_heads"))
        return cls(
            vocab_size=int(get("vocab_size")),
            hidden_size=int(get("hidden_size")),
            num_hidden_layers=n_layers,
            intermediate_size=int(get("intermediate_size")),
            num_attention_heads=n_heads,
            kv_lora_rank=int(get("kv_lora_rank")),
            qk_nope_head_dim=int(get("qk_nope_head_dim")),
            qk_rope_head_dim=int(get("qk_rope_head_dim")),
            v_head_dim=int(get("v_head_dim")),
            kda_num_heads=int(lin.get("num_heads", get("linear_num_heads", default=n_heads))),
            kda_head_dim=int(lin.get("head_dim", get("linear_head_dim", default=128))),
            conv_kernel_size=int(lin.get("short_conv_kernel_size", get("linear_conv_kernel_dim", default=4))),
            full_attn_layers=full,
            num_experts=int(get("num_experts", "num_local_experts")),
            num_experts_per_token=int(get("num_experts_per_token", "num_experts_per_tok")),
            num_shared_experts=int(get("num_shared_experts", "n_shared_experts", default=1)),
            moe_intermediate_size=int(get("moe_intermediate_size")),
            first_k_dense_replace=int(get("first_k_dense_replace", default=1)),
            routed_scaling_factor=float(get("routed_scaling_factor", default=1.0)),
            moe_renormalize=bool(get("moe_renormalize", "norm_topk_prob", default=True)),
            rms_norm_eps=float(get("rms_norm_eps", default=1e-5)),
            bos_token_id=get("bos_token_id", default=None),
            eos_token_id=get("eos_token_id", default=None),
            pad_token_id=get("pad_token_id", default=None),
        )

    def to_hf_dict(self) -> dict[str, Any]:
        """The config.json the real checkpoint ships (Moonshot's field names), for this configuration."""
        full_1b = [i + 1 for i in self.full_attn_layers]
        return {
            "architectures": ["KimiLinearForCausalLM"],
            "model_type": "kimi_linear",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "moe_intermediate_size": self.moe_intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_attention_heads,
            "head_dim": self.hidden_size // self.num_attention_heads,
            "q_lora_rank": None,
            "kv_lora_rank": self.kv_lora_rank,
            "qk_nope_head_dim": self.qk_nope_head_dim,
            "qk_rope_head_dim": self.qk_rope_head_dim,
            "v_head_dim": self.v_head_dim,
            "mla_use_nope": True,
            "rope_theta": 10000.0,
            "rope_scaling": None,
            "num_experts": self.num_experts,
            "num_experts_per_token": self.num_experts_per_token,
            "num_shared_experts": self.num_shared_experts,
            "first_k_dense_replace": self.first_k_dense_replace,
            "moe_layer_freq": 1,
            "moe_renormalize": self.moe_renormalize,
            "moe_router_activation_func": "sigmoid",
            "routed_scaling_factor": self.routed_scaling_factor,
            "use_grouped_topk": True,
            "num_expert_group": 1,
            "topk_group": 1,
            "linear_attn_config": {
                "num_heads": self.kda_num_heads,
                "head_dim": self.kda_head_dim,
                "short_conv_kernel_size": self.conv_kernel_size,
                "full_attn_layers": full_1b,
                "kda_layers": [i + 1 for i in self.kda_layers],
            },
            "rms_norm_eps": self.rms_norm_eps,
            "hidden_act": "silu",
            "tie_word_embeddings": False,
            "num_nextn_predict_layers": 0,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "pad_token_id": self.pad_token_id,
            "torch_dtype": "bfloat16",
            "use_cache": True,
        }

    def describe(self) -> dict[str, Any]:
        return asdict(self)


_REQUIRED = object()


def _full_attention_layers(raw: dict[str, Any], lin: dict[str, Any], n_layers: int) -> tuple[int, ...]:
    """Zero-based MLA layer indices. The checkpoint lists are one-based (HF tests `(i + 1) in kda_layers`)."""
    if "full_attn_layers" in lin:
        full = sorted(int(i) - 1 for i in lin["full_attn_layers"])
        kda = sorted(
            int(i) - 1 for i in lin.get("kda_layers", [j + 1 for j in range(n_layers) if j not in full])
        )
        if sorted(full + kda) != list(range(n_layers)):
            raise ConfigError(
                "linear_attn_config: full_attn_layers and kda_layers (one-based) must partition "
                f"1..{n_layers}; got full={[i + 1 for i in full]} kda={[i + 1 for i in kda]}"
            )
        return tuple(full)
    if "layer_types" in raw and raw["layer_types"]:
        types = raw["layer_types"]
        if len(types) != n_layers:
            raise ConfigError(f"layer_types has {len(types)} entries for {n_layers} layers")
        return tuple(i for i, t in enumerate(types) if t == "full_attention")
    # Guessing a layout silently is how transformers' fallback ends up wrong; refuse instead.
    raise ConfigError("config.json has neither linear_attn_config.full_attn_layers nor layer_types")
