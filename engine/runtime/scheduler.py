"""The model executor: one thread that owns the engine and batches the sequences in flight.

Requests wait in a FIFO queue: beyond the free slots, at most `max_queue` may wait (`submit` raises
QueueFull beyond that: back-pressure).
The head of the queue is admitted when a slot (`max_active`) and memory for its cache are free; nothing
behind it overtakes it. Each step of the loop (continuous batching):
1. drops the cancelled sequences (their caches and batch rows are free for this very step);
2. prefills at most `prefill_budget` prompt tokens (default: the engine's prefill chunk), oldest prompt
   first, so a long prompt delays the running streams by at most one chunk per step; prompts at the same
   point (new ones of one step) prefill together in one forward pass, up to the shortest one's length;
   a prompt that is done samples its first token from the prefill's logits and joins the decode batch;
3. runs one decode step for every joined sequence together (`Engine.decode_batch`), each sampled with
   its own parameters.
Results go to a per-request `sink` callable, called on this thread: `Started`, then `Token`s, then
`Finished` or `Failed`. `Handle.cancel()` (any thread) makes the sequence release its cache at the next
step. A reply that ends (stop or length) leaves its state in the prefix cache for the next turn.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from functools import partial

import torch

from common.memory_cap import MemoryCapExceeded
from engine.kernels.cpp_cpu import flush_denormals
from engine.model import SamplingParams
from engine.model.generate import LogitsProcessor
from engine.runtime.engine import Engine, EngineBusy, PromptBatch
from engine.runtime.sampling import Sampler
from engine.runtime.torch_thread import TorchThread

log = logging.getLogger(__name__)
PREFILL_LOG_EVERY_CHUNKS = 4


@dataclass(frozen=True)
class Request:
    prompt_ids: list[int]
    params: SamplingParams
    logits_processor: LogitsProcessor | None = None


@dataclass(frozen=True)
class Started:
    cached_tokens: int  # prompt tokens restored from the prefix cache (not prefilled again)


@dataclass(frozen=True)
class Token:
    token_id: int


@dataclass(frozen=True)
class Finished:
    reason: str  # "stop" (a stop token), "length" (max_tokens) or "cancelled"
    prompt_tokens: int
    cached_tokens: int  # prompt tokens restored from the prefix cache
    completion_tokens: int  # including a final stop token


@dataclass(frozen=True)
class Failed:
    message: str
    code: str  # "memory" (over the cap), "invalid" (cannot ever run), "shutdown" or "internal"


Event = Started | Token | Finished | Failed
Sink = Callable[[Event], None]


class QueueFull(RuntimeError):
    def __init__(self, depth: int, retry_after_s: int):
        super().__init__(f"the queue is full ({depth} requests waiting); retry after {retry_after_s} s")
        self.retry_after_s = retry_after_s


@dataclass
class Handle:
    request: Request
    sink: Sink
    _cancelled: threading.Event = field(default_factory=threading.Event)
    _wake: Callable[[], None] = lambda: None

    def cancel(self) -> None:
        """Stop generating and free the sequence (no further events are sent)."""
        self._cancelled.set()
        self._wake()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()


@dataclass
class _Active:
    handle: Handle
    seq: PromptBatch
    sampler: Sampler
    prefill: PrefillProgress
    joined: bool = False  # decoding in the batch (else prefilling, or waiting for a row)


@dataclass(frozen=True)
class StepRecord:
    """What one executor step did: prompt tokens prefilled and sequences decoded together."""

    prefill_tokens: int
    decoded: int


class PrefillProgress:
    """Logs a long prompt's prefill every `every` chunks and at its end: tokens done of total, tok/s and the
    time left, so a user waiting minutes on a CPU sees it move. Prompts of at most `every` chunks log nothing."""

    def __init__(self, seq: PromptBatch, chunk: int, every: int = PREFILL_LOG_EVERY_CHUNKS):
        self.total = seq.prompt_len
        self.start_done = seq.prompt_len - seq.pending.shape[1]  # restored from the prefix cache
        self.every, self.chunks = every, 0
        self.enabled = seq.pending.shape[1] > every * chunk
        self.started = time.monotonic()

    def step(self, seq: PromptBatch) -> None:
        self.chunks += 1
        if not self.enabled or (self.chunks % self.every and not seq.prefilled):
            return
        done = self.total - seq.pending.shape[1]
        elapsed = max(time.monotonic() - self.started, 1e-9)
        rate = (done - self.start_done) / elapsed
        left = f", about {(self.total - done) / rate:.0f} s left" if not seq.prefilled and rate else ""
        log.info(
            "prefill %d/%d tokens (%.0f%%) at %.0f tok/s%s",
            done, self.total, 100 * done / self.total, rate, left,
        )  # fmt: skip


class Scheduler:
    def __init__(
        self,
        engine: Engine,
        *,
        max_active: int = 4,
        max_queue: int = 16,
        retry_after_s: int = 1,
        prefill_budget: int | None = None,
        torch_thread: TorchThread | None = None,
    ):
        if max_active < 1 or max_queue < 0:
            raise ValueError("max_active must be positive and max_queue non-negative")
        if prefill_budget is not None and prefill_budget < 1:
            raise ValueError("prefill_budget must be positive")
        self.engine = engine
        self.prefill_budget = prefill_budget or engine.plan.prefill_chunk
        self.steps: deque[StepRecord] = deque(maxlen=10_000)  # the latest steps, for tests and benchmarks
        self.max_active = max_active
        self.max_queue = max_queue
        self.retry_after_s = retry_after_s
        self._cond = threading.Condition()
        self._waiting: deque[Handle] = deque()
        self._active: list[_Active] = []
        self._stopping = False
        # The loop runs on the thread that loaded the engine where the caller gives it (torch_thread.py).
        self._own_thread = torch_thread is None
        self._torch_thread = torch_thread or TorchThread("model-executor")
        self._loop: Future | None = None
        self.counts = {"completed": 0, "cancelled": 0, "failed": 0, "rejected": 0}

    # ------------------------------------------------------------------ control (any thread)

    def start(self) -> None:
        self._loop = self._torch_thread.submit(self._run)
        self._loop.add_done_callback(_report_crash)

    def stop(self, timeout_s: float = 10.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._loop is not None:
            wait([self._loop], timeout_s)
        if self._own_thread:
            self._torch_thread.close()

    def submit(self, request: Request, sink: Sink) -> Handle:
        return self.submit_together([(request, sink)])[0]

    def submit_together(self, requests: list[tuple[Request, Sink]]) -> list[Handle]:
        """Queue every request or none (QueueFull when they do not all fit): they reach the loop's next
        step together, as a round of requests sent at once does."""
        handles = [Handle(request, sink) for request, sink in requests]
        for handle in handles:
            handle._wake = self._notify
        with self._cond:
            if self._stopping:
                raise RuntimeError("the scheduler is stopped")
            free_slots = max(0, self.max_active - len(self._active))
            if len(self._waiting) + len(handles) > self.max_queue + free_slots:
                self.counts["rejected"] += len(handles)
                raise QueueFull(len(self._waiting), self.retry_after_s)
            self._waiting.extend(handles)
            self._cond.notify_all()
        return handles

    def stats(self) -> dict:
        with self._cond:
            return {
                "queued": len(self._waiting),
                "active": len(self._active),
                "decoding": sum(a.joined for a in self._active),  # in the decode batch (others prefill)
                "batch_rows": self.engine.batch.rows,  # the batch's bucket (idle rows included)
                "max_active": self.max_active,
                "max_queue": self.max_queue,
                **self.counts,
            }

    def _notify(self) -> None:
        with self._cond:
            self._cond.notify_all()

    # ------------------------------------------------------------------ the executor thread

    def _run(self) -> None:
        if self.engine.device.type == "cpu":
            flush_denormals()  # this thread's OpenMP workers too, if it is not the one that loaded the model
        while True:
            with self._cond:
                while True:
                    self._drop_cancelled_waiting()
                    if self._stopping or self._active or self._waiting:
                        break
                    self._cond.wait()
                if self._stopping:
                    break
            self._admit_waiting()
            self._step()
        self._shut_down()

    def _admit_waiting(self) -> None:
        while True:
            with self._cond:
                head = self._waiting[0] if self._waiting and len(self._active) < self.max_active else None
            if head is None or not self._admit(head):
                return

    def _drop_cancelled_waiting(self) -> None:
        kept = [h for h in self._waiting if not h.cancelled]
        self.counts["cancelled"] += len(self._waiting) - len(kept)
        self._waiting = deque(kept)

    def _admit(self, handle: Handle) -> bool:
        """Admit (or fail) the head of the queue; False when it must wait for memory, keeping its place."""
        request = handle.request
        try:
            seq = self.engine.start([request.prompt_ids], request.params.max_tokens, batched=True)
        except EngineBusy:
            if self._active:
                return False  # memory frees up when an active sequence ends
            self._pop(handle)
            self._fail(handle, "no memory for this sequence even with nothing else running", "memory")
            return True
        except ValueError as e:
            self._pop(handle)
            self._fail(handle, str(e), "invalid")
            return True
        except (torch.OutOfMemoryError, MemoryCapExceeded) as e:
            self._pop(handle)
            self._fail(handle, f"out of memory under the cap: {e}", "memory")
            return True
        except Exception as e:  # a bug: fail this request, keep serving
            log.exception("admission failed")
            self._pop(handle)
            self._fail(handle, f"internal error: {e}", "internal")
            return True
        self._pop(handle)
        sampler = Sampler(request.params, self.engine.device, request.logits_processor)
        progress = PrefillProgress(seq, self.engine.plan.prefill_chunk)
        with self._cond:
            self._active.append(_Active(handle, seq, sampler, progress))
        _emit(handle, Started(seq.cached_tokens))
        return True

    def _pop(self, handle: Handle) -> None:
        with self._cond:
            self._waiting.remove(handle)

    def _step(self) -> None:
        for active in [a for a in self._active if a.handle.cancelled]:
            self._end(active, None)
        prefilled = self._prefill()
        self._join()
        decoding = {id(a.seq): a for a in self._active if a.joined}
        if decoding:
            try:
                stepped = self.engine.decode_batch()
            except Exception as e:  # one step serves them all: each fails as it would alone
                for active in list(decoding.values()):
                    self._end(active, _failure(e))
                stepped = []
            for seq, token in stepped:
                self._deliver(decoding[id(seq)], token)
        self.steps.append(StepRecord(prefilled, len(decoding)))

    def _prefill(self) -> int:
        """Prefill up to the step's budget, oldest prompt first. Prompts whose caches hold as many tokens
        as the oldest one's (new prompts: none) go through one forward pass together, up to the shortest
        one's pending tokens (`Engine.prefill_together`), and the rest go on while the budget lasts; a
        finished prompt samples its first token. Returns the prompt tokens prefilled."""
        budget = self.prefill_budget
        prompts = [a for a in self._active if not a.seq.generated]
        while prompts and budget > 0:  # every pass spends budget or finishes (or fails) a prompt
            active = prompts[0]
            room = min(budget, self.engine.plan.prefill_chunk)  # one pass's tokens, all rows together
            group = self._prefill_group(prompts, room)
            if group:
                tokens = min(room // len(group), *(a.seq.pending.shape[1] for a in group))
                seqs = [a.seq for a in group]
                done = self._guarded(group, partial(self.engine.prefill_together, seqs, tokens))
                if done is False:  # no memory for the group's cache now: one by one
                    group = []
                elif done is True:
                    budget -= tokens * len(group)
            if not group:
                group = [active]
                n = min(budget, active.seq.pending.shape[1])
                budget -= n
                done = self._guarded(group, partial(self.engine.prefill_step, active.seq, n))
            if not isinstance(done, Exception):
                for member in group:
                    member.prefill.step(member.seq)
                    if member.seq.prefilled:
                        first = self._guarded(
                            [member], partial(self.engine.next_token, member.seq, member.sampler)
                        )
                        if isinstance(first, list):  # else the error that ended it
                            self._deliver(member, first[0])
            running = {id(a) for a in self._active}
            prompts = [a for a in prompts if id(a) in running and not a.seq.generated]
        return self.prefill_budget - budget

    @staticmethod
    def _prefill_group(prompts: list[_Active], room: int) -> list[_Active]:
        """The prompts to prefill together with the oldest (it first; at most `room`, one token each), or
        [] when it goes alone."""
        length = prompts[0].seq.held.cache.length

        def joins(seq: PromptBatch) -> bool:
            return seq.batch_size == 1 and not seq.prefilled and seq.held.cache.length == length

        if not joins(prompts[0].seq):
            return []
        group = [a for a in prompts if joins(a.seq)][:room]
        return group if len(group) > 1 else []

    def _join(self) -> None:
        """Move every prefilled sequence into the decode batch (those that do not fit wait a step)."""
        ready = [a for a in self._active if not a.joined and a.seq.generated]
        if not ready:
            return
        try:
            joined = self.engine.join([(a.seq, a.sampler) for a in ready])
        except Exception as e:
            for active in ready:
                self._end(active, _failure(e))
            return
        for active in ready[:joined]:
            active.joined = True

    def _guarded(self, group: list[_Active], work: Callable[[], object]) -> object:
        """Run work for these sequences (one, or a group served at once) and return its result; on an
        error, end each of them as failed and return the error."""
        try:
            return work()
        except Exception as e:
            for active in group:
                self._end(active, _failure(e))
            return e

    def _deliver(self, active: _Active, token: int) -> None:
        handle, seq = active.handle, active.seq
        if token in handle.request.params.stop_token_ids:
            self._end(active, self._finished("stop", seq))
            return
        _emit(handle, Token(token))
        if len(seq.generated) >= seq.max_new_tokens:
            self._end(active, self._finished("length", seq))

    @staticmethod
    def _finished(reason: str, seq: PromptBatch) -> Finished:
        return Finished(reason, seq.prompt_len, seq.cached_tokens, len(seq.generated))

    def _end(self, active: _Active, event: Finished | Failed | None) -> None:
        """Free the sequence first (a finished reply leaves its state in the prefix cache), then report
        (None: cancelled, nobody to tell)."""
        if isinstance(event, Finished):
            try:
                self.engine.keep_reply(active.seq)
            except Exception:  # the reply is complete; only the next turn's prefix hit is lost
                log.exception("could not keep the reply's state")
        self.engine.release(active.seq)
        with self._cond:
            self._active.remove(active)
            key = "cancelled" if event is None else "failed" if isinstance(event, Failed) else "completed"
            self.counts[key] += 1
        if event is not None:
            _emit(active.handle, event)

    def _fail(self, handle: Handle, message: str, code: str) -> None:
        with self._cond:
            self.counts["failed"] += 1
        _emit(handle, Failed(message, code))

    def _shut_down(self) -> None:
        for active in list(self._active):
            self._end(active, Failed("the server is shutting down", "shutdown"))
        with self._cond:
            waiting, self._waiting = list(self._waiting), deque()
        for handle in waiting:
            self._fail(handle, "the server is shutting down", "shutdown")


def _report_crash(loop: Future) -> None:
    if (error := loop.exception()) is not None:
        log.error("the model executor stopped", exc_info=error)


def _failure(e: Exception) -> Failed:
    if isinstance(e, torch.OutOfMemoryError | MemoryCapExceeded):
        return Failed(f"out of memory under the cap: {e}", "memory")
    log.exception("sequence failed", exc_info=e)  # a bug, not the client's fault: fail it, keep serving
    return Failed(f"internal error: {e}", "internal")


def _emit(handle: Handle, event: Event) -> None:
    try:
        handle.sink(event)
    except Exception:  # a sink that cannot deliver (its client or loop is gone) must not stop the executor
        log.exception("could not deliver an event")
        handle.cancel()
