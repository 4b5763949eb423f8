"""The real-client runs share one installed client cache, one scripted engine and one k3 at a time."""

from __future__ import annotations

import pytest

from harness.hardware import REPO_ROOT
from runners.conformance import install
from runners.conformance.driver import Driver
from runners.conformance.k3proc import resolve_k3_repo


@pytest.fixture(scope="session")
def driver(tmp_path_factory):
    try:
        installed = install.ensure()
    except install.NoNpm as exc:
        pytest.skip(f"real clients cannot be installed on this machine: {exc}")
    with Driver(
        installed, resolve_k3_repo(None, REPO_ROOT), tmp_path_factory.mktemp("conformance-logs")
    ) as running:
        yield running
