"""Scratch buffers for kernels (split-K partial sums), poisonable so checks can prove every slot is written."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

_poison = False


def scratch(shape: tuple[int, ...], device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An uninitialised FP32 buffer, or a NaN-filled one inside :func:`poisoned_scratch`."""
    if _poison:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


@contextlib.contextmanager
def poisoned_scratch() -> Iterator[None]:
    """Fill every scratch buffer with NaN, so a partial a kernel forgot to write shows up in its output."""
    global _poison
    previous, _poison = _poison, True
    try:
        yield
    finally:
        _poison = previous
