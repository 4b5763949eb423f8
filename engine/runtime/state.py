"""Copies of a sequence's state: the written prefix of a `SequenceCache`, taken out or put back in place.

A KDA layer's state is fixed-size (conv windows and the recurrent matrix); an MLA layer's is the first
`length` rows of its latent cache. That is all a sequence is, so a snapshot restores it exactly: into
a cache of any capacity (to grow a sequence's cache) or from host memory (the prefix cache).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.model import SequenceCache
from engine.model.cache import MLAState


@dataclass
class StateSnapshot:
    length: int
    tensors: list[torch.Tensor]  # per layer: kv[:, :length] (MLA) or conv, recurrent (KDA)
    logits: torch.Tensor | None  # [B, vocab] FP32 after the last token, when the caller kept them
    ready: torch.cuda.Event | None = None  # set when the copy to the host is still in flight

    @property
    def nbytes(self) -> int:
        extra = [] if self.logits is None else [self.logits]
        return sum(t.numel() * t.element_size() for t in [*self.tensors, *extra])

    def wait(self) -> None:
        if self.ready is not None:
            self.ready.synchronize()
            self.ready = None


def _state_views(cache: SequenceCache, length: int) -> list[torch.Tensor]:
    """The tensors holding a sequence of `length` tokens, in layer order."""
    out: list[torch.Tensor] = []
    for state in cache.layers:
        if isinstance(state, MLAState):
            out.append(state.kv[:, :length])
        else:
            out += [state.conv, state.recurrent]
    return out


def take_snapshot(
    cache: SequenceCache, logits: torch.Tensor | None = None, *, device: torch.device | str | None = None
) -> StateSnapshot:
    """Copy the written state (and optionally the last logits) to `device` (default: the cache's own).
    A copy from a GPU to the CPU goes into pinned memory without blocking; `wait()` before reading it."""
    target = torch.device(device) if device is not None else cache.device
    to_host = target.type == "cpu" and cache.device.type == "cuda"
    sources = _state_views(cache, cache.length) + ([] if logits is None else [logits.float()])
    copies = []
    for src in sources:
        dst = torch.empty(src.shape, dtype=src.dtype, device=target, pin_memory=to_host)
        copies.append(dst.copy_(src, non_blocking=to_host))
    ready = None
    if to_host:
        ready = torch.cuda.Event()
        ready.record()
    tensors, kept_logits = (copies[:-1], copies[-1]) if logits is not None else (copies, None)
    return StateSnapshot(length=cache.length, tensors=tensors, logits=kept_logits, ready=ready)


def restore_snapshot(snapshot: StateSnapshot, cache: SequenceCache) -> None:
    """Make `cache` hold exactly the snapshot's sequence (buffers keep their addresses)."""
    snapshot.wait()
    _copy_into(snapshot.tensors, snapshot.length, cache)


def transfer(src: SequenceCache, dst: SequenceCache) -> None:
    """Move a sequence into another cache (e.g. a larger one) on the same device."""
    _copy_into(_state_views(src, src.length), src.length, dst)


def _copy_into(tensors: list[torch.Tensor], length: int, cache: SequenceCache) -> None:
    if length > cache.max_len:
        raise ValueError(f"a state of {length} tokens does not fit a cache of {cache.max_len}")
    for dst, src in zip(_state_views(cache, length), tensors, strict=True):
        dst.copy_(src, non_blocking=True)
    cache.position.fill_(length)
    cache.length = length
