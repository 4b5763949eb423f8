"""TorchThread runs what it is given on one thread, in order, and hands back results and errors; a
scheduler given one runs its loop there (the thread that loaded the engine), else on a thread of its own;
load_on_own_thread loads there and closes the thread when loading fails."""

from __future__ import annotations

import threading

import pytest

from engine.model import SamplingParams
from engine.runtime import LOAD_ERRORS, Request, Scheduler, TorchThread, load_on_own_thread
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


def test_load_on_own_thread_loads_there_and_closes_the_thread_when_loading_fails(monkeypatch):
    started: list[threading.Thread] = []
    real_init = TorchThread.__init__

    def recording_init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        started.append(self._thread)

    monkeypatch.setattr(TorchThread, "__init__", recording_init)
    torch_thread, engine = load_on_own_thread(
        synthetic="tiny", device="cpu", max_context=64, prefix_cache_gib=0
    )
    try:
        assert engine.model.config.hidden_size == 128
        assert torch_thread.call(lambda: threading.current_thread()) is started[0]
    finally:
        engine.close()
        torch_thread.close()
    with pytest.raises(LOAD_ERRORS):  # a cap nothing fits under: refused by the memory plan
        load_on_own_thread(
            synthetic="tiny", device="cpu", max_context=64, memory_cap_gib=1e-6, prefix_cache_gib=0
        )
    started[1].join(timeout=10)
    assert not started[1].is_alive()
