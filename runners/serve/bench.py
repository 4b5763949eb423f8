"""Running the levels of a serving benchmark against one (endpoint, dialect), with progress, and writing
their receipts."""

from __future__ import annotations

import asyncio
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import click

from runners.serve import datasets
from runners.serve.load import Level, LevelResult, Target, run_level
from runners.serve.metrics import meets
from runners.serve.receipts import endpoint_facts, first_model, write_level


def run_levels(target: Target, requests_for: Callable[[Level], list], levels: list[Level], *, count, duration,
               warmup, burstiness, seed, counter, slo) -> list[LevelResult]:  # fmt: skip
    """Every level against one (endpoint, dialect), each with its progress bar and one summary line."""
    results = []
    size = count if duration is None else max(1, int(duration))
    for level in levels:
        label = f"{target.dialect} {level.label}".ljust(24)
        with click.progressbar(length=size, label=label, file=sys.stderr) as bar:
            start = time.perf_counter()

            def done(_sample, bar=bar, start=start) -> None:  # bound now: the bar of this level
                if duration is None:
                    bar.update(1)
                else:
                    bar.update(min(size, int(time.perf_counter() - start)) - bar.pos)

            result = asyncio.run(run_level(target, requests_for(level), level, count=None if duration else count,
                                           duration=duration, warmup=warmup, burstiness=burstiness, seed=seed,
                                           counter=counter, on_done=done))  # fmt: skip
        results.append(result)
        _print_level(result, slo)
    return results


def _print_level(result: LevelResult, slo: dict) -> None:
    good = [s for s in result.samples if s.ok]
    errors = len(result.samples) - len(good)
    if not good:
        first = next((s.error for s in result.samples if s.error), "no requests")
        click.echo(f"  {result.level.label}: every request failed ({errors}): {first}", err=True)
        return
    ttft = sorted(s.ttft_any_ms for s in good if s.ttft_any_ms is not None)
    tokens = sum(s.output_tokens for s in good)
    meeting = sum(meets(s, slo) for s in result.samples)
    click.echo(
        f"  {result.level.label}: {len(good)} ok, {errors} errors, {tokens / max(result.seconds, 1e-9):.1f} "
        f"output tok/s, median TTFT {ttft[len(ttft) // 2]:.1f} ms"
        + (f", {meeting}/{len(result.samples)} within the SLO" if slo else ""),
        err=True,
    )


def bench_endpoint(base: str, dialect: str, model: str | None, label: str, api_key: str | None, run: dict,
                   bench: dict, results: Path, notes: str = "") -> list[Path]:  # fmt: skip
    """Every level against one (endpoint, dialect); -> the receipts written."""
    probe = Target(base, dialect, model or "", api_key)
    facts = endpoint_facts(probe)
    model = model or first_model(facts)
    if not model:
        raise click.ClickException(f"{base}/v1/models named no model ({facts}); give --model")
    target = Target(base, dialect, model, api_key, run["output_len"], run["timeout_s"], run["ignore_eos"])
    count = run["requests"] if run["duration_s"] is None else 4096
    path = Path(run["dataset_path"]) if run["dataset_path"] else None

    def requests_for(level: Level) -> list:
        # Random prompts are new for every (endpoint, dialect, level): no run is served from the prefix
        # cache an earlier one filled. Agent traces repeat, as an agent's turns do.
        seed = zlib.crc32(f"{run['seed']}/{label}/{dialect}/{level.label}".encode())
        try:
            return datasets.load(run["dataset"], dialect, count=count + run["warmup"], input_len=run["input_len"],
                                 output_len=run["output_len"], seed=seed, path=path)  # fmt: skip
        except (ValueError, OSError) as exc:
            raise click.ClickException(str(exc)) from None

    click.echo(f"{label} ({dialect}, model {model}), {run['dataset']} requests", err=True)
    out = []
    for result in run_levels(target, requests_for, **bench):
        out.append(write_level(result, target, label=label, config=run, facts=facts, counter=bench["counter"],
                               slo=bench["slo"], results=results, notes=notes))  # fmt: skip
    return out
