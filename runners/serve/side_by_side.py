"""`python -m runners serve --side-by-side`: our engine and llama.cpp's llama-server on the same weights,
on this machine, each benchmarked directly (Chat) and through k3 (Anthropic and Responses), in one run.

Weights: `kimi-engine serve --synthetic PRESET --seed SEED` generates each tensor from (seed, name), the
same generator `runners.llamacpp.prepare_models` writes the checkpoint with that is exported to the F16
GGUF llama-server loads (so the two differ only by F16 rounding and each engine's own compute dtype).
Both get the same CPU threads (`OMP_NUM_THREADS` for torch, `-t` for llama.cpp; default all cores but one,
which k3 and the load generator need: llama.cpp's worker threads spin at their barriers, and with every core
given to them a descheduled one stalls the rest, down to a few tokens a second) and the same number of
sequences in flight (`--max-sequences` / `-np`: the largest concurrency of the run). k3 runs in front of
each as its own `k3 serve` process. The engines run one after the other, never at once.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path

import click

from harness.hardware import describe
from runners.llamacpp import prepare_models
from runners.llamacpp_server import running_server
from runners.llamacpp_tools import ensure_tools
from runners.processes import server_process
from runners.serve.bench import bench_endpoint
from runners.serve.load import Target
from runners.serve.receipts import endpoint_facts, first_model
from runners.threads import all_cores

K3_DIALECTS = ("anthropic", "responses")
ENGINE_STARTUP_S = 900  # a cold start compiles the decode step (minutes on 2 busy cores)


@contextmanager
def k3_in_front(upstream: str, model: str):
    """`k3 serve` on an ephemeral loopback port in front of `upstream`; yields its base URL."""
    cmd = [sys.executable, "-m", "k3", "serve", "--upstream", f"{upstream}/v1", "--model", model,
           "--port", "0", "--log-level", "warning"]  # fmt: skip
    with server_process(cmd, "k3 listening on") as (url, _):
        yield url


def _direct_and_through_k3(label: str, base: str, run: dict, bench: dict, results: Path) -> list[Path]:
    facts = endpoint_facts(Target(base, "chat", ""))
    model = first_model(facts)
    if not model:
        raise click.ClickException(f"{label} at {base} named no model in /v1/models: {facts}")
    notes = f"side by side on this machine: {label} directly (Chat) and through k3 (Anthropic, Responses)"
    written = bench_endpoint(base, "chat", model, label, None, run, bench, results, notes)
    with k3_in_front(base, model) as k3:
        for dialect in K3_DIALECTS:
            written += bench_endpoint(k3, dialect, model, f"{label}+k3", None, run, bench, results, notes)
    return written


def side_by_side(run: dict, bench: dict, *, threads: int | None, results: Path, preset: str,
                 seed: int = 0) -> list[Path]:  # fmt: skip
    """Both engines, each directly and through k3; -> every receipt written."""
    threads = threads or max(1, all_cores() - 1)
    slots = max(level.concurrency or 1 for level in bench["levels"])
    models = prepare_models(preset, seed)
    tools = ensure_tools()
    here = describe()["hardware_id"]
    run = run | {
        "server_hardware": run["server_hardware"] or f"this machine ({here}), {threads} threads",
        "side_by_side": {"preset": preset, "seed": seed, "threads": threads, "slots": slots,
                         "gguf": models.gguf["f16"].name, "llama_cpp": tools.version()},
    }  # fmt: skip
    # Per slot: the prompt (a byte-level tokenizer spends about six tokens on a word and its space), the
    # chat template and the output.
    context = 8 * run["input_len"] + run["output_len"] + 256
    engine_cmd = [sys.executable, "-m", "engine", "serve", "--synthetic", preset, "--seed", str(seed),
                  "--port", "0", "--max-sequences", str(slots), "--max-context", str(context),
                  "--log-level", "warning"]  # fmt: skip
    written = []
    click.echo(f"starting kimi-engine serve --synthetic {preset} ({threads} threads) ...", err=True)
    env = {"OMP_NUM_THREADS": str(threads)}
    with server_process(
        engine_cmd, "kimi-engine listening on", startup_s=ENGINE_STARTUP_S, extra_env=env
    ) as (
        url,
        _,
    ):
        written += _direct_and_through_k3("kimi-engine", url, run, bench, results)
    click.echo(f"starting llama-server on {models.gguf['f16'].name} ({threads} threads) ...", err=True)
    with running_server(tools.server, models.gguf["f16"], threads=threads, context=context * slots,
                        gpu_layers=0, parallel=slots) as url:  # fmt: skip
        written += _direct_and_through_k3("llama-server", url, run, bench, results)
    return written
