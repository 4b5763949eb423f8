"""Fixtures for the k3 tests: a scripted fake engine, in-process k3 apps in front of it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from k3.app import create_app
from k3.config import Config
from k3.testing.asgi import StreamingASGITransport
from k3.testing.fake_upstream import FakeUpstream


@pytest.fixture
def fake() -> FakeUpstream:
    return FakeUpstream()


@pytest.fixture
async def make_client(fake: FakeUpstream) -> AsyncIterator[Callable[..., httpx.AsyncClient]]:
    """k3 in-process (httpx ASGI transport) with the fake engine in-process behind it."""
    clients: list[httpx.AsyncClient] = []

    def make(**config: object) -> httpx.AsyncClient:
        config = {"upstream": "http://fake/v1", **config}
        app = create_app(Config(**config), upstream_transport=httpx.ASGITransport(fake))  # type: ignore[arg-type]
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://k3", timeout=10)
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.aclose()


@pytest.fixture
async def client(make_client: Callable[..., httpx.AsyncClient]) -> httpx.AsyncClient:
    return make_client()


@pytest.fixture
def live(engine_server: tuple[FakeUpstream, str]) -> tuple[FakeUpstream, str]:
    fake, base_url = engine_server
    fake.reset()
    return fake, base_url


@pytest.fixture
async def make_streaming_client(
    live: tuple[FakeUpstream, str],
) -> AsyncIterator[Callable[..., httpx.AsyncClient]]:
    """k3 in-process with a streaming transport (keep-alives, hang-ups visible) in front of the
    live fake engine (a real socket, so the engine sees k3 close its connection)."""
    clients: list[httpx.AsyncClient] = []
    apps = []

    def make(**config: object) -> httpx.AsyncClient:
        app = create_app(Config(upstream=live[1], **config))  # type: ignore[arg-type]
        apps.append(app)
        client = httpx.AsyncClient(transport=StreamingASGITransport(app), base_url="http://k3", timeout=10)
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.aclose()
    for app in apps:
        await app.state.k3.upstream.aclose()
