"""Prefix state cache: a coding agent's next turn resends the whole conversation, so keep the state after
each prompt and after each generated reply, and, for a prompt that extends a kept one, prefill only the
new tokens.

An entry is a `StateSnapshot` of a whole prompt (KDA states, MLA latents and the last logits) keyed by a
hash of its token ids. A lookup finds the longest kept prompt that is a prefix of the new one; an
exact repeat needs no prefill at all (the logits are kept). Entries are evicted least recently used
first to stay within a byte budget. On a GPU the snapshots live in pinned host memory.
"""

from __future__ import annotations

import hashlib
from collections import Counter, OrderedDict
from collections.abc import Sequence

import numpy as np
import torch

from engine.model import SequenceCache
from engine.runtime.state import StateSnapshot, take_snapshot


def _prefix_digests(ids: Sequence[int], lengths: list[int]) -> dict[int, bytes]:
    """Hash of ids[:n] for each n in `lengths`, in one pass over the ids."""
    data = np.asarray(ids, dtype=np.int64).tobytes()
    h = hashlib.blake2b(digest_size=16)
    out, done = {}, 0
    for n in sorted(lengths):
        h.update(data[done * 8 : n * 8])
        done = n
        out[n] = h.copy().digest()
    return out


class PrefixCache:
    def __init__(self, max_bytes: int, *, device: torch.device | str, min_tokens: int = 1):
        self.max_bytes = max_bytes
        self.device = torch.device(device)  # where snapshots are kept
        self.min_tokens = min_tokens
        self._entries: OrderedDict[bytes, StateSnapshot] = OrderedDict()
        self._lengths: Counter[int] = Counter()
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.hit_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, ids: Sequence[int]) -> StateSnapshot | None:
        """The snapshot of the longest kept prompt that `ids` starts with (marked recently used)."""
        candidates = [n for n in self._lengths if n <= len(ids)]
        digests = _prefix_digests(ids, candidates)
        for n in sorted(candidates, reverse=True):
            snapshot = self._entries.get(digests[n])
            if snapshot is not None:
                self._entries.move_to_end(digests[n])
                self.hits += 1
                self.hit_tokens += n
                return snapshot
        self.misses += 1
        return None

    def store(
        self, ids: Sequence[int], cache: SequenceCache, logits: torch.Tensor, *, row: int | None = None
    ) -> None:
        """Keep the state of `cache`, which holds exactly the tokens `ids`, and its last logits. With
        `row`, the sequence in that row of a continuous batch (holding len(ids) tokens)."""
        if row is None and len(ids) != cache.length:
            raise ValueError(f"cache holds {cache.length} tokens, not the {len(ids)} given")
        if len(ids) < self.min_tokens:
            return
        key = _prefix_digests(ids, [len(ids)])[len(ids)]
        if key in self._entries:
            self._entries.move_to_end(key)
            return
        snapshot = take_snapshot(cache, logits, device=self.device, row=row, length=len(ids))
        if snapshot.nbytes > self.max_bytes:
            return
        while self.bytes + snapshot.nbytes > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self._forget(evicted)
        self._entries[key] = snapshot
        self._lengths[snapshot.length] += 1
        self.bytes += snapshot.nbytes

    def _forget(self, snapshot: StateSnapshot) -> None:
        self.bytes -= snapshot.nbytes
        self._lengths[snapshot.length] -= 1
        if not self._lengths[snapshot.length]:
            del self._lengths[snapshot.length]

    def stats(self) -> dict:
        return {
            "entries": len(self._entries),
            "bytes": self.bytes,
            "max_bytes": self.max_bytes,
            "hits": self.hits,
            "misses": self.misses,
            "hit_tokens": self.hit_tokens,
        }
