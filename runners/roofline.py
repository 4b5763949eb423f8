"""Bytes a decode step must read, counted from the loaded model's own tensors, and the roofline they imply.

Per token at batch 1: every weight tensor once, except the routed experts (only `top-k` of `E` are read)
and the embedding (one row); plus the recurrent state traffic (KDA state and conv windows read and
written) and the MLA latent cache read over the context. Whatever storage the model uses (BF16, FP32,
packed INT4 buffers, a BF16 head next to FP32 activations) is counted at its real size. A packed expert
bank is read in `top-k` routed slots plus its shared-expert slot, when it holds one. Activations are
small and not counted.
"""

from __future__ import annotations

import torch

from engine.model import KimiLinearForCausalLM, SequenceCache
from engine.quant import PackedExpertBank


def weight_bytes_per_token(model: KimiLinearForCausalLM) -> dict[str, int]:
    """Weight bytes read per decoded token, by component."""
    cfg = model.config
    parts: dict[str, int] = {}

    def add(component: str, size: int) -> None:
        parts[component] = parts.get(component, 0) + size

    for module_name, module in model.named_modules():
        for tensor_name, tensor in [
            *module.named_parameters(recurse=False),
            *module.named_buffers(recurse=False),
        ]:
            size = tensor.numel() * tensor.element_size()
            if isinstance(module, PackedExpertBank):
                per_slot = size // module.slots
                add("routed_experts", per_slot * cfg.num_experts_per_token)
                if module.shared_slot is not None:
                    add("shared_and_dense_mlp", per_slot)
            else:
                add(*_component(cfg, f"{module_name}.{tensor_name}", size))
    return parts


def _component(cfg, name: str, size: int) -> tuple[str, int]:
    """The component a dense (or packed linear) tensor belongs to, and its bytes read per token."""
    if ".experts." in name:
        return "routed_experts", size * cfg.num_experts_per_token // cfg.num_experts
    if "embed_tokens" in name:
        return "embedding_row", size // cfg.vocab_size
    if "lm_head" in name:
        return "lm_head", size
    if "shared_experts" in name or ".mlp." in name:
        return "shared_and_dense_mlp", size
    if "self_attn" in name:
        return "attention", size
    return "norms_and_router", size


def state_bytes_per_token(cache: SequenceCache, context: int) -> dict[str, int]:
    """State traffic per decoded token at `context` cached tokens (one sequence)."""
    kda = mla = 0
    for layer in cache.layers:
        if hasattr(layer, "recurrent"):
            kda += 2 * (_row_bytes(layer.recurrent) + _row_bytes(layer.conv))  # read + write
        else:
            per_token = layer.kv.shape[-1] * layer.kv.element_size()
            mla += (context + 1) * per_token  # attend over the context, append one latent
    return {"state_kda": kda, "state_mla_cache": mla}


def _row_bytes(tensor: torch.Tensor) -> int:
    """Bytes of one sequence's slice of a batch-first state tensor."""
    return tensor[0].numel() * tensor.element_size()
