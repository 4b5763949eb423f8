"""The proxy-overhead measurement runs and returns well-formed raw samples (no timing asserted)."""

from __future__ import annotations

import math

import pytest

from k3.bench import DIALECTS, Samples, client_request, measure


def test_measure_returns_interleaved_samples_for_every_dialect_and_mode():
    samples = measure(iterations=3, warmup=1)
    assert [(s.dialect, s.stream) for s in samples] == [(d, m) for d in DIALECTS for m in (False, True)]
    for s in samples:
        assert isinstance(s, Samples)
        assert len(s.direct_s) == len(s.proxied_s) == 3
        assert all(math.isfinite(x) and x > 0 for x in s.direct_s + s.proxied_s)


def test_measure_can_be_narrowed():
    samples = measure(iterations=2, warmup=0, dialects=("chat",), streams=(True,))
    assert [(s.dialect, s.stream) for s in samples] == [("chat", True)]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_client_requests_are_small_turns(dialect):
    body = client_request(dialect, True)
    assert body["stream"] is True and body["model"]
