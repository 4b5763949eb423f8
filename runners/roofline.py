"""Bytes a decode step must read, counted from the loaded model's own tensors, and the roofline they imply.

Per token at batch 1: every weight tensor once, except the routed experts (only `top-k` of `E` are read)
and the embedding (one row); plus the recurrent state traffic (KDA state and conv windows read and
written) and the MLA latent cache read over the context. Whatever storage the model uses (BF16, FP32,
packed INT4 buffers) is counted at its real size. Activations are small and not counted.
"""

from __future__ import annotations

import torch

from engine.model import KimiLinearForCausalLM, SequenceCache


def weight_bytes_per_token(model: KimiLinearForCausalLM) -> dict[str, int]:
    """Weight bytes read per decoded token, by component."""
    cfg = model.config
    parts: dict[str, int] = {}
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        size = tensor.numel() * tensor.element_size()
        if ".experts." in name:
            component, size = "routed_experts", size * cfg.num_experts_per_token // cfg.num_experts
        elif "embed_tokens" in name:
            component, size = "embedding_row", size // cfg.vocab_size
        elif "lm_head" in name:
            component = "lm_head"
        elif "shared_experts" in name or ".mlp." in name:
            component = "shared_and_dense_mlp"
        elif "self_attn" in name:
            component = "attention"
        else:
            component = "norms_and_router"
        parts[component] = parts.get(component, 0) + size
    return parts


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
