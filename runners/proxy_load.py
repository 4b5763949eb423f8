"""Load through k3: N keep-alive clients streaming turns back to back, for a fixed time per level.

What agents do to k3 all day: many clients, each sending its next streamed turn as soon as the last
one ended. Per level (number of clients) the run records completed turns per second, turn latency
(whole stream), errors, and the CPU k3's process spent per completed turn. Two client kinds:
`raw` (HTTP/1.1 written and read on asyncio sockets: a light client, so the load generator is not
what saturates) and `httpx` (what Python agents and SDKs use). The k3 under test has already served
`warm` streams before the first level, so leaks that build up over turns show (docs/METHODS.md).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx
import orjson
import psutil

from k3.bench import client_request

PROMPT = "p" * 504  # the engine echoes "echo: " + this, 8 characters a chunk: 64 text deltas
ROUTE = "/v1/messages"


def turn_body() -> bytes:
    body = client_request("anthropic", True)
    body["messages"][0]["content"] = PROMPT
    return orjson.dumps(body)


@dataclass
class Level:
    """What one level of load measured."""

    clients: int
    seconds: float
    latencies_ms: list[float] = field(default_factory=list)
    per_second: list[int] = field(default_factory=list)  # turns completed in each whole second
    errors: int = 0
    k3_cpu_s: float = 0.0

    @property
    def completed(self) -> int:
        return len(self.latencies_ms)

    def derived(self) -> dict[str, float]:
        ordered = sorted(self.latencies_ms) or [float("nan")]
        done = max(1, self.completed)
        return {
            "turns_per_s": self.completed / self.seconds,
            "latency_p50_ms": statistics.median(ordered),
            "latency_p99_ms": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
            "errors": float(self.errors),
            "k3_cpu_ms_per_turn": self.k3_cpu_s * 1e3 / done,
            "k3_cores_busy": self.k3_cpu_s / self.seconds,
        }


class RawClient:
    """One keep-alive HTTP/1.1 connection written and read by hand: the request bytes are built
    once, the response is read to the end of its chunked body."""

    def __init__(self, base: str, body: bytes):
        url = urlsplit(base)
        self._host, self._port = url.hostname or "127.0.0.1", url.port or 80
        self._request = (
            f"POST {ROUTE} HTTP/1.1\r\nhost: {url.netloc}\r\ncontent-type: application/json\r\n"
            f"anthropic-version: 2023-06-01\r\ncontent-length: {len(body)}\r\n\r\n"
        ).encode() + body
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def turn(self) -> bool:
        """One streamed turn; -> whether it answered 200 with a complete body."""
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self._host, self._port)
        reader, writer = self._reader, self._writer
        assert reader is not None
        writer.write(self._request)
        head = await reader.readuntil(b"\r\n\r\n")
        ok = head.startswith(b"HTTP/1.1 200")
        headers = head.lower()
        if b"transfer-encoding: chunked" in headers:
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                await reader.readexactly(size + 2)
                if size == 0:
                    break
        else:
            length = int(headers.split(b"content-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
        if b"connection: close" in headers:
            await self.close()
        return ok

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = self._reader = None


class HttpxClient:
    """One httpx client with one connection, as an SDK holds it."""

    def __init__(self, base: str, body: bytes):
        self._url, self._body = base + ROUTE, body
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        self._client = httpx.AsyncClient(timeout=60, limits=limits)
        self._headers = {"content-type": "application/json", "anthropic-version": "2023-06-01"}

    async def turn(self) -> bool:
        async with self._client.stream("POST", self._url, content=self._body, headers=self._headers) as r:
            async for _ in r.aiter_raw():
                pass
            return r.status_code == 200

    async def close(self) -> None:
        await self._client.aclose()


CLIENT_KINDS = {"raw": RawClient, "httpx": HttpxClient}


async def _level(kind: str, base: str, clients: int, seconds: float, k3: psutil.Process) -> Level:
    body = turn_body()
    level = Level(clients, seconds)
    pool = [CLIENT_KINDS[kind](base, body) for _ in range(clients)]
    start = time.perf_counter()
    deadline = start + seconds
    finished_at: list[float] = []

    async def run(client) -> None:
        while (now := time.perf_counter()) < deadline:
            try:
                async with asyncio.timeout(max(0.1, deadline + 30 - now)):  # a hung k3 is an error
                    ok = await client.turn()
            except (TimeoutError, OSError, asyncio.IncompleteReadError, httpx.HTTPError, ValueError):
                ok = False
                await client.close()
            end = time.perf_counter()
            if end > deadline:
                break  # a turn that ends after the window is not counted either way
            if ok:
                level.latencies_ms.append((end - now) * 1e3)
                finished_at.append(end - start)
            else:
                level.errors += 1

    cpu = k3.cpu_times()
    try:
        await asyncio.gather(*(run(c) for c in pool))
    finally:
        after = k3.cpu_times()
        for client in pool:
            await client.close()
    level.k3_cpu_s = (after.user + after.system) - (cpu.user + cpu.system)
    level.per_second = [0] * max(1, int(seconds))
    for t in finished_at:
        level.per_second[min(int(t), len(level.per_second) - 1)] += 1
    return level


def measure_level(kind: str, base: str, clients: int, seconds: float, k3: psutil.Process) -> Level:
    """`clients` clients of `kind` streaming turns through k3 at `base` for `seconds`."""
    return asyncio.run(_level(kind, base, clients, seconds, k3))


class StoppedServing(RuntimeError):
    """k3 completed no turn in a whole second of load."""


def warm(base: str, streams: int, k3: psutil.Process) -> int:
    """Serve at least `streams` turns through k3 first (32 raw clients, one-second rounds), so the
    levels run on a k3 with a history; -> how many it served."""
    served = 0
    while served < streams:
        done = measure_level("raw", base, 32, 1.0, k3).completed
        if done == 0:
            raise StoppedServing(f"k3 stopped serving after {served} streamed turns")
        served += done
    return served
