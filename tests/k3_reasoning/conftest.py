"""Fixtures for the reasoning tests."""

import pytest
from reasoning_support import FakeClock, make_record


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def record() -> dict:
    return make_record()
