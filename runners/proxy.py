"""`python -m runners proxy`: the latency k3 adds, per request and per streamed event, and its footprint.

Three measurements, each interleaved against the same scripted engine in the same run (method in
docs/METHODS.md):
- `asgi`: `k3.bench.measure` — in-process ASGI, no sockets: the cost of k3's own code per request.
- `sockets`: k3 as a real `k3 serve` subprocess over loopback TCP, the engine on its own port; the same
  request direct and through k3, per dialect, JSON and streaming; plus the cost per streamed event
  (a long stream against a one-event stream) and the proxy's resident memory.
- `load`: 1 to 128 keep-alive clients streaming turns back to back through the same k3, after it has
  served a thousand streams (runners.proxy_load): turns per second, latency, errors, k3's CPU per turn.
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
import psutil

from common.click_options import count_option, float_option, text_option
from harness.receipt import RESULTS_DIR, write_receipt
from harness.stats import Verdict, verdict
from k3.app import create_app
from k3.bench import DIALECTS, ROUTES, client_request
from k3.bench import measure as measure_asgi
from k3.config import Config
from k3.testing.fake_upstream import FakeUpstream
from runners import proxy_load
from runners.options import chosen, positive_ints, results_option
from runners.outcome import report
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


def _sockets(k3_base, engine_base, iterations, warmup, receipt) -> None:
    cases = [(d, s) for d in DIALECTS for s in (False, True)]
    with click.progressbar(cases, label="loopback sockets") as bar:
        for dialect, stream in bar:
            samples = asyncio.run(_paired(k3_base, engine_base, dialect, stream, None, iterations, warmup))
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


def load_sweep(k3_base, k3_proc, clients, kinds, seconds, warm_streams, receipt) -> dict:
    """Every (client kind, number of clients) level through one k3 that first served `warm_streams`
    turns; -> {(kind, clients): Level}. Writes one receipt per level."""
    click.echo(f"warming k3 up with {warm_streams} streamed turns ...", err=True)
    try:
        served = proxy_load.warm(k3_base, warm_streams, k3_proc)
    except proxy_load.StoppedServing as exc:
        raise click.ClickException(str(exc)) from None
    levels = {}
    with click.progressbar([(k, n) for k in kinds for n in clients], label="load levels") as bar:
        for kind, n in bar:
            level = levels[kind, n] = proxy_load.measure_level(kind, k3_base, n, seconds, k3_proc)
            rss = k3_proc.memory_info().rss / (1 << 20)
            served += level.completed
            receipt(
                f"load.anthropic.stream.{kind}.c{n}",
                {"latency_ms": level.latencies_ms or [float("nan")], "turns_per_s": level.per_second,
                 "rss_mib": [rss]},
                level.derived() | {"served_before": float(served - level.completed)},
                {"mode": "load", "client": kind, "clients": n, "seconds": seconds, "deltas_per_turn": 64},
                f"{n} keep-alive {kind} clients streaming Anthropic turns back to back for {seconds:g} s; "
                "turns_per_s samples are whole seconds; k3_cpu_ms_per_turn is k3's process CPU over the "
                "window per completed turn",
            )  # fmt: skip
    return levels


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


UNITS = {"direct_ms": "ms", "proxied_ms": "ms", "added_ms": "ms", "floor_ms": "ms", "hop_added_ms": "ms",
         "own_ms": "ms", "hop_added_median_us": "µs", "own_median_us": "µs", "events": "events", "rss_mib": "MiB",
         "added_us_per_event": "µs", "added_median_us": "µs", "latency_ms": "ms", "turns_per_s": "turns/s",
         "latency_p50_ms": "ms", "latency_p99_ms": "ms", "errors": "turns", "k3_cpu_ms_per_turn": "ms",
         "k3_cores_busy": "cores", "served_before": "turns"}  # fmt: skip


@click.command("proxy")
@count_option("--iterations", default=300, minimum=2, help="Timed requests per path and case.")
@count_option("--warmup", default=30, minimum=0, help="Untimed requests per case before the timed ones.")
@text_option(
    "--clients",
    default="1,4,8,32,64,128",
    help="Load levels: numbers of keep-alive clients streaming turns back to back (comma list).",
)
@text_option(
    "--load-clients",
    default="raw,httpx",
    help="Client kinds for the load levels: raw (hand-written HTTP/1.1 on sockets) and/or httpx.",
)
@float_option("--load-seconds", default=10.0, minimum=1, help="Seconds per load level.")
@count_option(
    "--warm-streams",
    default=1000,
    minimum=0,
    help="Streamed turns k3 serves before the first load level (leaks build up over turns).",
)
@text_option(
    "--modes",
    default="asgi,sockets,load",
    help="asgi (in process), sockets (k3 serve over loopback), load (the concurrency sweep).",
)
@results_option
@click.option("--no-regenerate", is_flag=True, help="Write receipts only; skip RESULTS.md and figures.")
def proxy_command(iterations, warmup, clients, load_clients, load_seconds, warm_streams, modes, results,
                  no_regenerate) -> list[Path]:  # fmt: skip
    """Latency k3 adds per request and per event, for each dialect, JSON and streaming, and the load k3
    holds with 1 to 128 streaming clients, as receipts."""
    wanted = set(chosen(modes, ("asgi", "sockets", "load"), "--modes"))
    levels = positive_ints(clients)
    kinds = chosen(load_clients, tuple(proxy_load.CLIENT_KINDS), "--load-clients")
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
    if wanted & {"sockets", "load"}:
        with engine_and_k3() as (engine_base, k3_base, k3_proc):
            if "sockets" in wanted:
                _sockets(k3_base, engine_base, iterations, warmup, receipt)
            if "load" in wanted:
                swept = load_sweep(k3_base, k3_proc, levels, kinds, load_seconds, warm_streams, receipt)
                _print_sweep(swept)
    report(written)
    if not no_regenerate:
        regenerate(results)
    return written


def _print_sweep(levels: dict) -> None:
    click.echo("client  clients  turns/s  p50 ms  p99 ms  errors  k3 ms CPU/turn  k3 cores")
    for (kind, n), level in levels.items():
        d = level.derived()
        click.echo(
            f"{kind:6}  {n:7}  {d['turns_per_s']:7.1f}  {d['latency_p50_ms']:6.1f}  {d['latency_p99_ms']:6.1f}"
            f"  {level.errors:6}  {d['k3_cpu_ms_per_turn']:14.2f}  {d['k3_cores_busy']:8.2f}"
        )


GATED = ("asgi.anthropic.json", "asgi.anthropic.stream", "asgi.responses.stream", "sockets.anthropic.json")


@click.command("proxy-gate")
@float_option(
    "--max-regression",
    default=75.0,
    help="Allowed growth of the in-process (asgi) median added latency, in percent (docs/METHODS.md).",
)
@float_option(
    "--max-regression-sockets",
    default=300.0,
    help="Allowed growth of the loopback-socket median added latency, in percent: scheduling noise on a "
    "loaded 2-core machine moves it far more than the in-process figure.",
)
@count_option("--iterations", default=300, minimum=2, help="Timed requests per case.")
@float_option(
    "--load-floor",
    default=0.8,
    help="Fail when turns/s with 32 streaming clients fall below this fraction of turns/s with 4, "
    "measured in the same run on a k3 that first served --warm-streams turns.",
)
@float_option("--load-seconds", default=3.0, minimum=0.5, help="Seconds per load round.")
@count_option(
    "--warm-streams", default=1000, minimum=0, help="Streamed turns k3 serves before the load rounds."
)
@count_option("--confirm", default=2, minimum=0,
              help="When the ratio is under --load-floor, measure it again this many times; the load check fails "
                   "only if it is under the floor every time. Errors and a k3 that stops serving fail at once.")  # fmt: skip
@float_option("--confirm-pause", default=10.0, minimum=0,
              help="Seconds to wait before each confirmation, so a passing burst of load is over.")  # fmt: skip
@click.option(
    "--results",
    type=click.Path(path_type=Path),
    default=RESULTS_DIR,
    show_default="results/ of this checkout",
    help="Where the committed baseline receipts are.",
)
def proxy_gate_command(max_regression, max_regression_sockets, iterations, load_floor, load_seconds,
                       warm_streams, confirm, confirm_pause, results) -> None:  # fmt: skip
    """CI gate: k3 must hold load (32 clients against 4, same run), and its added latency must not have
    regressed against the committed receipts."""
    load_ok = _load_gate(load_floor, load_seconds, warm_streams, confirm, confirm_pause)
    latency_failed = _latency_gate(max_regression, max_regression_sockets, iterations, results)
    if not load_ok or latency_failed:
        what = (["load collapsed with 32 clients"] if not load_ok else []) + latency_failed
        raise click.ClickException(f"proxy gate failed: {'; '.join(what)}")


def _load_gate(floor: float, seconds: float, warm_streams: int, confirm: int, pause: float) -> bool:
    """Turns/s at 32 raw clients against 4, rounds alternated 4, 32, 4, 32 (medians of two).

    On a shared 2-core machine the load generator, k3 and the engine compete for the cores, so one
    measurement can land under the floor by scheduling alone; a k3 that degrades with clients is still
    degraded a few seconds later. A ratio under the floor is measured again `confirm` times and fails only
    if every measurement agrees. Errors, or a k3 that stops serving, are never noise: they fail at once.
    """
    with engine_and_k3() as (_, k3_base, k3_proc):
        try:
            proxy_load.warm(k3_base, warm_streams, k3_proc)
        except proxy_load.StoppedServing as exc:
            click.echo(f"load: {exc} — COLLAPSED")
            return False
        for attempt in range(confirm + 1):
            if attempt:
                click.echo(f"confirming the load ratio ({attempt}/{confirm}) after a {pause:g} s pause")
                time.sleep(pause)
            ok, errors = _load_ratio(floor, seconds, k3_base, k3_proc)
            if ok or errors:
                return ok
    return False


def _load_ratio(floor: float, seconds: float, k3_base: str, k3_proc: psutil.Process) -> tuple[bool, int]:
    """One alternated measurement; -> (ratio at or over the floor, errors seen)."""
    rates: dict[int, list[float]] = {4: [], 32: []}
    errors = 0
    for n in (4, 32, 4, 32):
        level = proxy_load.measure_level("raw", k3_base, n, seconds, k3_proc)
        errors += level.errors
        rates[n].append(0.0 if level.errors else level.completed / seconds)
    ratio = statistics.median(rates[32]) / max(1e-9, statistics.median(rates[4]))
    ok = ratio >= floor and not errors
    click.echo(
        f"load: {statistics.median(rates[4]):.1f} turns/s with 4 clients, {statistics.median(rates[32]):.1f} "
        f"with 32: ratio {ratio:.2f}, floor {floor:g}, errors {errors} — {'ok' if ok else 'COLLAPSED'}"
    )
    return ok, errors


def machine_factor(base: dict, fresh: dict) -> float:
    """How much slower this machine runs the case's direct turns (client to engine, no k3) than when the
    baseline was measured: the ratio of their medians, at least 1. The direct path runs none of k3's code
    and is timed interleaved with the proxied one, so a slower host (a noisy neighbour, less memory
    bandwidth: both seen on the shared 2-core machine) is divided out and a slower k3 is not."""
    ratio = statistics.median(fresh["samples"]["direct_ms"]) / statistics.median(base["samples"]["direct_ms"])
    return max(1.0, ratio)


def judge_added_latency(base: dict, fresh: dict, allowed_pct: float) -> tuple[float, Verdict]:
    """(machine factor, verdict) of a fresh receipt's added latency against its baseline, the fresh turns
    divided by the machine factor. It regresses when beyond the allowance AND a real change: the bootstrap
    CI of the per-turn ratio of medians lies wholly above 1 (a noisy run straddling 1 does not fail)."""
    factor = machine_factor(base, fresh)
    new_samples = [t / factor for t in fresh["samples"]["added_ms"]]
    old, new = base["derived"]["added_median_us"], fresh["derived"]["added_median_us"] / factor
    return factor, verdict(old, new, allowed_pct, False, base["samples"]["added_ms"], new_samples)


def _latency_gate(max_regression, max_regression_sockets, iterations, results) -> list[str]:
    """The added latency of the gated cases against the committed receipts; -> the regressed ones."""
    from harness.hardware import describe
    from harness.receipt import load_receipt
    from harness.report import find_receipt

    hardware_id = describe()["hardware_id"]
    baselines = {}
    for name in GATED:
        try:
            baselines[name] = load_receipt(find_receipt(f"latest:proxy/{hardware_id}/{name}", results))
        except FileNotFoundError:
            pass
    if not baselines:
        click.echo(f"proxy gate: no committed proxy receipts for {hardware_id}; nothing to compare against")
        return []
    with tempfile.TemporaryDirectory() as scratch:
        ctx = click.get_current_context()
        ctx.invoke(proxy_command, iterations=iterations, warmup=30, modes="asgi,sockets", results=Path(scratch),
                   no_regenerate=True)  # fmt: skip
        fresh = {r["name"]: r for r in map(load_receipt, Path(scratch).glob("proxy/*/*.json"))}
    failed = []
    for name, base in baselines.items():
        allowed = max_regression_sockets if name.startswith("sockets.") else max_regression
        factor, result = judge_added_latency(base, fresh[name], allowed)
        click.echo(f"{name}: machine factor {factor:.2f}; added median (µs), divided by it, {result}")
        if result.regressed:
            failed.append(f"{name} regressed")
    return failed
