"""A small real measurement that exercises the whole evidence path without a model or a GPU.

It times encoding one representative streamed event (an Anthropic `content_block_delta`, the proxy's
commonest write) with orjson and with the standard library, as the proxy would on every event.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import click
import orjson

from harness.receipt import write_receipt

EVENT = {
    "type": "content_block_delta",
    "index": 1,
    "delta": {"type": "input_json_delta", "partial_json": '{"command": "ls -la /tmp", "descr'},
}
ENCODERS = {"orjson": orjson.dumps, "json": lambda obj: json.dumps(obj, separators=(",", ":")).encode()}


def time_encoder(encode, repeats: int, batch: int) -> list[float]:
    """Microseconds per encode, one sample per batch (a batch amortises the timer's own cost)."""
    samples = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        for _ in range(batch):
            encode(EVENT)
        samples.append((time.perf_counter_ns() - start) / batch / 1000)
    return samples


def run_selfcheck(repeats: int = 30, batch: int = 2000, results_dir: Path | None = None) -> list[Path]:
    paths = []
    with click.progressbar(ENCODERS.items(), label="timing event encoders") as encoders:
        for name, encode in encoders:
            encode(EVENT)  # warm-up: first call pays for imports and caches
            paths.append(
                write_receipt(
                    "harness",
                    f"sse-event-encode.{name}",
                    config={"encoder": name, "repeats": repeats, "batch": batch, "event": EVENT},
                    samples={"encode_us": time_encoder(encode, repeats, batch)},
                    units={"encode_us": "µs"},
                    notes="timed with time.perf_counter_ns; one sample = mean over one batch",
                    results_dir=results_dir,
                )
            )
    return paths
