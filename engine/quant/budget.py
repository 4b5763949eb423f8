"""Bytes a batch-1 decode step must move: the denominator of every bandwidth roofline.

Counted: each stored weight a token touches, at the plan's precision (the ``top-k`` routed experts of
each MoE layer, the shared experts, every attention / KDA / MLP / router / norm tensor, the LM head and
one embedding row), plus the recurrent-state traffic (KDA state and short-conv windows read and written)
and the MLA latent cache read at the given context length. Activations are negligible and not counted.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.codec import quantized_nbytes
from engine.model.checkpoint_spec import TensorSpec, checkpoint_tensors
from engine.model.config import KimiLinearConfig
from engine.quant.plan import Plan


@dataclass(frozen=True)
class TokenBytes:
    """Bytes per decoded token, by component (weight classes of the plan, then state traffic)."""

    components: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.components.values())

    @property
    def weights(self) -> int:
        return sum(v for k, v in self.components.items() if not k.startswith("state:"))


def stored_nbytes(spec: TensorSpec, precision: str, plan: Plan) -> int:
    """Bytes a tensor occupies once the plan has stored it at ``precision``."""
    if precision in ("int4", "int8"):
        return quantized_nbytes(spec.shape, precision, plan.group_size, plan.scale_torch_dtype)
    if precision == "bf16":
        return 2 * spec.numel
    return spec.nbytes


def decode_bytes_per_token(
    cfg: KimiLinearConfig,
    plan: Plan,
    *,
    context_tokens: int = 0,
    state_bytes: int = 4,
    conv_state_bytes: int = 2,
    cache_bytes: int = 2,
) -> TokenBytes:
    """Bytes read (and, for state, written) per decoded token at batch 1.

    ``context_tokens`` is how many tokens the MLA layers attend over (a latent cache of
    ``kv_lora_rank + qk_rope_head_dim`` elements per token and layer, ``cache_bytes`` each). ``state_bytes`` / ``conv_state_bytes`` are the element sizes of the KDA recurrent state (FP32)
    and of the short-convolution windows.
    """
    components: dict[str, int] = {}
    for spec in checkpoint_tensors(cfg):
        decision = plan.decide(spec.name, spec.shape)
        stored = stored_nbytes(spec, decision.precision, plan)
        if decision.tensor_class == "routed_expert":
            stored = stored * cfg.num_experts_per_token // cfg.num_experts
        elif decision.tensor_class == "embedding":
            stored //= cfg.vocab_size
        components[decision.tensor_class] = components.get(decision.tensor_class, 0) + stored

    kda_layers = len(cfg.kda_layers)
    # Read and written once per step.
    components["state:kda_recurrent"] = 2 * kda_layers * cfg.kda_num_heads * cfg.kda_head_dim**2 * state_bytes
    components["state:kda_conv"] = 2 * kda_layers * 3 * cfg.kda_dim * cfg.conv_kernel_size * conv_state_bytes
    latent = cfg.kv_lora_rank + cfg.qk_rope_head_dim
    # Attend over the context, then append the new token's latent.
    components["state:mla_cache"] = len(cfg.full_attn_layers) * (context_tokens + 1) * latent * cache_bytes
    return TokenBytes(components)
