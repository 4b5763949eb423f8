"""Fixtures for the server tests: one tiny engine served on a real loopback socket per module."""

from __future__ import annotations

import pytest
import torch

from tests.server.server_support import ServerThread, make_context


@pytest.fixture(scope="session", autouse=True)
def single_thread():
    """Tiny shapes only contend on the shared 2-core machine (see tests/engine/conftest.py)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def server():
    context = make_context()
    with ServerThread(context) as running:
        yield running
    context.engine.close()
