"""Per-sequence sampling state: the parameters, a seeded generator, an optional logits processor."""

from __future__ import annotations

import torch

from engine.model import SamplingParams, sample
from engine.model.generate import LogitsProcessor


class Sampler:
    def __init__(
        self,
        params: SamplingParams,
        device: torch.device,
        logits_processor: LogitsProcessor | None = None,
    ):
        self.params = params
        self.logits_processor = logits_processor
        self.generator = None
        if params.seed is not None:
            self.generator = torch.Generator(device=device).manual_seed(params.seed)

    def __call__(self, logits: torch.Tensor, generated: list[list[int]]) -> torch.Tensor:
        """logits [B, vocab] (left untouched) and each row's tokens so far (read only by a logits
        processor; without one, pass []) -> next token ids [B]."""
        if self.logits_processor is not None:
            logits = torch.stack(
                [self.logits_processor(g, row) for g, row in zip(generated, logits, strict=True)]
            )
        p = self.params
        return sample(logits, p.temperature, p.top_p, self.generator, p.top_k, p.min_p)
