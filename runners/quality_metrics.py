"""Quality measures of a candidate model against a reference model on the same inputs.

- Teacher-forced next-token distributions: KL(reference ‖ candidate) per position, top-1 agreement,
  negative log-likelihood of the actual next token (perplexity = exp of its mean).
- Greedy continuations: tokens until the first divergence.
- Router decisions: the set of experts each MoE layer picks for each token, captured by hooking the
  routers (order inside the set does not matter).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.model import KimiLinearForCausalLM
from engine.model.moe import Router


@dataclass
class ForcedPass:
    """Everything kept from one teacher-forced pass over the evaluation sequences."""

    log_probs: torch.Tensor  # [B, T-1, vocab] FP32, predictions for positions 1..T-1
    nll: torch.Tensor  # [B, T-1] of the actual next token
    expert_sets: dict[int, torch.Tensor]  # MoE layer index -> [B*T, k] sorted expert ids


@contextlib.contextmanager
def capture_routing(model: KimiLinearForCausalLM) -> Iterator[dict[int, list[torch.Tensor]]]:
    """Record the expert ids every router chooses, per layer index, while the block runs."""
    captured: dict[int, list[torch.Tensor]] = {}
    handles = []
    for index, layer in enumerate(model.model.layers):
        router = getattr(getattr(layer, "block_sparse_moe", None), "gate", None)
        if isinstance(router, Router):

            def hook(_module, _inputs, output, index=index):
                captured.setdefault(index, []).append(output[1].sort(-1).values.cpu())

            handles.append(router.register_forward_hook(hook))
    try:
        yield captured
    finally:
        for handle in handles:
            handle.remove()


@torch.inference_mode()
def forced_pass(model: KimiLinearForCausalLM, sequences: torch.Tensor) -> ForcedPass:
    """Run `sequences` [B, T] through the model in one forward (no cache)."""
    with capture_routing(model) as captured:
        logits = model(sequences)
    log_probs = F.log_softmax(logits[:, :-1].float(), dim=-1).cpu()
    targets = sequences[:, 1:].cpu()
    nll = -log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return ForcedPass(log_probs, nll, {i: torch.cat(chunks) for i, chunks in captured.items()})


def kl_per_position(reference: ForcedPass, candidate: ForcedPass) -> torch.Tensor:
    """KL(reference ‖ candidate) in nats for every position, [B, T-1]."""
    p = reference.log_probs.exp()
    return (p * (reference.log_probs - candidate.log_probs)).sum(-1).clamp_min(0.0)


def top1_agreement(reference: ForcedPass, candidate: ForcedPass) -> torch.Tensor:
    """1.0 where both models rank the same token first, else 0.0, [B, T-1]."""
    return (reference.log_probs.argmax(-1) == candidate.log_probs.argmax(-1)).float()


def expert_set_agreement(reference: torch.Tensor, candidate: torch.Tensor) -> tuple[float, float]:
    """(exact-set agreement, mean overlap |A ∩ B| / k) over tokens, for sorted expert ids [N, k]."""
    exact = (reference == candidate).all(-1).float().mean().item()
    shared = (reference.unsqueeze(-1) == candidate.unsqueeze(-2)).any(-1).sum(-1)
    return exact, (shared.float() / reference.shape[-1]).mean().item()


@torch.inference_mode()
def greedy_tokens(model: KimiLinearForCausalLM, prompts: torch.Tensor, n: int) -> torch.Tensor:
    """`n` greedy tokens after each prompt [B, P] (no stop tokens), [B, n] on the CPU."""
    cache = model.new_cache(prompts.shape[1] + n, batch_size=prompts.shape[0])
    token = model.prefill(prompts, cache).argmax(-1)
    out = [token]
    for _ in range(n - 1):
        token = model.decode_step(token, cache).argmax(-1)
        out.append(token)
    return torch.stack(out, dim=1).cpu()


def common_prefix(reference: torch.Tensor, candidate: torch.Tensor) -> torch.Tensor:
    """Tokens generated identically before the first divergence, per sequence [B] (n when identical)."""
    same = (reference == candidate).int()
    return same.cumprod(-1).sum(-1)
