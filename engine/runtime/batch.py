"""Continuous batching: every decoding sequence in one cache of a few rows, one decode step for all.

A sequence prefills in a one-row cache of its own (chunked, with the prefix cache, as before), then joins
the batch: its state is copied into a free row of the batch cache. The rows are bucketed to powers of two
(1, 2, 4, 8, ...) and the capacity is a power of two that holds the longest row, so the pool has one
decode runner per (bucket, capacity) — captured once as a CUDA graph in the pool's shared graph memory,
like any cache; a compiled step is compiled once per bucket and serves every capacity. A step feeds every row its last token and runs that runner once;
each row writes its own slot and masks the slots after it (`SequenceCache.position` per row), so rows of
different lengths share the step. Idle rows run along (their outputs are ignored; a join overwrites their
state). When the rows or the capacity needed change, the members move into a pool cache of the new shape
(copies of their state, nothing recomputed).

Memory: each sequence keeps the reservation it was admitted with (its final cache and the one it grows out
of). The batch reserves what its cache needs beyond the members' reservations (idle rows, rows sized up to
the longest); a join that cannot get it waits, growth for running rows takes it regardless (refusing would
stall them), and the cap's own check still catches a real overrun.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from engine.runtime.cache_pool import CachePool, Lease, required_lease
from engine.runtime.sampling import Sampler
from engine.runtime.state import move_row

if TYPE_CHECKING:
    from engine.runtime.engine import PromptBatch

GROWTH_TOKENS = 512  # a row joins with room for this many generated tokens before the batch must grow


def bucket_for(n: int) -> int:
    """The rows of a batch of `n` sequences: the next power of two."""
    return 1 << max(0, n - 1).bit_length()


def buckets_upto(n: int) -> list[int]:
    """Every bucket a batch of up to `n` sequences may use (the decode step shapes to warm up)."""
    return [1 << i for i in range(bucket_for(n).bit_length())]


@dataclass
class Member:
    seq: PromptBatch
    sampler: Sampler
    row: int
    length: int  # tokens in its row of the cache
    logits: torch.Tensor | None = None  # [vocab] of its latest token (a view of the step's output)

    @property
    def total(self) -> int:
        """The most tokens its row may hold: the prompt and every generated token but the last."""
        return self.seq.capacity

    @property
    def wanted(self) -> int:
        """Tokens of room it wants now (it grows later if it runs on)."""
        return min(self.total, self.length + GROWTH_TOKENS)


class DecodeBatch:
    def __init__(self, pool: CachePool):
        self.pool = pool
        self.lease: Lease | None = None
        self.members: list[Member] = []
        self.excess_bytes = 0  # reserved beyond the members' own reservations
        self.reshapes = 0  # times the members moved into a cache of another shape

    @property
    def held(self) -> Lease:
        """The batch cache's lease, while the batch has members."""
        return required_lease(self.lease, "the decode batch is empty: it holds no cache")

    @property
    def rows(self) -> int:
        return 0 if self.lease is None else self.lease.cache.batch_size

    @property
    def capacity(self) -> int:
        return 0 if self.lease is None else self.lease.cache.max_len

    def member(self, seq: PromptBatch) -> Member | None:
        return next((m for m in self.members if m.seq is seq), None)

    def join(self, newcomers: list[tuple[PromptBatch, Sampler]]) -> int:
        """Move prefilled sequences (their first tokens sampled) into the batch, in order, and give their
        own caches back: all in one reshape when they fit, else as many as fit one by one. Returns how
        many joined (the rest wait for memory that running sequences hold: try again after a step)."""
        if self._join(newcomers):
            return len(newcomers)
        joined = 0
        while joined < len(newcomers) and self._join(newcomers[joined : joined + 1]):
            joined += 1
        return joined

    def _join(self, newcomers: list[tuple[PromptBatch, Sampler]]) -> bool:
        fresh = [Member(seq, sampler, row=-1, length=seq.held.cache.length) for seq, sampler in newcomers]
        members = [*self.members, *fresh]
        rows = max(bucket_for(len(members)), self.rows)
        capacity = max(self.pool.capacity_for(max(m.wanted for m in members)), self.capacity)
        if not self._settle(members, rows, capacity, force=False):
            return False
        if (rows, capacity) != (self.rows, self.capacity):
            self._reshape(rows, capacity)
        free = sorted(set(range(self.rows)) - {m.row for m in self.members})
        for member, row in zip(fresh, free, strict=False):
            member.row = row
            move_row(member.seq.held.cache, None, member.length, self.held.cache, row)
            self.members.append(member)
            self.pool.give_back(member.seq.held)
            member.seq.lease = None
        return True

    def leave(self, seq: PromptBatch) -> None:
        """Drop a sequence's row (its reservation is the engine's to release); free the cache when it was
        the last (a smaller bucket is taken at the next step, so rows that leave together move once)."""
        self.members = [m for m in self.members if m.seq is not seq]
        if not self.members:
            self.pool.give_back(self.held)
            self.pool.unreserve(self.excess_bytes)
            self.lease, self.excess_bytes = None, 0
        else:
            self._settle(self.members, self.rows, self.capacity, force=True)

    @torch.no_grad()
    def step(self) -> list[tuple[Member, int]]:
        """One decode step for every member: feed its last token, sample its next with its own sampler.
        First the batch takes the shape its members need: a smaller bucket when half the rows or more
        are idle (with the capacity they want now), a larger capacity when the longest row is full."""
        longest = max(m.length for m in self.members)
        rows, capacity = self.rows, self.capacity
        if bucket_for(len(self.members)) < rows:
            rows = bucket_for(len(self.members))
            capacity = self.pool.capacity_for(max(m.wanted for m in self.members))
        if longest + 1 > capacity:
            grown = min(max(m.total for m in self.members), max(2 * capacity, longest + 1))
            capacity = self.pool.capacity_for(grown)
        if (rows, capacity) != (self.rows, self.capacity):
            self._settle(self.members, rows, capacity, force=True)
            self._reshape(rows, capacity)
        cache = self.held.cache
        tokens = [0] * self.rows
        for m in self.members:
            tokens[m.row] = m.seq.generated[-1][0]
        cache.length = longest  # the runner checks room for the longest row
        logits = self.held.decoder.step(torch.tensor(tokens, device=cache.device))
        sampled = []
        for m in self.members:
            m.length += 1
            m.logits = logits[m.row]
            columns = [[g[0] for g in m.seq.generated]] if m.sampler.logits_processor is not None else []
            sampled.append(m.sampler(logits[m.row : m.row + 1], columns))
        ids = torch.cat(sampled).tolist()
        for m, token in zip(self.members, ids, strict=True):
            m.seq.generated.append([token])
        return list(zip(self.members, ids, strict=True))

    def _settle(self, members: list[Member], rows: int, capacity: int, *, force: bool) -> bool:
        """Reserve (or give back) what a `rows` x `capacity` cache needs beyond `members`' own
        reservations; False when it does not fit now (forced: it is taken even past the budget)."""
        needed = max(0, self.pool.bytes_for(capacity, rows) - sum(m.seq.reservation for m in members))
        extra = needed - self.excess_bytes
        if extra > 0 and not self.pool.reserve(extra, force=force):
            return False
        if extra < 0:
            self.pool.unreserve(-extra)
        self.excess_bytes = needed
        return True

    def _reshape(self, rows: int, capacity: int) -> None:
        """Move the members into a pool cache of `rows` x `capacity` (its bytes already reserved)."""
        old, self.lease = self.lease, self.pool.take(capacity, rows)
        if old is not None:  # members only ever sit in a held cache
            for row, m in enumerate(self.members):
                move_row(old.cache, m.row, m.length, self.lease.cache, row)
                m.row = row
            self.pool.give_back(old)
        self.reshapes += 1
