"""Receipts of the serving benchmark (suite `serve`): one per (endpoint, dialect, level), with every
request's raw samples, the endpoint's own description of itself, and how the numbers were counted."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import httpx

from harness.receipt import write_receipt
from runners.serve.client import server_headers
from runners.serve.dialects import headers as dialect_headers
from runners.serve.load import LevelResult, Target
from runners.serve.metrics import ITL_METHOD, TokenCounter, level_derived, level_samples

SUITE = "serve"
UNITS = {"ok": "ok", "ttft_ms": "ms", "ttft_any_ms": "ms", "tpot_ms": "ms", "itl_ms": "ms", "e2e_ms": "ms",
         "output_tokens": "tokens", "input_tokens": "tokens", "requests": "requests", "errors": "requests",
         "duration_s": "s", "request_throughput": "req/s", "output_tok_s": "tok/s", "goodput": "req/s",
         "tok_s_per_user": "tok/s", "ttft_ms_p99": "ms", "ttft_any_ms_p99": "ms", "tpot_ms_p99": "ms",
         "itl_ms_p99": "ms", "e2e_ms_p99": "ms"}  # fmt: skip


def endpoint_facts(target: Target) -> dict:
    """The endpoint's /v1/models answer and the headers it came with (what the server says it is)."""
    url = target.base + "/v1/models"
    try:
        response = httpx.get(url, headers=dialect_headers(target.dialect, target.api_key), timeout=10)
    except httpx.HTTPError as exc:
        return {"models_url": url, "models": None, "models_error": f"{type(exc).__name__}: {exc}"}
    try:
        answer = response.json()
    except ValueError:
        answer = {"text": response.text[:500]}
    return {"models_url": url, "models_status": response.status_code, "models": answer,
            "models_headers": server_headers(response)}  # fmt: skip


def first_model(facts: dict) -> str | None:
    """The first model id an OpenAI-style /v1/models answer lists."""
    data = (facts.get("models") or {}).get("data") if isinstance(facts.get("models"), dict) else None
    return data[0].get("id") if isinstance(data, list) and data and isinstance(data[0], dict) else None


def tokens_source(result: LevelResult, counter: TokenCounter) -> str:
    good = [s for s in result.samples if s.ok]
    counted = sum(s.tokens_from_usage for s in good)
    return (f"the endpoint's usage for {counted} of {len(good)} successful requests; the others counted "
            f"by the fallback tokenizer ({counter.name})")  # fmt: skip


def write_level(result: LevelResult, target: Target, *, label: str, config: dict, facts: dict,
                counter: TokenCounter, slo: dict, results: Path, notes: str = "") -> Path:  # fmt: skip
    """The receipt of one level; `config` is the run's own (dataset, limits, server hardware)."""
    raw = level_samples(result.samples)
    errors = Counter(s.error for s in result.samples if not s.ok)
    level = result.level
    derived = level_derived(result.samples, max(result.seconds, 1e-9), slo)
    return write_receipt(
        SUITE,
        f"{label}.{target.dialect}.{level.label}",
        config=config
        | {
            "endpoint": target.base,
            "label": label,
            "dialect": target.dialect,
            "model": target.model,
            "concurrency": level.concurrency,
            "rate": level.rate,
            "slo": slo,
            "max_tokens": target.max_tokens,
            "output_tokens_source": tokens_source(result, counter),
            "itl_method": ITL_METHOD,
            "error_messages": dict(errors.most_common(10)),
            "server_headers": result.headers,
            **facts,
        },
        samples=raw,
        units={k: UNITS[k] for k in [*raw, *derived]},
        derived=derived,
        notes=notes,
        results_dir=results,
    )
