"""The engine's host work around each token: sampling the next token, the cache pool's bookkeeping
for a sequence, and one scheduler step (everything the executor loop does per token but the
model's batched decode step, which a stub stands in for)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from benchmarks.conftest import case
from engine.model import SamplingParams
from engine.model.presets import preset
from engine.runtime import Engine, Request, Sampler, Scheduler, Token

VOCAB = preset("full").vocab_size  # Kimi-Linear's vocabulary: what every token's logits span
SAMPLING = {
    "greedy": SamplingParams(temperature=0.0),
    "top_p": SamplingParams(temperature=0.7, top_p=0.95, seed=1),
}


@pytest.fixture(scope="module")
def engine():
    eng = Engine.load(synthetic="tiny", device="cpu", max_context=8192, prefix_cache_gib=0)
    yield eng
    eng.close()


@pytest.mark.parametrize("mode", SAMPLING)
def test_sample(benchmark, mode):
    params = SAMPLING[mode]
    logits = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(0))
    sampler = Sampler(params, torch.device("cpu"))
    generated = [list(range(64))]
    token = sampler(logits, generated)
    assert 0 <= int(token) < VOCAB
    if mode == "greedy":
        assert int(token) == int(logits.argmax())
    case(benchmark, f"engine.sample.{mode}", area="engine", vocab=VOCAB, temperature=params.temperature,
         top_p=params.top_p)  # fmt: skip
    benchmark(sampler, logits, generated)


def test_cache_lease(benchmark, engine):
    """Admission's and release's cache bookkeeping: reserve, take an idle cache, give it back."""
    pool = engine.pool
    prompt, total = 512, 512 + 256

    def lease_cycle():
        nbytes = pool.reservation_for(prompt, total)
        assert pool.reserve(nbytes)
        lease = pool.take(prompt)
        pool.give_back(lease)
        pool.unreserve(nbytes)

    lease_cycle()  # the first cycle allocates; the timed ones reuse the idle cache, as a server does
    case(benchmark, "engine.cache.lease_cycle", area="engine", model="tiny", prompt_tokens=prompt,
         total_tokens=total)  # fmt: skip
    benchmark(lease_cycle)
    assert pool.in_use_bytes == 0 and pool.reserved_bytes == 0


class _StubEngine:
    """Answers every batched decode step at once with the same token: only the scheduler's own work is
    left."""

    device = torch.device("cpu")
    plan = SimpleNamespace(prefill_chunk=2048)

    def __init__(self, seq):
        self.seq = seq

    def decode_batch(self):
        self.seq.generated.append([7])
        return [(self.seq, 7)]

    def release(self, seq):
        pass


def test_scheduler_turn(benchmark):
    """One step of the executor loop for one decoding sequence: cancel check, prefill and join passes
    (nothing to do), the batched step's token, stop and length checks, and the event to the sink."""
    seq = SimpleNamespace(prefilled=True, generated=[[7]], max_new_tokens=1 << 30)
    scheduler = Scheduler(_StubEngine(seq), max_active=1)
    received = []
    handle = SimpleNamespace(request=Request([1, 2, 3], SamplingParams(max_tokens=1 << 30)),
                             sink=received.append, cancelled=False)  # fmt: skip
    scheduler._active.append(SimpleNamespace(handle=handle, seq=seq, sampler=None, joined=True))
    scheduler._step()  # what the loop runs each step
    assert received == [Token(7)]
    case(benchmark, "engine.scheduler.turn", area="engine")
    benchmark(scheduler._step)
