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


_COUNTERS: dict[torch.device, torch.Tensor] = {}
_MIN_COUNTERS = 1 << 16  # every split-K GEMV of the full model at batch 8 fits: no growth during a decode


def counters(count: int, device: torch.device) -> torch.Tensor:
    """``count`` zeroed int32 arrival counters for split-K GEMVs on ``device``, kept for the process: each
    kernel returns the counters it used to zero, so one buffer serves every launch on the stream (the
    engine launches on one stream; two concurrent streams would need one buffer each)."""
    device = torch.device(device)
    held = _COUNTERS.get(device)
    if held is None or held.numel() < count:
        held = _COUNTERS[device] = torch.zeros(max(count, _MIN_COUNTERS), dtype=torch.int32, device=device)
    return held[:count]
