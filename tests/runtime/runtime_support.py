"""Helpers shared by the runtime tests."""

from __future__ import annotations

import torch


def random_prompt(rng: torch.Generator, n: int, vocab: int = 256) -> list[int]:
    """n random byte tokens (the tiny model's ordinary text range)."""
    return torch.randint(0, vocab, (n,), generator=rng).tolist()
