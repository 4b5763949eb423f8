"""`python -m runners batching`: continuous batching in the engine's scheduler, at several concurrencies.

In process (no HTTP: what is measured is the executor): one engine and one `Scheduler`, as `kimi-engine
serve` builds them. For each concurrency c, c requests are submitted at once — seeded random prompts of
`--prompt-tokens`, greedy, `--gen-tokens` each, no stop tokens — and every token is stamped as its sink
receives it. One untimed round per concurrency first, so every decode step shape it uses (batch bucket x
cache size) is compiled or captured before the timed rounds; the timed rounds then alternate between the
concurrencies, so a drift in the host's speed moves every level alike. Per concurrency, one receipt with:

- `aggregate_tok_s` per round: all requests' generated tokens / (last token - submission);
- `ttft_ms` per request: submission -> first token (queueing, prefill and the first sample);
- `itl_ms` per token gap: the time between a request's consecutive tokens;
- `decoded_per_step`: sequences decoded together per executor step (the batch actually formed);
- derived `speedup_vs_c1`: median aggregate tok/s over that of concurrency 1 in the same run.

The prefix cache is off (repeats must prefill). Method: docs/METHODS.md.
"""

from __future__ import annotations

import statistics
import threading
import time

import click
import torch

from common.click_options import count_option, text_option
from common.memory_cap import MemoryCap
from engine.cli_options import (
    device_option,
    dtype_option,
    memory_cap_option,
    resolve_device,
    resolve_dtype,
    resolve_memory_cap,
    synthetic_option,
)
from engine.kernels.defaults import SHIPPED_DEFAULTS
from engine.model import SamplingParams
from engine.runtime import (
    LOAD_ERRORS,
    Engine,
    Failed,
    Finished,
    Request,
    Scheduler,
    Token,
    TorchThread,
    load_on_own_thread,
)
from engine.runtime.batch import buckets_upto
from engine.runtime.compiled import step_option
from harness.receipt import write_receipt
from runners.options import positive_ints, results_option
from runners.outcome import report
from runners.regenerate import regenerate
from runners.threads import apply_threads, threads_option

TIMEOUT_S = 600  # one round; a hang fails the run instead of holding it forever
UNITS = {
    "aggregate_tok_s": "tok/s",
    "ttft_ms": "ms",
    "itl_ms": "ms",
    "decoded_per_step": "sequences",
    "speedup_vs_c1": "ratio",
}


def _selection_suffix(variants: dict[str, str], device: torch.device) -> str:
    """``.op-variant`` for each kernel chosen away from the shipped default (KIMI_KERNELS), so such a run's
    receipts never stand in for the default's; empty for the defaults."""
    defaults = SHIPPED_DEFAULTS.get(device.type, {})
    return "".join(f".{op}-{name}" for op, name in sorted(variants.items()) if defaults.get(op) != name)


def run_round(scheduler: Scheduler, prompts: list[list[int]], gen_tokens: int) -> dict[str, list[float]]:
    """Submit every prompt at once; stamp each token as it reaches its sink."""
    stamps: list[list[float]] = [[] for _ in prompts]
    ended = [threading.Event() for _ in prompts]
    failures: list[str] = []

    def sink_for(i: int):
        def sink(event) -> None:
            if isinstance(event, Token):
                stamps[i].append(time.perf_counter())
            elif isinstance(event, Failed):
                failures.append(event.message)
                ended[i].set()
            elif isinstance(event, Finished):
                ended[i].set()

        return sink

    first_step = len(scheduler.steps)
    params = SamplingParams(max_tokens=gen_tokens)
    start = time.perf_counter()
    scheduler.submit_together([(Request(prompt, params), sink_for(i)) for i, prompt in enumerate(prompts)])
    for event in ended:
        if not event.wait(TIMEOUT_S):
            raise click.ClickException(f"a round did not finish in {TIMEOUT_S} s")
    if failures:
        raise click.ClickException(f"a request failed: {failures[0]}")
    end = max(s[-1] for s in stamps)
    steps = list(scheduler.steps)[first_step:]
    return {
        "aggregate_tok_s": [sum(len(s) for s in stamps) / (end - start)],
        "ttft_ms": [(s[0] - start) * 1e3 for s in stamps],
        "itl_ms": [(b - a) * 1e3 for s in stamps for a, b in zip(s, s[1:], strict=False)],
        "decoded_per_step": [float(r.decoded) for r in steps if r.decoded],
    }


def measure(engine: Engine, torch_thread: TorchThread, levels: list[int], prompt_tokens: int, gen_tokens: int,
            repeats: int, generator: torch.Generator, memory_cap_gib: float | None,
            ) -> dict[int, tuple[dict[str, list[float]], dict]]:  # fmt: skip
    """Per concurrency: one untimed round, then `repeats` timed ones, each on fresh prompts. The timed
    rounds alternate between the levels (c1, c2, ..., then c1, c2, ... again), so a host whose speed
    drifts during the run moves every level alike and each speedup compares rounds measured side by
    side. -> {c: (samples, the memory report of its round with the highest peak)}."""
    vocab = engine.model.config.vocab_size

    def one_round(c: int) -> tuple[dict[str, list[float]], dict]:
        prompts = torch.randint(0, vocab, (c, prompt_tokens), generator=generator).tolist()
        scheduler = Scheduler(engine, max_active=c, max_queue=c, torch_thread=torch_thread)
        scheduler.start()
        try:
            with MemoryCap(memory_cap_gib, device=str(engine.device), poll_s=0.1) as mem:
                samples = run_round(scheduler, prompts, gen_tokens)
            return samples, mem.report()
        finally:
            scheduler.stop()

    for c in levels:
        click.echo(f"concurrency {c}: untimed round ...", err=True)
        one_round(c)
    measured: dict[int, tuple[dict[str, list[float]], dict]] = {}
    for r in range(repeats):
        click.echo(f"timed pass {r + 1}/{repeats}: one round at each concurrency ...", err=True)
        for c in levels:
            samples, memory = one_round(c)
            kept, peak = measured.get(c, ({}, memory))
            for key, values in samples.items():
                kept.setdefault(key, []).extend(values)
            measured[c] = (kept, max(peak, memory, key=lambda m: m["peak_rss_gib"]))
    return measured


@click.command("batching")
@synthetic_option("Synthetic model (no download).", default="small")
@device_option()
@dtype_option()
@text_option(
    "--concurrency",
    default="1,2,4,8",
    help="Requests in flight at once, comma-separated; 1 is the baseline of speedup_vs_c1.",
)
@count_option("--prompt-tokens", default=64, help="Tokens per prompt.")
@count_option("--gen-tokens", default=32, minimum=2, help="Tokens generated per request.")
@count_option(
    "--repeats",
    default=4,
    help="Timed rounds per concurrency (after one untimed warm-up round); the levels' rounds alternate.",
)
@memory_cap_option()
@step_option
@threads_option("torch")
@click.option("--seed", default=0, show_default=True, help="Seed of the synthetic weights and the prompts.")
@results_option
@click.option("--no-regenerate", is_flag=True, help="Write receipts only; skip RESULTS.md and figures.")
def batching_command(synthetic, device, dtype, concurrency, prompt_tokens, gen_tokens, repeats, memory_cap_gib,
                     step, threads, seed, results, no_regenerate) -> None:  # fmt: skip
    """Aggregate output tok/s and per-request TTFT / ITL of the engine's scheduler at each concurrency,
    with the speedup over one request at a time, as receipts."""
    levels = positive_ints(concurrency)
    threads = apply_threads(threads)
    device = resolve_device(device)
    dtype, torch_dtype = resolve_dtype(dtype, device)
    memory_cap_gib = resolve_memory_cap(memory_cap_gib, device)
    label = f"synthetic-{synthetic}"
    click.echo(f"loading {label} ({dtype}) on {device} ...", err=True)
    try:
        torch_thread, engine = load_on_own_thread(  # as `kimi-engine serve` loads
            synthetic=synthetic,
            seed=seed,
            device=device,
            dtype=torch_dtype,
            memory_cap_gib=memory_cap_gib,
            max_context=4 * (prompt_tokens + gen_tokens),
            step=step,
            prefix_cache_gib=0,
        )
    except LOAD_ERRORS as e:
        raise click.ClickException(str(e)) from None
    generator = torch.Generator().manual_seed(seed)
    try:
        for rows in buckets_upto(max(levels)):
            compile_s = torch_thread.call(engine.warm_up, prompt_tokens + gen_tokens, batch=rows)
            if compile_s is not None:
                click.echo(f"compiled the decode step for {rows} rows in {compile_s:.1f} s", err=True)
        measured = measure(
            engine, torch_thread, levels, prompt_tokens, gen_tokens, repeats, generator, memory_cap_gib
        )
        config = {
            "model": label,
            "weights": "synthetic weights",
            "dtype": dtype,
            "device": str(engine.device),
            "prompt_tokens": prompt_tokens,
            "gen_tokens": gen_tokens,
            "repeats": repeats,
            "seed": seed,
            "threads": threads,
            "decode_step": engine.step,
            "kernel_variants": engine.kernel_variants,
            "prefill_budget": engine.plan.prefill_chunk,
            "compile_s": {f"{rows}x{tokens}": s for (tokens, rows), s in engine.pool.compile_s.items()},
            "scheduler": "engine.runtime.Scheduler, continuous batching (one decode step for all)",
        }
    finally:
        engine.close()
        torch_thread.close()
    baseline = statistics.median(measured[1][0]["aggregate_tok_s"]) if 1 in measured else None
    written = []
    for c, (samples, memory) in measured.items():
        derived = {}
        if baseline is not None:
            derived["speedup_vs_c1"] = statistics.median(samples["aggregate_tok_s"]) / baseline
        written.append(
            write_receipt(
                "batching",
                f"{label}.{dtype}.{engine.step}{_selection_suffix(config['kernel_variants'], engine.device)}.c{c}",
                config={**config, "concurrency": c},
                samples=samples,
                units={k: UNITS[k] for k in [*samples, *derived]},
                derived=derived,
                notes="synthetic weights (speed does not depend on weight values)",
                memory=memory,
                results_dir=results,
            )
        )
    report(written)
    if not no_regenerate:
        regenerate(results)
