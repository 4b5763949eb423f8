"""`python -m runners proxy-peers`: k3 against another proxy on the same machine, side by side.

The scripted engine (runners.engine_process), `k3 serve` and the peer each run as their own process
on loopback TCP. Every iteration posts the same turn straight to the engine and through each proxy,
in an order that rotates every iteration; added = through a proxy − direct, per iteration. A proxy
that cannot translate a dialect to OpenAI Chat is recorded in the receipt as unsupported, with the
answer it gave, instead of being timed.

The peer is LiteLLM's proxy (`litellm[proxy]`, pinned by `nox -s bench-proxy-peers`), configured
with one catch-all model routed to the engine as a hosted vLLM (OpenAI Chat) server and a master
key; nothing else is switched on or off. Method: docs/METHODS.md.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import statistics
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import click
import httpx
import orjson

from common.click_options import count_option
from common.listen import free_port
from harness.receipt import write_receipt
from k3.bench import DIALECTS, ROUTES, client_request
from runners.options import results_option
from runners.outcome import report
from runners.processes import server_process
from runners.proxy import engine_and_k3, timed_paths
from runners.regenerate import regenerate

PEER_KEY = "sk-local-kimi-bench-0123456789"  # the peer's master key; k3 runs without one
LITELLM_CONFIG = """\
model_list:
  - model_name: "*"
    litellm_params:
      model: hosted_vllm/kimi-linear
      api_base: {engine_base}
      api_key: none
general_settings:
  master_key: {key}
"""


def litellm_version() -> str:
    try:
        return importlib.metadata.version("litellm")
    except importlib.metadata.PackageNotFoundError:
        raise click.ClickException(
            "LiteLLM is not installed in this environment; run `nox -s bench-proxy-peers`, which installs "
            "the pinned `litellm[proxy]` beside local-kimi"
        ) from None


@contextmanager
def litellm_server(engine_base: str, scratch: Path):
    """LiteLLM's proxy in front of the engine; yields (its base URL, its config text)."""
    config = LITELLM_CONFIG.format(engine_base=engine_base, key=PEER_KEY)
    path = scratch / "litellm.yaml"
    path.write_text(config)
    cmd = [sys.executable, "-m", "litellm.proxy.proxy_cli", "--config", str(path), "--host", "127.0.0.1",
           "--port", str(free_port())]  # fmt: skip
    # The bundled model-price map, not a download this machine cannot make (it only slows startup).
    env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    with server_process(cmd, "Uvicorn running on", startup_s=180, extra_env=env) as (base, _):
        yield base, config


async def _supported(client: httpx.AsyncClient, base: str, dialect: str, stream: bool) -> str | None:
    """None when the proxy answers this turn with 200; else what it answered."""
    response = await client.post(
        f"{base}{ROUTES[dialect]}", content=orjson.dumps(client_request(dialect, stream))
    )
    if response.status_code == 200:
        return None
    return f"HTTP {response.status_code}: {response.text[:300]}"


async def rotated(
    engine_base: str,
    proxies: dict[str, str],
    dialect: str,
    stream: bool,
    iterations: int,
    warmup: int,
    headers: dict[str, str] | None = None,
) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Samples of one (dialect, stream) case: direct_ms, and per proxy `<name>_ms` and
    `<name>_added_ms`; plus {proxy: its answer} for the proxies that do not support the case."""
    unsupported = {}
    async with httpx.AsyncClient(timeout=60, headers=headers) as client:
        for name, base in proxies.items():
            answer = await _supported(client, base, dialect, stream)
            if answer is not None:
                unsupported[name] = answer
    timed = {name: base for name, base in proxies.items() if name not in unsupported}
    samples = await timed_paths(
        engine_base, timed, client_request(dialect, stream), ROUTES[dialect], iterations, warmup, headers
    )
    return {k: v for k, v in samples.items() if not k.endswith("_events")}, unsupported


def _derived(samples: dict[str, list[float]], proxies: list[str]) -> tuple[dict[str, float], dict[str, str]]:
    """Median added latency per timed proxy, LiteLLM over k3 when both were timed; and the units."""
    derived = {
        f"{name}_added_median_us": statistics.median(samples[f"{name}_added_ms"]) * 1e3 for name in proxies
    }
    if "litellm" in proxies:
        derived["litellm_over_k3"] = derived["litellm_added_median_us"] / derived["k3_added_median_us"]
    units = {k: "ms" for k in samples} | {k: "×" if k.endswith("_over_k3") else "µs" for k in derived}
    return derived, units


@contextmanager
def _servers(scratch: Path):
    """The engine, k3 and LiteLLM, each its own process; yields (engine base, {proxy: base}, LiteLLM config)."""
    with engine_and_k3() as (engine, k3, _):
        click.echo("starting LiteLLM (its startup takes a while) ...", err=True)
        with litellm_server(engine, scratch) as (litellm, config):
            yield engine, {"k3": k3, "litellm": litellm}, config


@click.command("proxy-peers")
@click.option("--iterations", type=click.IntRange(2), default=200, show_default=True,
              help="Timed requests per path and case.")  # fmt: skip
@count_option("--warmup", default=20, minimum=0, help="Untimed requests per case before the timed ones.")
@results_option
@click.option("--no-regenerate", is_flag=True, help="Write receipts only; skip RESULTS.md and figures.")
def proxy_peers_command(iterations, warmup, results, no_regenerate) -> None:
    """k3 and LiteLLM's proxy in front of the same engine over loopback: latency each adds per turn."""
    version = litellm_version()
    auth = {"authorization": f"Bearer {PEER_KEY}", "x-api-key": PEER_KEY}
    cases = [(d, s) for d in DIALECTS for s in (False, True)]
    written = []
    with (
        tempfile.TemporaryDirectory() as scratch,
        _servers(Path(scratch)) as (engine, proxies, litellm_config),
    ):
        with click.progressbar(cases, label="k3 and LiteLLM over loopback") as bar:
            for dialect, stream in bar:
                samples, unsupported = asyncio.run(
                    rotated(engine, proxies, dialect, stream, iterations, warmup, auth)
                )
                derived, units = _derived(samples, [p for p in proxies if p not in unsupported])
                config = {"iterations": iterations, "warmup": warmup, "mode": "peers", "dialect": dialect,
                          "stream": stream, "unsupported": unsupported,
                          "peers": {"litellm": {"version": version, "config": litellm_config}}}  # fmt: skip
                written.append(write_receipt(
                    "proxy", f"peers.{dialect}.{'stream' if stream else 'json'}", config=config,
                    samples=samples, units=units, derived=derived, results_dir=results,
                    notes="k3 serve, LiteLLM's proxy and the scripted engine as separate processes on "
                          "loopback TCP; added = through the proxy − direct, per rotated iteration",
                ))  # fmt: skip
    report(written)
    if not no_regenerate:
        regenerate(results)
