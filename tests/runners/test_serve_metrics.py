"""The serving benchmark's arithmetic on turns with known timestamps: TTFT (visible and any), ITL spread
over multi-token chunks, TPOT, E2E, token counts, errors, goodput; the dialect parsers; the datasets."""

from __future__ import annotations

import json
import statistics

import pytest

from runners.serve import datasets, dialects
from runners.serve.client import StreamedTurn
from runners.serve.dialects import Piece, Usage
from runners.serve.load import arrival_gaps
from runners.serve.metrics import (
    TokenCounter,
    apportion,
    level_derived,
    level_samples,
    measure,
    meets,
    parse_slo,
)


def turn(chunks, end, output_tokens=None, start=10.0):
    """A turn that started at `start`; chunks are (seconds after start, kind, text)."""
    return StreamedTurn(
        start=start,
        end=start + end,
        status=200,
        chunks=[(start + t, [Piece(kind, text)]) for t, kind, text in chunks],
        usage=Usage(7, output_tokens),
    )


def test_one_token_per_chunk():
    s = measure(turn([(0.1, "visible", "a"), (0.15, "visible", "b"), (0.2, "visible", "c"),
                      (0.3, "visible", "d")], end=0.35, output_tokens=4))  # fmt: skip
    assert s.ok and s.tokens_from_usage
    assert s.ttft_ms == pytest.approx(100) and s.ttft_any_ms == pytest.approx(100)
    assert s.itl_ms == pytest.approx((50, 50, 100))
    assert s.e2e_ms == pytest.approx(350)
    assert s.tpot_ms == pytest.approx((350 - 100) / 3)
    assert s.output_tokens == 4 and s.input_tokens == 7


def test_several_tokens_per_chunk_spread_over_the_gap():
    # 8 tokens from usage over chunks of 2, 4 and 2 characters: 2, 4 and 2 tokens.
    s = measure(turn([(0.1, "visible", "ab"), (0.2, "visible", "cdef"), (0.4, "visible", "gh")], end=0.4,
                     output_tokens=8))  # fmt: skip
    assert s.itl_ms == pytest.approx((25, 25, 25, 25, 100, 100))
    assert len(s.itl_ms) == 8 - 2  # the first chunk's second token came with the first: TTFT covers it
    assert sum(s.itl_ms) == pytest.approx(300)  # the ITLs add up to first chunk -> last chunk
    assert s.tpot_ms == pytest.approx((400 - 100) / 7)


def test_reasoning_first_stream_has_two_ttfts():
    s = measure(turn([(0.05, "reasoning", "hm"), (0.1, "reasoning", "ok"), (0.3, "visible", "hi")], end=0.31,
                     output_tokens=3))  # fmt: skip
    assert s.ttft_any_ms == pytest.approx(50)
    assert s.ttft_ms == pytest.approx(300)
    assert s.itl_ms == pytest.approx((50, 200))
    assert s.tpot_ms == pytest.approx((310 - 50) / 2)


def test_reasoning_only_stream_has_no_visible_ttft():
    s = measure(turn([(0.05, "reasoning", "hm")], end=0.06, output_tokens=1))
    assert s.ok and s.ttft_ms is None and s.ttft_any_ms == pytest.approx(50) and s.tpot_ms is None


def test_without_usage_the_fallback_tokenizer_counts():
    by_chars = TokenCounter("one token a character", len)
    s = measure(turn([(0.1, "visible", "abc"), (0.2, "visible", "de")], end=0.2), by_chars)
    assert not s.tokens_from_usage and s.output_tokens == 5
    assert s.itl_ms == pytest.approx((50, 50))


@pytest.mark.parametrize(("total", "weights", "want"), [
    (8, [2, 4, 2], [2, 4, 2]), (3, [5, 5, 5], [1, 1, 1]), (2, [1, 1, 1], [1, 1, 1]), (10, [1, 1, 1], [4, 3, 3]),
])  # fmt: skip
def test_apportion(total, weights, want):
    got = apportion(total, weights)
    assert got == want and min(got) >= 1


def test_errors_are_counted_and_kept_out_of_latencies():
    good = measure(turn([(0.1, "visible", "a"), (0.2, "visible", "b")], end=0.2, output_tokens=2))
    bad = measure(StreamedTurn(start=0.0, end=5.0, status=500, error="HTTP 500: no"))
    empty = measure(StreamedTurn(start=0.0, end=0.1, status=200))
    assert not bad.ok and bad.error == "HTTP 500: no" and not empty.ok
    raw = level_samples([good, bad, empty])
    assert raw["ok"] == [1.0, 0.0, 0.0]
    assert raw["e2e_ms"] == pytest.approx([200])  # the failed request's 5 s is not a latency
    derived = level_derived([good, bad, empty], seconds=2.0, slo={})
    assert derived["errors"] == 2 and derived["requests"] == 3
    assert derived["output_tok_s"] == pytest.approx(1.0)  # only the successful request's 2 tokens
    assert derived["request_throughput"] == pytest.approx(0.5)


def test_goodput_counts_requests_within_every_bound():
    fast = measure(turn([(0.1, "visible", "a"), (0.12, "visible", "b")], end=0.12, output_tokens=2))
    slow_start = measure(turn([(0.9, "visible", "a"), (0.92, "visible", "b")], end=0.92, output_tokens=2))
    slow_decode = measure(turn([(0.1, "visible", "a"), (0.5, "visible", "b")], end=0.5, output_tokens=2))
    bad = measure(StreamedTurn(start=0.0, end=0.1, error="boom"))
    slo = parse_slo("ttft_ms=500,tpot_ms=100")
    assert [meets(s, slo) for s in (fast, slow_start, slow_decode, bad)] == [True, False, False, False]
    assert level_derived([fast, slow_start, slow_decode, bad], 2.0, slo)["goodput"] == pytest.approx(0.5)
    assert meets(bad, {}) is False and meets(slow_start, {}) is True


@pytest.mark.parametrize("text", ["ttft=5", "ttft_ms", "ttft_ms=x", "tpot_ms=-1"])
def test_parse_slo_refuses_bad_bounds(text):
    with pytest.raises(ValueError, match="ttft_ms|tpot_ms"):
        parse_slo(text)


def test_chat_pieces_usage_and_errors():
    reasoning = {"choices": [{"delta": {"reasoning": "think"}}]}
    assert dialects.pieces("chat", reasoning) == [Piece("reasoning", "think")]
    call = {"choices": [{"delta": {"tool_calls": [{"function": {"name": "Bash", "arguments": '{"c'}}]}}]}
    assert dialects.pieces("chat", call) == [Piece("visible", 'Bash{"c')]
    assert dialects.usage("chat", {"usage": {"prompt_tokens": 3, "completion_tokens": 9}}) == Usage(3, 9)
    assert dialects.error("chat", {"error": {"message": "overloaded"}}) == "overloaded"
    assert dialects.finished("chat", {"choices": [{"delta": {}, "finish_reason": "stop"}]})


def test_anthropic_and_responses_pieces():
    thinking = {"type": "content_block_delta", "delta": {"type": "thinking_delta", "thinking": "t"}}
    tool = {"type": "content_block_delta", "delta": {"type": "input_json_delta", "partial_json": "{}"}}
    assert dialects.pieces("anthropic", thinking) == [Piece("reasoning", "t")]
    assert dialects.pieces("anthropic", tool) == [Piece("visible", "{}")]
    assert dialects.usage("anthropic", {"type": "message_delta", "usage": {"output_tokens": 4}}) == Usage(
        None, 4
    )
    summary = {"type": "response.reasoning_summary_text.delta", "delta": "s"}
    assert dialects.pieces("responses", summary) == [Piece("reasoning", "s")]
    done = {"type": "response.completed", "response": {"usage": {"input_tokens": 2, "output_tokens": 5}}}
    assert dialects.usage("responses", done) == Usage(2, 5) and dialects.finished("responses", done)
    assert dialects.error("responses", {"type": "error", "message": "bad"}) == "bad"


@pytest.mark.parametrize("dialect", dialects.DIALECTS)
def test_agent_traces_restore_the_elided_text(dialect):
    requests = datasets.agent_traces(dialect)
    assert requests
    text = json.dumps([r.body for r in requests])
    assert "<elided:" not in text and "[truncated:" not in text
    # Restored to the captured length, the same filler each time: turns of one client share a prefix.
    assert datasets._restore("<elided: 533 chars of client text>") == datasets._restore(
        "<elided: 533 chars x>"
    )
    assert len(datasets._restore("<elided: 533 chars of client text>")) == 533


def test_claude_code_traces_are_long_multi_turn_prompts():
    claude = [r for r in datasets.agent_traces("anthropic") if r.source.startswith("claude")]
    assert max(len(json.dumps(r.body)) for r in claude) > 40_000  # 10k+ tokens with tools and system prompt
    assert max(len(r.body["messages"]) for r in claude) >= 3


def test_random_and_jsonl_datasets(tmp_path):
    prompts = datasets.random_prompts("responses", 3, input_len=16, output_len=8, seed=1)
    assert len({p.body["input"][0]["content"] for p in prompts}) == 3  # every prompt differs
    assert all(len(p.body["input"][0]["content"].split()) == 16 for p in prompts)
    path = tmp_path / "r.jsonl"
    path.write_text('{"prompt": "hi"}\n{"messages": [{"role": "system", "content": "s"}, '
                    '{"role": "user", "content": "u"}], "max_tokens": 5}\n')  # fmt: skip
    rows = datasets.jsonl_requests("anthropic", path, 9)
    assert rows[0].body["max_tokens"] == 9 and rows[1].body == {
        "model": "", "messages": [{"role": "user", "content": "u"}], "max_tokens": 5, "stream": True, "system": "s"}  # fmt: skip
    path.write_text('{"nothing": 1}\n')
    with pytest.raises(ValueError, match="r.jsonl:1"):
        datasets.jsonl_requests("chat", path, 9)


def test_prepare_body_caps_output_and_asks_for_usage():
    body = dialects.prepare_body("chat", {"messages": [], "max_tokens": 8192}, "m", 64)
    assert body["max_tokens"] == 64 and body["stream"] and body["stream_options"] == {"include_usage": True}
    assert dialects.prepare_body("responses", {"input": []}, "m", 32)["max_output_tokens"] == 32


def test_arrival_gaps_have_the_asked_rate_and_burstiness():
    poisson = arrival_gaps(rate=4.0, burstiness=1.0, count=4000, seed=0)
    assert statistics.fmean(poisson) == pytest.approx(0.25, rel=0.05)
    bursty = arrival_gaps(rate=4.0, burstiness=0.25, count=4000, seed=0)
    assert statistics.fmean(bursty) == pytest.approx(0.25, rel=0.1)
    assert statistics.stdev(bursty) > 1.5 * statistics.stdev(poisson)  # gamma shape k: cv = 1/sqrt(k)
