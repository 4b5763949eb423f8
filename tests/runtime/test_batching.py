"""Continuous batching: every running sequence decodes in one step, with its own length, sampling and
slot; a long prompt arriving mid-stream delays the running streams by one chunk per step at most.

Near ties: batched and alone runs sum in a different order (padded rows, other GEMM blocking), so
their logits agree to FP32 rounding, not bit for bit. A greedy token may then differ only where the alone
run's top two logits are within TIE_TOLERANCE of each other; `assert_same_greedy` checks each
difference against the reference's margin there and compares no further (the texts diverge after it).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.model import SamplingParams, generate
from engine.model.moe import expert_ffn
from engine.model.paths import DECODE_MAX_ROWS
from engine.runtime import Failed, Finished, Request, Scheduler, Started, Token
from engine.runtime.batch import bucket_for
from tests.runtime.runtime_support import random_prompt, running_scheduler, tiny_engine
from tests.runtime.test_runtime_scheduler import Collector, _wait_until

TIE_TOLERANCE = 1e-3  # logits (FP32, tiny model): far above the batched-vs-alone rounding differences


def assert_same_greedy(model, prompt: list[int], got: list[int], want: list[int]) -> None:
    """`got` (batched) equals `want` (alone), except from a near tie of the alone run on."""
    for i, (g, w) in enumerate(zip(got, want, strict=False)):
        if g != w:
            logits = model(torch.tensor([prompt + want[:i]], device=model.device))[0, -1]
            margin = (logits[w] - logits[g]).item()
            assert margin < TIE_TOLERANCE, f"token {i}: batched {g}, alone {w}, margin {margin:.2e}"
            return
    assert len(got) == len(want)


def _run(scheduler, requests) -> Collector:
    """Submit every request in the same step, then wait for them all."""
    out = Collector()
    scheduler.submit_together([(request, out.sink_for(label)) for label, request in requests.items()])
    out.wait(*requests)
    return out


@pytest.fixture
def batching(engine):
    with running_scheduler(engine, 8) as s:
        yield s


@pytest.mark.parametrize(("rows", "top_k", "experts"), [(2, 2, 8), (4, 2, 8), (5, 3, 8), (16, 8, 64)])
def test_batched_expert_slots_give_each_row_its_own_experts(rng, rows, top_k, experts):
    """Rows with overlapping choices, two with the same experts and (16 x 8 of 64) every expert chosen
    several times, against a float64 loop over each row's own experts (tolerance: FP32 sums)."""
    assert rows <= DECODE_MAX_ROWS  # the decode (slot) path, not prefill's grouping
    hidden, inter = 32, 24
    w1, w3 = (torch.randn(experts, inter, hidden, generator=rng) for _ in range(2))
    w2 = torch.randn(experts, hidden, inter, generator=rng)
    x = torch.randn(rows, hidden, generator=rng)
    ids = torch.stack([torch.randperm(experts, generator=rng)[:top_k] for _ in range(rows)])
    ids[1] = ids[0]  # two rows with the same experts
    weights = torch.rand(rows, top_k, generator=rng)
    got = expert_ffn(x, ids, weights, w1, w3, w2)
    want = torch.zeros(rows, hidden, dtype=torch.float64)
    for n in range(rows):
        for e, w in zip(ids[n].tolist(), weights[n].double(), strict=True):
            h = F.silu(w1[e].double() @ x[n].double()) * (w3[e].double() @ x[n].double())
            want[n] += w * (w2[e].double() @ h)
    torch.testing.assert_close(got.double(), want, atol=1e-3 * want.abs().max().item(), rtol=0)


def test_bucket_sizes():
    assert [bucket_for(n) for n in range(1, 10)] == [1, 2, 4, 4, 8, 8, 8, 8, 16]


def test_each_greedy_reply_is_the_same_alone_and_batched(engine, batching, rng):
    lengths, max_tokens = (7, 30, 100, 300, 64), (24, 40, 16, 32, 8)
    prompts = {f"r{i}": random_prompt(rng, n) for i, n in enumerate(lengths)}
    params = {label: SamplingParams(max_tokens=m) for label, m in zip(prompts, max_tokens, strict=True)}
    out = _run(batching, {label: Request(p, params[label]) for label, p in prompts.items()})
    assert max(r.decoded for r in batching.steps) == len(prompts)  # they really decoded together
    for label, prompt in prompts.items():
        alone = generate(engine.model, prompt, params[label]).token_ids
        assert_same_greedy(engine.model, prompt, out.tokens(label), alone)
        assert out.last(label) == Finished("length", len(prompt), 0, params[label].max_tokens)
    assert engine.pool.in_use_bytes == 0 and engine.pool.reserved_bytes == 0
    assert engine.batch.lease is None


def test_sampling_parameters_are_per_sequence(engine, rng):
    prompt = random_prompt(rng, 20)
    greedy = generate(engine.model, prompt, SamplingParams(max_tokens=12)).token_ids
    stop = greedy[5]
    requests = {
        "greedy": Request(prompt, SamplingParams(max_tokens=12)),
        "stops": Request(prompt, SamplingParams(max_tokens=12, stop_token_ids={stop})),
        "short": Request(prompt, SamplingParams(max_tokens=3)),
        "hot": Request(prompt, SamplingParams(max_tokens=12, temperature=1.5, seed=7)),
        "top1": Request(prompt, SamplingParams(max_tokens=12, temperature=1.5, top_k=1, seed=8)),
        "nucleus": Request(prompt, SamplingParams(max_tokens=12, temperature=0.9, top_p=0.5, seed=9)),
    }
    alone = {}
    with running_scheduler(engine, 1, max_queue=8) as single:
        for label, request in requests.items():
            alone[label] = _run(single, {label: request})
    with running_scheduler(engine, 8) as batched:
        together = _run(batched, requests)
        assert max(r.decoded for r in batched.steps) >= 4
    for label in requests:
        assert together.tokens(label) == alone[label].tokens(label), label
        assert together.last(label) == alone[label].last(label), label
    assert together.tokens("greedy") == greedy and together.tokens("top1") == greedy
    assert together.tokens("stops") == greedy[: greedy.index(stop)]
    assert together.last("stops").reason == "stop" and together.tokens("short") == greedy[:3]
    assert together.tokens("hot") != greedy  # sampled (a 12-token match at T=1.5 would be a fluke)


def test_a_cancelled_sequence_frees_its_row_at_the_next_step(engine, batching, rng):
    out = Collector()
    handles = {
        label: batching.submit(
            Request(random_prompt(rng, 15), SamplingParams(max_tokens=60)), out.sink_for(label)
        )
        for label in "abc"
    }
    _wait_until(lambda: len(engine.batch.members) == 3 and len(out.tokens("b")) >= 2)
    with out.lock:
        handles["b"].cancel()
        sent = len(out.tokens("b"))
    _wait_until(lambda: engine.batch.rows == 2)  # shrunk to the 2-row bucket while a and c run on
    assert len(engine.batch.members) == 2
    out.wait("a", "c")
    assert len(out.tokens("b")) <= sent + 1  # at most the step under way, then its row is gone
    assert not isinstance(out.last("b"), Finished) and batching.stats()["cancelled"] == 1
    assert len(out.tokens("a")) == len(out.tokens("c")) == 60
    assert engine.pool.in_use_bytes == 0 and engine.pool.reserved_bytes == 0


@pytest.fixture(scope="module")
def chunked_engine():
    with tiny_engine(prefill_chunk=512, prefix_cache_gib=0.05) as eng:
        yield eng


def test_a_long_prompt_mid_stream_delays_running_streams_by_one_chunk_per_step(chunked_engine, rng):
    engine = chunked_engine
    with running_scheduler(engine, 4) as s:
        out = Collector()
        short = random_prompt(rng, 12)
        s.submit(Request(short, SamplingParams(max_tokens=40)), out.sink_for("running"))
        _wait_until(lambda: len(out.tokens("running")) >= 3)
        long = random_prompt(rng, 4096)
        s.submit(Request(long, SamplingParams(max_tokens=8)), out.sink_for("long"))
        out.wait("running", "long")
    chunks = 4096 // 512
    assert max(r.prefill_tokens for r in s.steps) <= 512
    prefilling = [r for r in s.steps if r.prefill_tokens][1:]  # the first is the short prompt's
    assert len(prefilling) == chunks and all(r.decoded >= 1 for r in prefilling)  # "running" went on
    labels = [(lab, type(e)) for lab, e in out.events]
    started, first = labels.index(("long", Started)), labels.index(("long", Token))
    assert labels[started:first].count(("running", Token)) >= chunks - 1  # a token per chunk
    assert out.tokens("long") == generate(engine.model, long, SamplingParams(max_tokens=8)).token_ids
    assert_same_greedy(
        engine.model,
        short,
        out.tokens("running"),
        generate(engine.model, short, SamplingParams(max_tokens=40)).token_ids,
    )


def test_a_finished_reply_is_kept_for_the_next_turn(chunked_engine, rng):
    engine = chunked_engine
    with running_scheduler(engine, 2) as s:
        prompt = random_prompt(rng, 40)
        first = _run(s, {"turn1": Request(prompt, SamplingParams(max_tokens=20))})
        reply = first.tokens("turn1")
        follow_up = prompt + reply + random_prompt(rng, 10)
        second = _run(s, {"turn2": Request(follow_up, SamplingParams(max_tokens=10))})
    started = next(e for lab, e in second.events if isinstance(e, Started))
    assert started.cached_tokens == len(prompt) + len(reply) - 1  # all but the last token was fed
    want = generate(engine.model, follow_up, SamplingParams(max_tokens=10)).token_ids
    assert_same_greedy(engine.model, follow_up, second.tokens("turn2"), want)
    assert not any(isinstance(e, Failed) for _, e in first.events + second.events)


@pytest.mark.slow
def test_the_compiled_step_compiles_once_per_bucket_and_gives_the_eager_tokens(rng):
    """All three join in one step: one 4-row runner (compiled by the warm-up, as `serve` does, since the
    compile outlasts the collector's wait), compiled once, no recompiles over the generation."""
    engine = tiny_engine(max_context=2048, step="compiled")
    assert engine.warm_up(256, batch=4) is not None
    s = Scheduler(engine, max_active=4, max_queue=4)
    s.start()
    try:
        prompts = {f"r{i}": random_prompt(rng, n) for i, n in enumerate((9, 40, 70))}
        params = SamplingParams(max_tokens=24)
        out = Collector()
        runners = []
        watched = out.sink_for("r0")

        def sink(event):  # on the executor thread, mid-generation: the batch's runner is in use
            if isinstance(event, Token) and len(out.tokens("r0")) == 4:
                runners.append(engine.batch.lease.runner)
            watched(event)

        s.submit_together(
            [
                (Request(p, params), sink if label == "r0" else out.sink_for(label))
                for label, p in prompts.items()
            ]
        )
        out.wait(*prompts)
    finally:
        s.stop()
        engine.close()
    assert runners[0].cache.batch_size == 4 and runners[0].compiled.compilations == 1
    assert engine.pool.steps_compiled == 1  # they finished together: no smaller bucket was compiled
    for label, prompt in prompts.items():
        assert_same_greedy(
            engine.model, prompt, out.tokens(label), generate(engine.model, prompt, params).token_ids
        )


@pytest.mark.gpu
def test_cuda_graphs_per_bucket_give_the_tokens_of_eager_decode(rng):
    """One graph per (bucket, capacity) in the pool's shared graph memory, replayed for every step."""
    engine = tiny_engine(device="cuda", max_context=4096)
    s = Scheduler(engine, max_active=8, max_queue=8)
    s.start()
    try:
        prompts = {f"r{i}": random_prompt(rng, n) for i, n in enumerate((5, 33, 300, 64, 17))}
        params = SamplingParams(max_tokens=32)
        out = _run(s, {label: Request(p, params) for label, p in prompts.items()})
        alone = {label: generate(engine.model, p, params).token_ids for label, p in prompts.items()}
    finally:
        s.stop()
        engine.close()
    assert max(r.decoded for r in s.steps) == len(prompts)
    assert engine.pool.graphs_captured >= 1 and engine.pool.graphs_for(8)
    for label, prompt in prompts.items():
        assert_same_greedy(engine.model, prompt, out.tokens(label), alone[label])
