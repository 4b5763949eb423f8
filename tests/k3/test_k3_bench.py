"""The proxy-overhead measurement runs and returns well-formed raw samples (no timing asserted)."""

from __future__ import annotations

import math

import httpx
import orjson
import pytest

from k3.bench import DIALECTS, NullProxy, Samples, client_request, measure
from k3.config import Config
from k3.testing.fake_upstream import FakeUpstream
from k3.upstream import Upstream


def test_measure_returns_interleaved_samples_for_every_dialect_and_mode():
    samples = measure(iterations=3, warmup=1)
    assert [(s.dialect, s.stream) for s in samples] == [(d, m) for d in DIALECTS for m in (False, True)]
    for s in samples:
        assert isinstance(s, Samples)
        assert len(s.direct_s) == len(s.proxied_s) == len(s.floor_s) == 3
        assert all(math.isfinite(x) and x > 0 for x in s.direct_s + s.proxied_s + s.floor_s)


def test_measure_can_be_narrowed():
    samples = measure(iterations=2, warmup=0, dialects=("chat",), streams=(True,))
    assert [(s.dialect, s.stream) for s in samples] == [("chat", True)]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_client_requests_are_small_turns(dialect):
    body = client_request(dialect, True)
    assert body["stream"] is True and body["model"]


async def test_null_proxy_returns_the_engine_bytes_untouched():
    fake = FakeUpstream()
    null = NullProxy(Upstream(Config(upstream="http://fake/v1"), httpx.ASGITransport(fake)))
    payload = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(null), base_url="http://null") as client:
        via_null = await client.post("/", content=orjson.dumps(payload))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(fake), base_url="http://fake") as client:
        direct = await client.post("/v1/chat/completions", content=orjson.dumps(payload))
    assert via_null.status_code == direct.status_code == 200
    assert via_null.headers["content-type"] == "text/event-stream"
    assert via_null.content == direct.content and b"echo: hi" in via_null.content
    assert fake.requests == [payload, payload]
