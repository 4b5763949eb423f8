"""TorchThread runs what it is given on one thread, in order, and hands back results and errors; a
scheduler given one runs its loop there (the thread that loaded the engine), else on a thread of its own."""

from __future__ import annotations

import threading

import pytest

from engine.model import SamplingParams
from engine.runtime import Request, Scheduler, TorchThread
from tests.runtime.runtime_support import random_prompt
from tests.runtime.test_batching import _run


def test_calls_run_in_order_on_one_thread_and_errors_come_back():
    thread = TorchThread("probe")
    try:
        seen = [thread.call(lambda i=i: (i, threading.current_thread().name)) for i in range(5)]
        assert [i for i, _ in seen] == list(range(5)) and {name for _, name in seen} == {"probe"}
        with pytest.raises(ZeroDivisionError):
            thread.call(lambda: 1 / 0)
        assert thread.call(lambda: "still serving") == "still serving"
    finally:
        thread.close()


@pytest.mark.parametrize("given", [True, False])
def test_the_scheduler_steps_on_the_thread_it_is_given(engine, rng, monkeypatch, given):
    names: set[str] = set()
    real = engine.prefill_step

    def spy(seq, max_tokens=None):
        names.add(threading.current_thread().name)
        return real(seq, max_tokens)

    monkeypatch.setattr(engine, "prefill_step", spy)
    thread = TorchThread("engine-owner") if given else None
    s = Scheduler(engine, max_active=2, max_queue=2, torch_thread=thread)
    s.start()
    try:
        out = _run(s, {"only": Request(random_prompt(rng, 12), SamplingParams(max_tokens=3))})
    finally:
        s.stop()
    assert len(out.tokens("only")) == 3
    assert names == ({"engine-owner"} if given else {"model-executor"})
    if thread is not None:
        assert thread.call(lambda: "alive after the scheduler stopped") == "alive after the scheduler stopped"
        thread.close()
