"""Fixtures for the runtime tests: one tiny synthetic engine (FP32, CPU unless a test asks for CUDA)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.runtime import Engine
from tests.runtime.runtime_support import write_tiny_artifact


@pytest.fixture(scope="session")
def engine() -> Engine:
    """Prefix cache off: tests that want it build their own engine (hits would change what is measured)."""
    # FP32 (the CPU default may be BF16): the checks compare with FP32 tolerances.
    eng = Engine.load(
        synthetic="tiny", device="cpu", dtype=torch.float32, max_context=8192, prefix_cache_gib=0
    )
    yield eng
    eng.close()


@pytest.fixture
def rng(request) -> torch.Generator:
    """Seeded per test: every test draws its own fresh inputs."""
    seed = sum(ord(c) * (i + 1) for i, c in enumerate(request.node.name)) % (2**31)
    return torch.Generator().manual_seed(seed)


@pytest.fixture(scope="session")
def tiny_artifact(tmp_path_factory) -> tuple[Path, Path]:
    """(checkpoint, INT4 artifact) of the tiny preset, the artifact made by `kimi-engine quantize`."""
    return write_tiny_artifact(tmp_path_factory.mktemp("int4"))
