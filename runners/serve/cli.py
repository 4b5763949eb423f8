"""`python -m runners serve`: a serving benchmark of any endpoint in the OpenAI Chat, Anthropic Messages
or OpenAI Responses dialect, streaming, as receipts (suite `serve`; method in docs/METHODS.md)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import click

from common.click_options import text_option
from runners.options import chosen, positive_ints, results_option
from runners.outcome import report
from runners.regenerate import regenerate
from runners.serve import datasets
from runners.serve.bench import bench_endpoint
from runners.serve.dialects import DIALECTS
from runners.serve.load import Level
from runners.serve.metrics import ESTIMATE, TokenCounter, parse_slo


def positive_floats(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated numbers, got {text!r}") from None
    if not values or min(values) <= 0:
        raise click.BadParameter(f"expected positive numbers, got {text!r}")
    return values


def base_url(endpoint: str) -> str:
    """`http://host:8000`, `http://host:8000/` or `http://host:8000/v1` -> `http://host:8000`."""
    url = urlsplit(endpoint)
    if url.scheme not in ("http", "https") or not url.netloc:
        raise click.BadParameter(f"expected an http(s) URL, got {endpoint!r}", param_hint="--endpoint")
    return endpoint.rstrip("/").removesuffix("/v1")


def levels_of(concurrency: str | None, rate: str | None) -> list[Level]:
    """Every concurrency × every rate; concurrency alone is a closed loop, rate alone is uncapped."""
    counts = positive_ints(concurrency) if concurrency else [None]
    rates = positive_floats(rate) if rate else [None]
    if counts == [None] and rates == [None]:
        counts = [1]
    return [Level(c, r) for r in rates for c in counts]


def token_counter(path: Path | None) -> TokenCounter:
    if path is None:
        return ESTIMATE
    from engine.model.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_dir(path)
    return TokenCounter(f"tokenizer of {path}", lambda text: len(tokenizer.encode(text, allow_special=False)))


# A side-by-side run short enough for a few minutes on 2 cores (six endpoint-dialect pairs, two levels).
SIDE_BY_SIDE_DEFAULTS = {"concurrency": "1,2", "count": 8, "input_len": 64, "output_len": 32, "warmup": 1}


@click.command("serve")
@click.option("--endpoint", help="Base URL of the endpoint (http://host:port or http://host:port/v1).")
@text_option("--dialect", default="chat", help=f"Wire dialect(s) to drive, comma list: {', '.join(DIALECTS)}.")  # fmt: skip
@click.option("--model", help="Model name to send. Default: the first id the endpoint's /v1/models lists.")
@click.option("--label", help="Name of the endpoint in receipt names and figures. Default: host:port.")
@click.option("--api-key", envvar="SERVE_API_KEY", help="Credential to send (also read from SERVE_API_KEY).")
@click.option("--concurrency", help="Closed-loop levels: clients in flight, comma list (e.g. 1,4,16). With "
              "--rate: the cap on requests in flight. Default 1 when neither is given.")  # fmt: skip
@click.option("--rate", help="Open-loop levels: requests per second, comma list (gamma arrivals, see "
              "--burstiness).")  # fmt: skip
@click.option("--burstiness", type=click.FloatRange(0, min_open=True), default=1.0, show_default=True,
              help="Shape of the gamma inter-arrival times with --rate: 1 is Poisson, <1 burstier, >1 steadier.")  # fmt: skip
@click.option("--requests", "count", type=click.IntRange(1), default=32, show_default=True,
              help="Timed requests per level (ignored with --duration).")  # fmt: skip
@click.option("--duration", type=click.FloatRange(0, min_open=True),
              help="Seconds per level instead of a request count: requests start until then, and are read to the end.")  # fmt: skip
@click.option("--warmup", type=click.IntRange(0), default=2, show_default=True,
              help="Untimed requests before each level.")  # fmt: skip
@click.option("--dataset", type=click.Choice(datasets.DATASETS), default="random", show_default=True,
              help="random (fixed lengths), agent (captured coding-agent requests, replayed), jsonl (--dataset-path).")  # fmt: skip
@click.option("--dataset-path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The JSONL file of --dataset jsonl, or another rebuilt capture file for --dataset agent.")  # fmt: skip
@click.option("--input-len", type=click.IntRange(1), default=128, show_default=True,
              help="Words per random prompt (about one BPE token each).")  # fmt: skip
@click.option("--output-len", type=click.IntRange(1), default=128, show_default=True,
              help="Output tokens asked for (max_tokens; also caps agent and JSONL requests).")  # fmt: skip
@click.option(
    "--seed",
    type=int,
    default=0,
    show_default=True,
    help="Seed of random prompts (mixed with the endpoint, dialect and level) and arrivals.",
)
@click.option("--ignore-eos", is_flag=True, help="Ask the server to write all --output-len tokens (vLLM's "
              "ignore_eos; SGLang, llama-server and kimi-engine accept it; proxies may drop it).")  # fmt: skip
@click.option("--slo", help="Goodput bounds, e.g. ttft_ms=500,tpot_ms=50 (keys: ttft_ms, ttft_any_ms, "
              "tpot_ms, e2e_ms): requests/s that succeeded within every bound.")  # fmt: skip
@click.option("--tokenizer", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Checkpoint directory whose tokenizer counts output tokens when the endpoint reports no "
              "usage. Default: an estimate of 4 UTF-8 bytes a token (named in the receipt).")  # fmt: skip
@click.option("--server-hardware", default="", help="What the endpoint runs on (e.g. '8xB300, vLLM 0.19'): a "
              "remote server's GPUs are not this machine's, whose descriptor the receipt records too.")  # fmt: skip
@click.option("--timeout", "timeout_s", type=click.FloatRange(0, min_open=True), default=600.0,
              show_default=True, help="Seconds one request may take before it counts as an error.")  # fmt: skip
@click.option("--side-by-side", is_flag=True, help="Ignore --endpoint: start our engine and llama-server on "
              "the same weights, k3 in front of each, and benchmark each directly and through k3 "
              "(runners/serve/side_by_side.py).")  # fmt: skip
@click.option("--threads", type=click.IntRange(1), help="With --side-by-side: CPU threads of both engines "
              "(default: all cores but one, left to k3 and the load generator).")  # fmt: skip
@click.option("--synthetic", "preset", type=click.Choice(("tiny", "small")), default="small", show_default=True,
              help="With --side-by-side: the synthetic preset both engines serve (seed --seed).")  # fmt: skip
@results_option
@click.option("--no-regenerate", is_flag=True, help="Write receipts only; skip RESULTS.md and figures.")
def serve_command(endpoint, dialect, model, label, api_key, concurrency, rate, burstiness, count, duration,
                  warmup, dataset, dataset_path, input_len, output_len, seed, ignore_eos, slo, tokenizer,
                  server_hardware, timeout_s, side_by_side, threads, preset, results, no_regenerate) -> list[Path]:  # fmt: skip
    """Benchmark a streaming endpoint: TTFT (visible and any token), ITL, TPOT, E2E, throughput and goodput
    per concurrency or request rate, one receipt per (endpoint, dialect, level).

    With --side-by-side, options left at their defaults take the short run's values instead
    (SIDE_BY_SIDE_DEFAULTS: concurrency 1,2; 8 requests; 64 words in, 32 tokens out; one warm-up)."""
    if side_by_side:
        ctx = click.get_current_context()
        short = {k: v for k, v in SIDE_BY_SIDE_DEFAULTS.items()
                 if ctx.get_parameter_source(k) is click.core.ParameterSource.DEFAULT}  # fmt: skip
        concurrency, count = short.get("concurrency", concurrency), short.get("count", count)
        input_len, output_len = short.get("input_len", input_len), short.get("output_len", output_len)
        warmup = short.get("warmup", warmup)
    try:
        slo_bounds = parse_slo(slo)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--slo") from None
    levels = levels_of(concurrency, rate)
    counter = token_counter(tokenizer)
    run = {"dataset": dataset, "dataset_path": str(dataset_path) if dataset_path else None,
           "input_len": input_len, "output_len": output_len, "seed": seed, "requests": count,
           "duration_s": duration, "warmup": warmup, "burstiness": burstiness, "server_hardware": server_hardware,
           "timeout_s": timeout_s, "ignore_eos": ignore_eos}  # fmt: skip
    bench = dict(levels=levels, count=count, duration=duration, warmup=warmup, burstiness=burstiness, seed=seed,
                 counter=counter, slo=slo_bounds)  # fmt: skip
    if side_by_side:
        from runners.serve.side_by_side import side_by_side as run_side_by_side

        written = run_side_by_side(run, bench, threads=threads, results=results, preset=preset, seed=seed)
    else:
        if not endpoint:
            raise click.UsageError("give --endpoint URL (or --side-by-side)")
        base = base_url(endpoint)
        written = []
        for name in chosen(dialect, DIALECTS, "--dialect"):
            written += bench_endpoint(base, name, model, label or urlsplit(base).netloc, api_key, run, bench,
                                      results)  # fmt: skip
    report(written)
    if not no_regenerate:
        regenerate(results)
    return written
