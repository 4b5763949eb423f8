"""Proxy overhead: the latency k3 adds to one turn, per dialect, streaming and not.

For each (dialect, stream) pair the same turn is timed two ways in the same run, interleaved
(the order alternates every iteration so drift hits both alike):

* direct: the OpenAI Chat request k3 would send, posted straight to the fake engine;
* proxied: the dialect's own request, posted to k3, which translates it, calls the same fake
  engine once, and translates the answer back.

* floor: the engine request's bytes posted to `NullProxy`, which forwards them unchanged through
  the same kind of httpx transport k3 uses and returns the engine's bytes unchanged.

All go through httpx over in-process ASGI transports (no sockets), and all read the whole
response body. The added latency of a request is proxied minus direct; floor minus direct is
what the extra in-process hop alone costs any proxy built on httpx, so proxied minus floor is
k3's own work. Warm-up requests check that the proxied answer really is in the client's
dialect, so the timing measures translation.
"""

from __future__ import annotations

import asyncio
import gc
import time
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from k3.app import create_app
from k3.config import Config
from k3.connection import Receive, Scope, Send
from k3.testing.fake_upstream import FakeUpstream
from k3.upstream import Upstream

DIALECTS = ("anthropic", "chat", "responses")
ROUTES = {"anthropic": "/v1/messages", "chat": "/v1/chat/completions", "responses": "/v1/responses"}
PROMPT = "ping"


@dataclass
class Samples:
    dialect: str
    stream: bool
    direct_s: list[float]  # seconds per request, straight to the engine
    proxied_s: list[float]  # seconds per request, through k3 (same index = same iteration)
    floor_s: list[float]  # seconds per request, through NullProxy


class NullProxy:
    """The least an in-process proxy on httpx can do: read the body, send it upstream as k3 does
    (the same prepared request through the same kind of transport), and send the engine's status,
    content type and bytes back untouched. No parsing, no translation."""

    def __init__(self, upstream: Upstream):
        self._upstream = upstream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        upstream = self._upstream
        response = await upstream.transport.handle_async_request(upstream.chat_request(body))
        try:
            content = b"".join([piece async for piece in response.stream])  # type: ignore[union-attr]
        finally:
            await response.stream.aclose()  # type: ignore[union-attr]
        kind = response.headers.get("content-type", "application/json").encode()
        headers = [(b"content-type", kind), (b"content-length", str(len(content)).encode())]
        await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
        await send({"type": "http.response.body", "body": content})


def client_request(dialect: str, stream: bool) -> dict[str, Any]:
    """The turn each dialect sends: one short user message, 16 output tokens at most."""
    if dialect == "anthropic":
        return {
            "model": "claude-sonnet-4-5",
            "max_tokens": 16,
            "messages": [{"role": "user", "content": PROMPT}],
            "stream": stream,
        }
    if dialect == "responses":
        return {"model": "gpt-5", "max_output_tokens": 16, "input": PROMPT, "stream": stream}
    return {
        "model": "gpt-4o",
        "max_tokens": 16,
        "messages": [{"role": "user", "content": PROMPT}],
        "stream": stream,
    }


def _check_translated(dialect: str, stream: bool, response: httpx.Response) -> None:
    if response.status_code != 200:
        raise RuntimeError(f"{dialect} request failed with {response.status_code}: {response.text[:200]}")
    text = response.text
    expected = {
        (False, "anthropic"): '"type":"message"',
        (False, "chat"): '"object":"chat.completion"',
        (False, "responses"): '"object":"response"',
        (True, "anthropic"): "event: message_stop",
        (True, "chat"): "data: [DONE]",
        (True, "responses"): "event: response.completed",
    }[(stream, dialect)]
    if expected not in text or "echo:" not in text:
        raise RuntimeError(f"the proxied {dialect} answer is not in its dialect: {text[:200]}")


async def _timed(client: httpx.AsyncClient, path: str, body: bytes) -> float:
    start = time.perf_counter()
    response = await client.post(path, content=body, headers={"content-type": "application/json"})
    await response.aread()
    elapsed = time.perf_counter() - start
    if response.status_code != 200:
        raise RuntimeError(f"POST {path} failed with {response.status_code}")
    return elapsed


async def measure_async(
    iterations: int = 200,
    warmup: int = 20,
    dialects: tuple[str, ...] = DIALECTS,
    streams: tuple[bool, ...] = (False, True),
) -> list[Samples]:
    fake = FakeUpstream()
    app = create_app(Config(upstream="http://fake/v1"), upstream_transport=httpx.ASGITransport(fake))
    null_upstream = Upstream(Config(upstream="http://fake/v1"), httpx.ASGITransport(fake))
    null = NullProxy(null_upstream)
    direct = httpx.AsyncClient(transport=httpx.ASGITransport(fake), base_url="http://fake")
    proxied = httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://k3")
    floor = httpx.AsyncClient(transport=httpx.ASGITransport(null), base_url="http://null")
    results = []
    try:
        for dialect in dialects:
            for stream in streams:
                client_body = orjson.dumps(client_request(dialect, stream))
                response = await proxied.post(ROUTES[dialect], content=client_body)
                _check_translated(dialect, stream, response)
                engine_body = orjson.dumps(fake.requests[-1])  # exactly what k3 sent upstream
                paths: list[tuple[httpx.AsyncClient, str, bytes, list[float]]] = [
                    (direct, "/v1/chat/completions", engine_body, []),
                    (proxied, ROUTES[dialect], client_body, []),
                    (floor, "/", engine_body, []),
                ]
                for _ in range(warmup):
                    for client, path, body, _samples in paths:
                        await _timed(client, path, body)
                gc.collect()
                for i in range(iterations):
                    # Rotate the order every iteration so drift and cache effects hit all paths alike.
                    for client, path, body, samples in paths[i % 3 :] + paths[: i % 3]:
                        samples.append(await _timed(client, path, body))
                    fake.requests.clear()
                results.append(Samples(dialect, stream, paths[0][3], paths[1][3], paths[2][3]))
    finally:
        await direct.aclose()
        await proxied.aclose()
        await floor.aclose()
        await app.state.k3.upstream.aclose()
        await null_upstream.aclose()
    return results


def measure(
    iterations: int = 200,
    warmup: int = 20,
    dialects: tuple[str, ...] = DIALECTS,
    streams: tuple[bool, ...] = (False, True),
) -> list[Samples]:
    """Raw samples for every (dialect, stream) pair; see the module docstring for the method."""
    return asyncio.run(measure_async(iterations, warmup, dialects, streams))
