"""`python -m runners proxy`: the latency k3 adds, per request and per streamed event, and its footprint.

Three measurements, each interleaved against the same scripted engine in the same run (method in
docs/METHODS.md):
- `asgi`: `k3.bench.measure` — in-process ASGI, no sockets: the cost of k3's own code per request.
- `sockets`: k3 as a real `k3 serve` subprocess over loopback TCP, the engine on its own port; the same
  request direct and through k3, per dialect, JSON and streaming; plus the cost per streamed event
  (a long stream against a one-event stream) and the proxy's resident memory.
- `concurrency`: N simultaneous streams through k3 over sockets: events per second.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import click
import httpx
import orjson

from harness.receipt import RESULTS_DIR, write_receipt
from k3.app import create_app
from k3.bench import DIALECTS, ROUTES, client_request
from k3.bench import measure as measure_asgi
from k3.config import Config
from k3.testing.fake_upstream import FakeUpstream
from runners.processes import server_process
from runners.regenerate import regenerate

LONG_PROMPT = "a" * 1600  # echoed back 8 characters a chunk: about 200 events


@contextmanager
def engine_and_k3():
    """The scripted engine and `k3 serve` in front of it, each its own process on loopback;
    yields (engine base URL, k3 base URL, k3's psutil.Process)."""
    with server_process([sys.executable, "-m", "runners.engine_process"], "engine listening on") as (
        engine,
        _,
    ):
        k3_cmd = [sys.executable, "-m", "k3", "serve", "--upstream", engine, "--port", "0",
                  "--log-level", "warning"]  # fmt: skip
        with server_process(k3_cmd, "k3 listening on") as (k3, k3_proc):
            yield engine, k3, k3_proc


def _sockets_and_concurrency(
    wanted, k3_base, engine_base, k3_proc, iterations, warmup, streams, receipt
) -> None:
    if "sockets" in wanted:
        cases = [(d, s) for d in DIALECTS for s in (False, True)]
        with click.progressbar(cases, label="loopback sockets") as bar:
            for dialect, stream in bar:
                samples = asyncio.run(
                    _paired(k3_base, engine_base, dialect, stream, None, iterations, warmup)
                )
                derived = {"added_median_us": statistics.median(samples["added_ms"]) * 1e3}
                if stream:
                    # Per event: the extra added time of a long stream over a short one, per extra event.
                    long = asyncio.run(
                        _paired(k3_base, engine_base, dialect, True, LONG_PROMPT, iterations // 3, warmup)
                    )
                    extra_events = statistics.median(long["events"]) - statistics.median(samples["events"])
                    extra_ms = statistics.median(long["added_ms"]) - statistics.median(samples["added_ms"])
                    derived["added_us_per_event"] = extra_ms * 1e3 / extra_events
                samples.pop("events")
                receipt(
                    f"sockets.{dialect}.{'stream' if stream else 'json'}", samples, derived,
                    {"mode": "sockets", "dialect": dialect, "stream": stream, "long_prompt_chars": len(LONG_PROMPT)},
                    "k3 serve and the scripted engine as separate processes on loopback TCP; per-event cost "
                    "from a long stream against a short one",
                )  # fmt: skip
    if "concurrency" in wanted:
        click.echo(f"{streams} concurrent streams ...", err=True)
        rates = asyncio.run(_concurrent(k3_base, streams, rounds=max(3, iterations // 50)))
        rss = k3_proc.memory_info().rss / (1 << 20)
        receipt(
            f"concurrency.anthropic.stream.x{streams}", {"events_per_s": rates, "rss_mib": [rss]}, {},
            {"mode": "concurrency", "streams": streams, "long_prompt_chars": len(LONG_PROMPT)},
            "events/s through k3 with simultaneous streams; RSS of the k3 process after the run",
        )  # fmt: skip


async def timed_post(client: httpx.AsyncClient, url: str, body: bytes) -> tuple[float, int]:
    """Seconds for one request, whole body read; and how many SSE events came back."""
    start = time.perf_counter()
    response = await client.post(url, content=body, headers={"content-type": "application/json"})
    data = await response.aread()
    elapsed = time.perf_counter() - start
    if response.status_code != 200:
        raise click.ClickException(f"POST {url} answered {response.status_code}: {data[:200]!r}")
    return elapsed, data.count(b"\n\n")


def _request(dialect: str, stream: bool, prompt: str | None = None) -> dict:
    """The benchmark turn; a long prompt makes a long stream (the engine echoes it, 8 characters a chunk)."""
    body = client_request(dialect, stream)
    if prompt is not None:
        if dialect == "responses":
            body["input"] = prompt
        else:
            body["messages"][0]["content"] = prompt
    return body


async def engine_payload(body: dict, route: str) -> dict:
    """Exactly what k3 sends upstream for this turn, captured once from an in-process k3 and engine."""
    engine = FakeUpstream()
    app = create_app(Config(upstream="http://engine/v1"), upstream_transport=httpx.ASGITransport(engine))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://k3") as client:
        response = await client.post(route, content=orjson.dumps(body))
    await app.state.k3.upstream.aclose()
    if response.status_code != 200 or not engine.requests:
        raise click.ClickException(f"k3 did not translate the benchmark turn: {response.text[:200]}")
    return engine.requests[-1]


async def timed_paths(engine_base: str, proxies: dict[str, str], body: dict, route: str, iterations: int,
                      warmup: int, headers: dict[str, str] | None = None) -> dict[str, list[float]]:  # fmt: skip
    """Timings of one turn over loopback: straight to the engine and through each proxy (name ->
    base URL), in an order that rotates every iteration so drift hits every path alike. -> `direct_ms`
    and per proxy `<name>_ms`, `<name>_added_ms` (minus direct, same iteration), `<name>_events`."""
    client_body = orjson.dumps(body)
    engine_body = orjson.dumps(await engine_payload(body, route))
    paths = [("direct", f"{engine_base}/chat/completions", engine_body)]
    paths += [(name, f"{base}{route}", client_body) for name, base in proxies.items()]
    samples: dict[str, list[float]] = {f"{name}_ms": [] for name, _, _ in paths}
    samples |= {f"{name}_events": [] for name in proxies}
    async with httpx.AsyncClient(timeout=60, headers=headers) as client:
        for i in range(warmup + iterations):
            k = i % len(paths)
            timings = {name: await timed_post(client, url, data) for name, url, data in paths[k:] + paths[:k]}
            if i >= warmup:
                for name, (seconds, events) in timings.items():
                    samples[f"{name}_ms"].append(seconds * 1e3)
                    if name in proxies:
                        samples[f"{name}_events"].append(events)
    direct = samples["direct_ms"]
    for name in proxies:
        samples[f"{name}_added_ms"] = [p - d for p, d in zip(samples[f"{name}_ms"], direct, strict=True)]
    return samples


async def _paired(k3_base: str, engine_base: str, dialect: str, stream: bool, prompt: str | None,
                  iterations: int, warmup: int) -> dict[str, list[float]]:  # fmt: skip
    """Interleaved direct/proxied timings of one (dialect, stream, prompt) case through k3."""
    s = await timed_paths(engine_base, {"proxied": k3_base}, _request(dialect, stream, prompt), ROUTES[dialect],
                          iterations, warmup)  # fmt: skip
    return {"direct_ms": s["direct_ms"], "proxied_ms": s["proxied_ms"], "added_ms": s["proxied_added_ms"],
            "events": s["proxied_events"]}  # fmt: skip


async def _concurrent(k3_base: str, streams: int, rounds: int) -> list[float]:
    """Events per second with `streams` simultaneous long streams through k3, one sample per round."""
    body = orjson.dumps(_request("anthropic", True, LONG_PROMPT))
    rates = []
    limits = httpx.Limits(max_connections=streams)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        for _ in range(rounds + 1):
            start = time.perf_counter()
            results = await asyncio.gather(
                *[timed_post(client, f"{k3_base}/v1/messages", body) for _ in range(streams)]
            )
            elapsed = time.perf_counter() - start
            rates.append(sum(events for _, events in results) / elapsed)
    return rates[1:]  # the first round warms connections up


UNITS = {"direct_ms": "ms", "proxied_ms": "ms", "added_ms": "ms", "floor_ms": "ms", "hop_added_ms": "ms",
         "own_ms": "ms", "hop_added_median_us": "µs", "own_median_us": "µs", "events": "events", "rss_mib": "MiB",
         "events_per_s": "events/s", "added_us_per_event": "µs", "added_median_us": "µs"}  # fmt: skip


@click.command("proxy")
@click.option(
    "--iterations",
    type=click.IntRange(2),
    default=300,
    show_default=True,
    help="Timed requests per path and case.",
)
@click.option("--warmup", type=click.IntRange(0), default=30, show_default=True)
@click.option(
    "--streams",
    type=click.IntRange(1),
    default=8,
    show_default=True,
    help="Simultaneous streams for the concurrency measurement.",
)
@click.option("--modes", default="asgi,sockets,concurrency", show_default=True)
@click.option("--results", type=click.Path(path_type=Path), default=RESULTS_DIR, show_default=True)
@click.option("--no-regenerate", is_flag=True, help="Write receipts only; skip RESULTS.md and figures.")
def proxy_command(iterations, warmup, streams, modes, results, no_regenerate) -> None:  # fmt: skip
    """Latency k3 adds per request and per event, for each dialect, JSON and streaming, as receipts."""
    wanted = {m.strip() for m in modes.split(",") if m.strip()}
    unknown = wanted - {"asgi", "sockets", "concurrency"}
    if unknown:
        raise click.BadParameter(f"unknown mode(s): {', '.join(sorted(unknown))}", param_hint="--modes")
    config = {"iterations": iterations, "warmup": warmup}
    written = []

    def receipt(name: str, samples: dict, derived: dict, extra: dict, notes: str) -> None:
        written.append(write_receipt(
            "proxy", name, config=config | extra, samples=samples,
            units={k: UNITS[k] for k in [*samples, *derived]}, derived=derived, notes=notes, results_dir=results,
        ))  # fmt: skip

    if "asgi" in wanted:
        click.echo("in-process ASGI ...", err=True)
        for s in measure_asgi(iterations=iterations, warmup=warmup):
            added = [(p - d) * 1e3 for p, d in zip(s.proxied_s, s.direct_s, strict=True)]
            hop = [(f - d) * 1e3 for f, d in zip(s.floor_s, s.direct_s, strict=True)]
            own = [(p - f) * 1e3 for p, f in zip(s.proxied_s, s.floor_s, strict=True)]
            receipt(
                f"asgi.{s.dialect}.{'stream' if s.stream else 'json'}",
                {"direct_ms": [d * 1e3 for d in s.direct_s], "proxied_ms": [p * 1e3 for p in s.proxied_s],
                 "floor_ms": [f * 1e3 for f in s.floor_s], "added_ms": added, "hop_added_ms": hop,
                 "own_ms": own},
                {"added_median_us": statistics.median(added) * 1e3,
                 "hop_added_median_us": statistics.median(hop) * 1e3,
                 "own_median_us": statistics.median(own) * 1e3},
                {"mode": "asgi", "dialect": s.dialect, "stream": s.stream},
                "in-process ASGI transports, no sockets; added = proxied − direct, hop_added = null proxy − "
                "direct (the extra in-process httpx hop alone), own = proxied − null proxy, per interleaved "
                "triple",
            )  # fmt: skip
    if wanted & {"sockets", "concurrency"}:
        with engine_and_k3() as (engine_base, k3_base, k3_proc):
            _sockets_and_concurrency(
                wanted, k3_base, engine_base, k3_proc, iterations, warmup, streams, receipt
            )
    for path in written:
        click.echo(f"wrote {path}")
    if not no_regenerate:
        regenerate(results)


GATED = ("asgi.anthropic.json", "asgi.anthropic.stream", "asgi.responses.stream", "sockets.anthropic.json")


@click.command("proxy-gate")
@click.option(
    "--max-regression",
    type=float,
    default=75.0,
    show_default=True,
    help="Allowed growth of the in-process (asgi) median added latency, in percent (docs/METHODS.md).",
)
@click.option(
    "--max-regression-sockets",
    type=float,
    default=300.0,
    show_default=True,
    help="Allowed growth of the loopback-socket median added latency, in percent: scheduling noise on a "
    "loaded 2-core machine moves it far more than the in-process figure.",
)
@click.option("--iterations", type=click.IntRange(2), default=300, show_default=True)
@click.option(
    "--results",
    type=click.Path(path_type=Path),
    default=RESULTS_DIR,
    show_default=True,
    help="Where the committed baseline receipts are.",
)
def proxy_gate_command(max_regression, max_regression_sockets, iterations, results) -> None:  # fmt: skip
    """CI gate: measure k3's added latency briefly and fail if it regressed against the committed receipts."""
    from harness.hardware import describe
    from harness.receipt import load_receipt
    from harness.report import find_receipt
    from harness.stats import verdict

    hardware_id = describe()["hardware_id"]
    baselines = {}
    for name in GATED:
        try:
            baselines[name] = load_receipt(find_receipt(f"latest:proxy/{hardware_id}/{name}", results))
        except FileNotFoundError:
            pass
    if not baselines:
        click.echo(f"proxy gate: no committed proxy receipts for {hardware_id}; nothing to compare against")
        return
    with tempfile.TemporaryDirectory() as scratch:
        ctx = click.get_current_context()
        ctx.invoke(proxy_command, iterations=iterations, warmup=30, streams=2, modes="asgi,sockets",
                   results=Path(scratch), no_regenerate=True)  # fmt: skip
        fresh = {r["name"]: r for r in map(load_receipt, Path(scratch).glob("proxy/*/*.json"))}
    failed = []
    for name, base in baselines.items():
        old, new = base["derived"]["added_median_us"], fresh[name]["derived"]["added_median_us"]
        allowed = max_regression_sockets if name.startswith("sockets.") else max_regression
        # Beyond the allowance AND a real change: the bootstrap CI of the per-turn added latencies' ratio of
        # medians lies wholly above 1 (a noisy run whose interval straddles 1 does not fail the gate).
        result = verdict(
            old, new, allowed, False, base["samples"]["added_ms"], fresh[name]["samples"]["added_ms"]
        )
        click.echo(f"{name}: added median (µs) {result}")
        if result.regressed:
            failed.append(name)
    if failed:
        raise click.ClickException(f"proxy overhead regressed beyond its allowance: {', '.join(failed)}")
