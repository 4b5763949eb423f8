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


def _state_views(cache: SequenceCache, length: int, row: int | None = None) -> list[torch.Tensor]:
    """The tensors holding a sequence of `length` tokens, in layer order: every row of the cache, or
    only `row` (one sequence of a continuous batch, kept 3- or 4-dimensional)."""
    rows = slice(None) if row is None else slice(row, row + 1)
    out: list[torch.Tensor] = []
    for state in cache.layers:
        if isinstance(state, MLAState):
            out.append(state.kv[rows, :length])
        else:
            out += [state.conv[rows], state.recurrent[rows]]
    return out


def take_snapshot(
    cache: SequenceCache,
    logits: torch.Tensor | None = None,
    *,
    device: torch.device | str | None = None,
    row: int | None = None,
    length: int | None = None,
) -> StateSnapshot:
    """Copy the written state (and optionally the last logits) to `device` (default: the cache's own).
    `row` and `length` pick one sequence of a continuous batch (default: the whole cache, its length).
    A copy from a GPU to the CPU goes into pinned memory without blocking; `wait()` before reading it."""
    target = torch.device(device) if device is not None else cache.device
    to_host = target.type == "cpu" and cache.device.type == "cuda"
    length = cache.length if length is None else length
    sources = _state_views(cache, length, row) + ([] if logits is None else [logits.float()])
    copies = []
    for src in sources:
        dst = torch.empty(src.shape, dtype=src.dtype, device=target, pin_memory=to_host)
        copies.append(dst.copy_(src, non_blocking=to_host))
    ready = None
    if to_host:
        ready = torch.cuda.Event()
        ready.record()
    tensors, kept_logits = (copies[:-1], copies[-1]) if logits is not None else (copies, None)
    return StateSnapshot(length=length, tensors=tensors, logits=kept_logits, ready=ready)


def restore_snapshot(snapshot: StateSnapshot, cache: SequenceCache) -> None:
    """Make `cache` hold exactly the snapshot's sequence (buffers keep their addresses)."""
    snapshot.wait()
    _copy_into(snapshot.tensors, snapshot.length, cache)


def transfer(src: SequenceCache, dst: SequenceCache) -> None:
    """Move a sequence into another cache (e.g. a larger one) on the same device."""
    _copy_into(_state_views(src, src.length), src.length, dst)


def move_row(src: SequenceCache, src_row: int | None, length: int, dst: SequenceCache, dst_row: int) -> None:
    """Copy one sequence of `length` tokens from `src` (row `src_row`; None: a one-sequence cache) into
    row `dst_row` of `dst` and set that row's position; `dst`'s host length is the caller's to keep."""
    if length > dst.max_len:
        raise ValueError(f"a state of {length} tokens does not fit a cache of {dst.max_len}")
    for d, s in zip(_state_views(dst, length, dst_row), _state_views(src, length, src_row), strict=True):
        d.copy_(s, non_blocking=True)
    dst.position[dst_row] = length


def _copy_into(tensors: list[torch.Tensor], length: int, cache: SequenceCache) -> None:
    if length > cache.max_len:
        raise ValueError(f"a state of {length} tokens does not fit a cache of {cache.max_len}")
    for dst, src in zip(_state_views(cache, length), tensors, strict=True):
        dst.copy_(src, non_blocking=True)
    cache.position.fill_(length)
    cache.length = length
