"""Fixtures for the runtime tests: one tiny synthetic engine (FP32, CPU unless a test asks for CUDA)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.runtime import Engine
from tests.runtime.runtime_support import tiny_engine, write_tiny_artifact


@pytest.fixture(scope="session")
def engine() -> Engine:
    """Prefix cache off: tests that want it build their own engine."""
    with tiny_engine() as eng:
        yield eng


@pytest.fixture
def rng(request) -> torch.Generator:
    """Seeded per test: every test draws its own fresh inputs."""
    seed = sum(ord(c) * (i + 1) for i, c in enumerate(request.node.name)) % (2**31)
    return torch.Generator().manual_seed(seed)


@pytest.fixture(scope="session")
def tiny_artifact(tmp_path_factory) -> tuple[Path, Path]:
    """(checkpoint, INT4 artifact) of the tiny preset, the artifact made by `kimi-engine quantize`."""
    return write_tiny_artifact(tmp_path_factory.mktemp("int4"))
