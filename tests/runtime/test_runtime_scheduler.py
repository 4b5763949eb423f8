"""The executor thread: FIFO admission, interleaved sequences, back-pressure, cancellation frees at once."""

from __future__ import annotations

import threading
import time

import pytest

from engine.model import SamplingParams, generate
from engine.runtime import Failed, Finished, QueueFull, Request, Started, Token
from tests.runtime.runtime_support import random_prompt, running_scheduler, submitted_together

TIMEOUT_S = 30


class Collector:
    """A sink recording (request label, event) in arrival order, with a wait for each request's end."""

    def __init__(self):
        self.events = []
        self.ended = {}
        self.lock = threading.Lock()

    def sink_for(self, label):
        self.ended[label] = threading.Event()

        def sink(event):
            with self.lock:
                self.events.append((label, event))
            if isinstance(event, Finished | Failed):
                self.ended[label].set()

        return sink

    def wait(self, *labels):
        for label in labels:
            assert self.ended[label].wait(TIMEOUT_S), f"request {label} did not finish"

    def tokens(self, label):
        return [e.token_id for lab, e in self.events if lab == label and isinstance(e, Token)]

    def last(self, label):
        return [e for lab, e in self.events if lab == label][-1]


@pytest.fixture
def scheduler(engine):
    with running_scheduler(engine, 2) as s:
        yield s


def _wait_until(condition):
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def test_requests_generate_what_generate_does_and_interleave(engine, scheduler, rng):
    prompts = [random_prompt(rng, 30), random_prompt(rng, 30)]
    params = SamplingParams(max_tokens=20)
    out = Collector()
    scheduler.submit_together(
        [(Request(p, params), out.sink_for(label)) for label, p in zip("ab", prompts, strict=True)]
    )
    out.wait("a", "b")
    for label, p in zip("ab", prompts, strict=True):
        assert out.tokens(label) == generate(engine.model, p, params).token_ids
        assert isinstance(out.events[[lab for lab, _ in out.events].index(label)][1], Started)
        assert out.last(label) == Finished("length", 30, 0, 20)
    labels = [lab for lab, e in out.events if isinstance(e, Token)]
    assert labels.index("b") < len(labels) - labels[::-1].index("a") - 1  # b streamed while a was running


def test_stop_token_ends_with_stop(engine, scheduler, rng):
    prompt = random_prompt(rng, 25)
    free = generate(engine.model, prompt, SamplingParams(max_tokens=10)).token_ids
    stop = free[3]
    out = Collector()
    scheduler.submit(Request(prompt, SamplingParams(max_tokens=10, stop_token_ids={stop})), out.sink_for("s"))
    out.wait("s")
    first = free.index(stop)
    assert out.tokens("s") == free[:first]
    assert out.last("s") == Finished("stop", 25, 0, first + 1)


def test_a_full_queue_pushes_back_and_fifo_order_holds(engine, rng):
    with running_scheduler(engine, 1, max_queue=2) as s:
        out = Collector()
        with submitted_together(s):
            for label in "xyz":  # one for the free slot, two waiting
                s.submit(Request(random_prompt(rng, 10), SamplingParams(max_tokens=3)), out.sink_for(label))
            with pytest.raises(QueueFull) as full:
                s.submit(Request(random_prompt(rng, 10), SamplingParams(max_tokens=3)), out.sink_for("w"))
            assert full.value.retry_after_s >= 1 and s.stats()["rejected"] == 1
        out.wait("x", "y", "z")
        assert [lab for lab, e in out.events if isinstance(e, Started)] == ["x", "y", "z"]
        assert [lab for lab, e in out.events if isinstance(e, Finished)] == ["x", "y", "z"]


def test_requests_submitted_together_are_queued_all_or_none(engine, rng):
    with running_scheduler(engine, 1, max_queue=2) as s:
        out = Collector()

        def requests(labels):
            return [
                (Request(random_prompt(rng, 10), SamplingParams(max_tokens=3)), out.sink_for(x))
                for x in labels
            ]

        with pytest.raises(QueueFull):  # four do not fit in one slot and two places
            s.submit_together(requests("abcd"))
        assert s.stats()["queued"] == 0 and s.stats()["rejected"] == 4
        s.submit_together(requests("xyz"))
        out.wait("x", "y", "z")
        assert [lab for lab, e in out.events if isinstance(e, Started)] == ["x", "y", "z"]


def test_cancel_frees_the_sequence_at_once(engine, scheduler, rng):
    out = Collector()
    handle = scheduler.submit(
        Request(random_prompt(rng, 20), SamplingParams(max_tokens=4000)), out.sink_for("long")
    )
    _wait_until(lambda: len(out.tokens("long")) >= 3)
    assert engine.pool.in_use_bytes > 0 and engine.pool.reserved_bytes > 0
    handle.cancel()
    _wait_until(lambda: scheduler.stats()["active"] == 0)
    assert engine.pool.in_use_bytes == 0 and engine.pool.reserved_bytes == 0
    assert scheduler.stats()["cancelled"] == 1
    assert len(out.tokens("long")) < 4000 and not isinstance(out.last("long"), Finished)


def test_cancelled_while_queued_never_runs(engine, scheduler, rng):
    out = Collector()
    with submitted_together(scheduler):
        handle = scheduler.submit(
            Request(random_prompt(rng, 10), SamplingParams(max_tokens=3)), out.sink_for("q")
        )
        handle.cancel()
    _wait_until(lambda: scheduler.stats()["queued"] == 0)
    assert scheduler.stats()["cancelled"] == 1 and out.events == []


def test_impossible_request_fails_cleanly(engine, scheduler):
    out = Collector()
    scheduler.submit(Request([1] * 10, SamplingParams(max_tokens=engine.max_context)), out.sink_for("big"))
    out.wait("big")
    failed = out.last("big")
    assert isinstance(failed, Failed) and failed.code == "invalid" and "max context" in failed.message


def test_a_failing_admission_releases_its_reservation_and_serving_goes_on(
    engine, scheduler, rng, monkeypatch
):
    take = engine.pool.take
    calls = []

    def broken_once(*args, **kwargs):
        calls.append(args)
        if len(calls) == 1:
            raise RuntimeError("device lost")
        return take(*args, **kwargs)

    monkeypatch.setattr(engine.pool, "take", broken_once)
    out = Collector()
    scheduler.submit(Request(random_prompt(rng, 10), SamplingParams(max_tokens=3)), out.sink_for("bad"))
    out.wait("bad")
    assert out.last("bad") == Failed("internal error: device lost", "internal")
    assert engine.pool.reserved_bytes == 0
    scheduler.submit(Request(random_prompt(rng, 10), SamplingParams(max_tokens=3)), out.sink_for("good"))
    out.wait("good")
    assert isinstance(out.last("good"), Finished)


def test_long_prefill_logs_progress(caplog, rng):
    """A prompt of more than PREFILL_LOG_EVERY_CHUNKS chunks logs tokens done/total, tok/s and the time
    left every that many chunks and once at the end; a short one logs nothing."""
    from engine.runtime import Engine
    from engine.runtime.scheduler import PREFILL_LOG_EVERY_CHUNKS

    chunk = 8
    eng = Engine.load(
        synthetic="tiny", device="cpu", max_context=512, prefill_chunk=chunk, prefix_cache_gib=0
    )
    with running_scheduler(eng, 1) as s:
        n_chunks = 2 * PREFILL_LOG_EVERY_CHUNKS + 1
        with caplog.at_level("INFO", logger="engine.runtime.scheduler"):
            for label, length in (
                ("short", chunk * PREFILL_LOG_EVERY_CHUNKS),
                ("long", chunk * n_chunks - 3),
            ):
                caplog.clear()
                c = Collector()
                s.submit(Request(random_prompt(rng, length), SamplingParams(max_tokens=1)), c.sink_for(label))
                c.wait(label)
                lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("prefill ")]
                if label == "short":
                    assert lines == []
        total = chunk * n_chunks - 3
        assert len(lines) == 3, lines
        every = chunk * PREFILL_LOG_EVERY_CHUNKS
        assert lines[0].startswith(f"prefill {every}/{total} tokens") and "tok/s, about" in lines[0]
        assert lines[1].startswith(f"prefill {2 * every}/{total} tokens")
        assert lines[-1].startswith(f"prefill {total}/{total} tokens (100%)") and "left" not in lines[-1]
