"""Fixtures: one scripted engine on a real socket, and k3 servers (one per configuration) in front of it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack

import pytest

from k3.app import create_app
from k3.config import Config
from k3.testing.fake_upstream import FakeUpstream, serve_in_thread


@pytest.fixture
def engine(engine_server: tuple[FakeUpstream, str]) -> FakeUpstream:
    fake, _ = engine_server
    fake.reset()
    return fake


@pytest.fixture(scope="session")
def proxy(engine_server: tuple[FakeUpstream, str]) -> Iterator[Callable[..., str]]:
    """`proxy(**config)` -> the base URL (no /v1) of a k3 server with that configuration.

    Servers are kept for the session, one per distinct configuration, each with its own
    in-memory ledger and signing secret.
    """
    _, upstream = engine_server
    servers: dict[tuple, str] = {}
    with ExitStack() as stack:

        def get(**config: object) -> str:
            key = tuple(sorted(config.items()))
            if key not in servers:
                app = create_app(Config(upstream=upstream, **config))  # type: ignore[arg-type]
                servers[key] = stack.enter_context(serve_in_thread(app)).removesuffix("/v1")
            return servers[key]

        yield get
