"""The load driver: one level of load (a concurrency, a request rate, or both) against one endpoint.

- Concurrency C alone (closed loop): C clients, each sending its next request as soon as its last one
  ended, as agents do.
- Rate R (open loop): requests start at random times, R a second on average. Gaps are drawn from a
  gamma distribution of shape `burstiness` and mean 1/R: burstiness 1 is a Poisson process, below 1
  burstier, above 1 more regular (vLLM's `--burstiness`). With C as well, at most C are in flight.
A level first sends `warmup` untimed requests, then either `requests` timed ones or as many as start
within `duration` seconds (each is then read to its end). Dataset requests are used in order, cycled.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import orjson

from runners.serve import dialects
from runners.serve.client import StreamedTurn, stream_turn
from runners.serve.datasets import Request
from runners.serve.metrics import ESTIMATE, Sample, TokenCounter, measure


@dataclass(frozen=True)
class Target:
    """Where and how to send: the endpoint's base URL (without /v1), dialect, model and credentials."""

    base: str
    dialect: str
    model: str
    api_key: str | None = None
    max_tokens: int | None = None
    timeout_s: float = 600.0
    ignore_eos: bool = False

    @property
    def url(self) -> str:
        return self.base + dialects.ROUTES[self.dialect]


@dataclass(frozen=True)
class Level:
    concurrency: int | None
    rate: float | None = None

    @property
    def label(self) -> str:
        parts = ([f"r{self.rate:g}"] if self.rate is not None else []) + (
            [f"c{self.concurrency}"] if self.concurrency is not None else []
        )
        return ".".join(parts)


@dataclass
class LevelResult:
    level: Level
    samples: list[Sample] = field(default_factory=list)
    seconds: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)  # of the first answer


def arrival_gaps(rate: float, burstiness: float, count: int, seed: int) -> list[float]:
    """Seconds between successive request starts: gamma(shape=burstiness, mean=1/rate)."""
    rng = random.Random(seed)
    return [rng.gammavariate(burstiness, 1.0 / (rate * burstiness)) for _ in range(count)]


def _bodies(target: Target, requests: list[Request]) -> list[bytes]:
    return [orjson.dumps(dialects.prepare_body(target.dialect, r.body, target.model, target.max_tokens,
                                               target.ignore_eos)) for r in requests]  # fmt: skip


async def _closed_loop(send, n_clients: int, count: int | None, deadline: float | None) -> None:
    issued = 0

    async def client() -> None:
        nonlocal issued
        while (count is None or issued < count) and (deadline is None or time.perf_counter() < deadline):
            index = issued
            issued += 1
            await send(index)

    await asyncio.gather(*(client() for _ in range(n_clients)))


async def _open_loop(send, level: Level, burstiness: float, count: int | None, deadline: float | None,
                     seed: int) -> None:  # fmt: skip
    cap = asyncio.Semaphore(level.concurrency) if level.concurrency else None
    assert level.rate is not None

    async def capped(index: int) -> None:
        if cap is None:
            return await send(index)
        async with cap:
            return await send(index)

    tasks, index, start = [], 0, time.perf_counter()
    gaps = iter(arrival_gaps(level.rate, burstiness, 1_000_000 if count is None else count, seed))
    due = start
    while (count is None or index < count) and (deadline is None or due < deadline):
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        tasks.append(asyncio.create_task(capped(index)))
        index += 1
        due += next(gaps)
    await asyncio.gather(*tasks)


async def run_level(target: Target, requests: list[Request], level: Level, *, count: int | None,
                    duration: float | None, warmup: int, burstiness: float = 1.0, seed: int = 0,
                    counter: TokenCounter = ESTIMATE,
                    on_done: Callable[[Sample], None] = lambda _: None) -> LevelResult:  # fmt: skip
    """Warm up, then run one level to its end; -> every timed request's metrics."""
    bodies = _bodies(target, requests)
    headers = dialects.headers(target.dialect, target.api_key)
    width = max(level.concurrency or 0, 1) + (64 if level.rate is not None else 0)
    limits = httpx.Limits(max_connections=width, max_keepalive_connections=width)
    result = LevelResult(level)
    turns: list[StreamedTurn] = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(target.timeout_s, connect=10), limits=limits) as http:

        async def send_untimed(index: int) -> None:
            await stream_turn(http, target.url, target.dialect, bodies[index % len(bodies)], headers)

        async def send(index: int) -> None:
            body = bodies[(warmup + index) % len(bodies)]  # not the warm-up's: no prefix cache hit from it
            turn = await stream_turn(http, target.url, target.dialect, body, headers)
            turns.append(turn)
            sample = measure(turn, counter)
            result.samples.append(sample)
            if not result.headers and turn.headers:
                result.headers = turn.headers
            on_done(sample)

        if warmup:
            await _closed_loop(send_untimed, min(warmup, level.concurrency or 1), warmup, None)
        deadline = time.perf_counter() + duration if duration is not None else None
        if level.rate is None:
            await _closed_loop(send, level.concurrency or 1, count, deadline)
        else:
            await _open_loop(send, level, burstiness, count, deadline, seed)
    if turns:
        result.seconds = max(t.end for t in turns) - min(t.start for t in turns)
    return result
