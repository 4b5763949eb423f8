"""Per-request latency metrics of a streamed turn, and a level's summary, throughput and goodput.

Definitions (docs/METHODS.md, "Serving benchmark"), all from the client's clock:
- `ttft_ms`: request sent → first *visible* token (answer text or tool-call arguments).
- `ttft_any_ms`: request sent → first token of any kind, reasoning included.
- `e2e_ms`: request sent → end of the stream.
- `tpot_ms`: (e2e − ttft_any) / (output tokens − 1), as vLLM and SGLang define it.
- `itl_ms`: one value per token after the first chunk. A chunk that carries k tokens arrived g ms after
  the previous chunk; it contributes k values of g / k (its tokens are spread evenly over the gap), so a
  speculative decoder that sends 3 tokens a chunk is not reported as 3× slower per token. The first
  chunk's extra tokens arrived with the first token and are covered by TTFT, not ITL.
Tokens per chunk: with the endpoint's `usage` output count N, N is split over the chunks in proportion to
their characters (largest remainder, at least one token per chunk); without usage, each chunk's text is
counted by the fallback tokenizer, which the receipt names.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from k3.tokens import rough_tokens
from runners.serve.client import StreamedTurn

ITL_METHOD = (
    "a chunk of k tokens arriving g ms after the previous chunk gives k ITL values of g/k; the "
    "first chunk's extra tokens are covered by TTFT"
)
SLO_KEYS = ("ttft_ms", "ttft_any_ms", "tpot_ms", "e2e_ms")


@dataclass(frozen=True)
class TokenCounter:
    """The fallback tokenizer: its name (recorded in the receipt) and text -> token count."""

    name: str
    count: Callable[[str], int]


# Without a tokenizer: k3's plain rule, characters / 4 (rounded down), at least 1 per chunk.
ESTIMATE = TokenCounter("estimate: characters / 4 (k3.tokens.rough_tokens), at least 1 per chunk",
                        lambda text: rough_tokens(len(text)))  # fmt: skip


@dataclass(frozen=True)
class Sample:
    """One request's metrics (times in ms); None where a request has no such value."""

    ok: bool
    error: str | None
    e2e_ms: float
    ttft_ms: float | None = None
    ttft_any_ms: float | None = None
    tpot_ms: float | None = None
    itl_ms: tuple[float, ...] = ()
    output_tokens: int = 0
    input_tokens: int | None = None
    tokens_from_usage: bool = False


def apportion(total: int, weights: list[int]) -> list[int]:
    """`total` whole tokens over chunks in proportion to `weights`, at least one each (largest remainder)."""
    n = len(weights)
    if total <= n:
        return [1] * n
    spare = total - n
    scale = sum(weights)
    shares = [spare * w / scale for w in weights]
    counts = [math.floor(s) for s in shares]
    by_remainder = sorted(range(n), key=lambda i: (counts[i] - shares[i], i))
    for i in by_remainder[: spare - sum(counts)]:
        counts[i] += 1
    return [1 + c for c in counts]


def measure(turn: StreamedTurn, counter: TokenCounter = ESTIMATE) -> Sample:
    """A finished turn's metrics; an errored turn keeps only its error and wall time."""
    e2e_ms = (turn.end - turn.start) * 1e3
    if not turn.ok:
        return Sample(False, turn.error, e2e_ms)
    if not turn.chunks:
        return Sample(False, "the stream carried no tokens", e2e_ms)
    texts = ["".join(p.text for p in pieces) for _, pieces in turn.chunks]
    reported = turn.usage.output_tokens
    if reported:
        per_chunk = apportion(reported, [max(1, len(t)) for t in texts])
    else:
        per_chunk = [max(1, counter.count(t)) for t in texts]
    output_tokens = reported or sum(per_chunk)
    times = [t for t, _ in turn.chunks]
    itl: list[float] = []
    for i in range(1, len(times)):
        gap_ms = (times[i] - times[i - 1]) * 1e3
        itl += [gap_ms / per_chunk[i]] * per_chunk[i]
    visible = next((t for t, pieces in turn.chunks if any(p.kind == "visible" for p in pieces)), None)
    ttft_any_ms = (times[0] - turn.start) * 1e3
    tpot = (e2e_ms - ttft_any_ms) / (output_tokens - 1) if output_tokens > 1 else None
    return Sample(
        ok=True,
        error=None,
        e2e_ms=e2e_ms,
        ttft_ms=(visible - turn.start) * 1e3 if visible is not None else None,
        ttft_any_ms=ttft_any_ms,
        tpot_ms=tpot,
        itl_ms=tuple(itl),
        output_tokens=output_tokens,
        input_tokens=turn.usage.input_tokens,
        tokens_from_usage=bool(reported),
    )


def parse_slo(text: str | None) -> dict[str, float]:
    """`ttft_ms=500,tpot_ms=50` -> {"ttft_ms": 500.0, "tpot_ms": 50.0}; ValueError naming what is wrong."""
    slo: dict[str, float] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in SLO_KEYS:
            raise ValueError(f"expected KEY=MS with KEY one of {', '.join(SLO_KEYS)}, got {part.strip()!r}")
        try:
            slo[key] = float(value)
        except ValueError:
            raise ValueError(f"{key}: expected a number of milliseconds, got {value.strip()!r}") from None
        if slo[key] <= 0:
            raise ValueError(f"{key}: expected a positive number of milliseconds, got {value.strip()!r}")
    return slo


def meets(sample: Sample, slo: dict[str, float]) -> bool:
    """Whether a request succeeded within every bound of the SLO (a missing value fails it)."""
    if not sample.ok:
        return False
    for key, bound in slo.items():
        value = getattr(sample, key)
        if value is None or value > bound:
            return False
    return True


def p99(values: list[float]) -> float:
    """The 99th percentile, interpolated between closest ranks (numpy's default method)."""
    return statistics.quantiles(values, n=100, method="inclusive")[98] if len(values) > 1 else values[0]


LATENCIES = ("ttft_ms", "ttft_any_ms", "tpot_ms", "itl_ms", "e2e_ms")


def level_samples(samples: list[Sample]) -> dict[str, list[float]]:
    """The receipt's raw samples: `ok` per request (1/0), and each metric over the successful ones."""
    good = [s for s in samples if s.ok]
    out: dict[str, list[float]] = {"ok": [1.0 if s.ok else 0.0 for s in samples]}
    for key in ("ttft_ms", "ttft_any_ms", "tpot_ms", "e2e_ms"):
        values = [getattr(s, key) for s in good if getattr(s, key) is not None]
        if values:
            out[key] = values
    itl = [v for s in good for v in s.itl_ms]
    if itl:
        out["itl_ms"] = itl
    if good:
        out["output_tokens"] = [float(s.output_tokens) for s in good]
    inputs = [float(s.input_tokens) for s in good if s.input_tokens is not None]
    if inputs:
        out["input_tokens"] = inputs
    return out


def level_derived(samples: list[Sample], seconds: float, slo: dict[str, float]) -> dict[str, float]:
    """Throughput over the level's wall time, goodput under `slo`, error count and the tail latencies."""
    good = [s for s in samples if s.ok]
    tokens = sum(s.output_tokens for s in good)
    derived = {
        "requests": float(len(samples)),
        "errors": float(len(samples) - len(good)),
        "duration_s": seconds,
        "request_throughput": len(good) / seconds,
        "output_tok_s": tokens / seconds,
        "goodput": sum(meets(s, slo) for s in samples) / seconds,
    }
    raw = level_samples(samples)
    if "tpot_ms" in raw:
        derived["tok_s_per_user"] = 1e3 / statistics.median(raw["tpot_ms"])
    for key in LATENCIES:
        if key in raw:
            derived[f"{key}_p99"] = p99(raw[key])
    return derived
