"""Fixtures for the server tests: one tiny engine served on a real loopback socket per module."""

from __future__ import annotations

import pytest

from tests.server.server_support import ServerThread, make_context


@pytest.fixture(scope="module")
def server():
    context = make_context()
    with ServerThread(context) as running:
        yield running
    context.engine.close()
