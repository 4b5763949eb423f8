"""Token generation: prefill, then one decode step per token with greedy / temperature / top-p sampling.

This is the eager reference loop (one host sync per token to check stop tokens). A CUDA-graph runner
drives `KimiLinearForCausalLM.decode_step` itself and can reuse `sample`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from engine.model.cache import SequenceCache
from engine.model.model import KimiLinearForCausalLM

# Called once per step with the tokens generated so far and the logits [vocab] of the next token;
# returns the logits to sample from (e.g. with some tokens masked to -inf).
LogitsProcessor = Callable[[Sequence[int], torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # keep the k most likely tokens; 0 keeps all
    min_p: float = 0.0  # drop tokens below min_p times the most likely token's probability
    stop_token_ids: frozenset[int] = field(default_factory=frozenset)
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 keeps every token), got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        object.__setattr__(self, "stop_token_ids", frozenset(self.stop_token_ids))


@dataclass(frozen=True)
class GeneratedToken:
    token_id: int
    finish_reason: str | None  # None while generating; "stop" (token_id is the stop token) or "length"


@dataclass(frozen=True)
class GenerationResult:
    token_ids: list[int]  # without the stop token
    finish_reason: str  # "stop" or "length"
    stop_token_id: int | None


def sample(
    logits: torch.Tensor,
    temperature: float,
    top_p: float,
    generator: torch.Generator | None = None,
    top_k: int = 0,
    min_p: float = 0.0,
) -> torch.Tensor:
    """logits [B, vocab] -> token ids [B]. Greedy when temperature == 0 or top_k == 1; otherwise
    softmax(logits / T) restricted to the top_k most likely tokens (0: all), then to those with at
    least min_p times the top probability, then to the smallest set whose mass reaches top_p (vLLM's
    order of the three filters)."""
    if temperature == 0 or top_k == 1:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if 0 < top_k < probs.shape[-1]:
        kth = probs.topk(top_k, dim=-1).values[..., -1:]
        probs = probs.masked_fill(probs < kth, 0.0)
    if min_p > 0:
        probs = probs.masked_fill(probs < min_p * probs.amax(-1, keepdim=True), 0.0)
    if top_k > 0 or min_p > 0:
        probs = probs / probs.sum(-1, keepdim=True)
    if top_p < 1:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(mass_before >= top_p, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def generate_stream(
    model: KimiLinearForCausalLM,
    prompt_ids: Sequence[int],
    params: SamplingParams,
    *,
    cache: SequenceCache | None = None,
    logits_processor: LogitsProcessor | None = None,
) -> Iterator[GeneratedToken]:
    """Yield generated tokens one by one; the last one carries the finish reason. A cache passed in must
    be empty (or hold exactly a prefix the prompt continues from) and have room for prompt + max_tokens."""
    if not prompt_ids:
        raise ValueError("the prompt must contain at least one token")
    vocab = model.config.vocab_size
    bad = [t for t in prompt_ids if not 0 <= t < vocab]
    if bad:
        raise ValueError(f"prompt token ids out of range 0..{vocab - 1}: {bad[:5]}")
    if cache is None:
        cache = model.new_cache(len(prompt_ids) + params.max_tokens)
    else:
        cache.check_room(len(prompt_ids) + params.max_tokens)
    generator = None
    if params.seed is not None:
        generator = torch.Generator(device=model.device).manual_seed(params.seed)

    logits = model.prefill(torch.tensor([list(prompt_ids)], device=model.device), cache)
    generated: list[int] = []
    while True:
        if logits_processor is not None:
            logits = logits_processor(generated, logits[0]).unsqueeze(0)
        token = sample(logits, params.temperature, params.top_p, generator, params.top_k, params.min_p)
        token_id = int(token.item())
        generated.append(token_id)
        if token_id in params.stop_token_ids:
            yield GeneratedToken(token_id, "stop")
            return
        if len(generated) == params.max_tokens:
            yield GeneratedToken(token_id, "length")
            return
        yield GeneratedToken(token_id, None)
        logits = model.decode_step(token, cache)


def generate(
    model: KimiLinearForCausalLM,
    prompt_ids: Sequence[int],
    params: SamplingParams,
    *,
    cache: SequenceCache | None = None,
    logits_processor: LogitsProcessor | None = None,
) -> GenerationResult:
    tokens: list[int] = []
    for step in generate_stream(model, prompt_ids, params, cache=cache, logits_processor=logits_processor):
        if step.finish_reason == "stop":
            return GenerationResult(tokens, "stop", step.token_id)
        tokens.append(step.token_id)
    return GenerationResult(tokens, "length", None)
