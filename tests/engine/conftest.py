"""Fixtures for the engine tests: one synthetic tiny checkpoint per session, the engine model loaded from it
in float32, and the independent float64 reference on the same weights."""

from __future__ import annotations

import pytest
import torch

from engine.model import KimiLinearForCausalLM, load_model
from engine.model.presets import TINY
from engine.synth import write_synthetic_checkpoint
from tests.engine.reference_kimi import ReferenceKimi


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    return write_synthetic_checkpoint(
        TINY, tmp_path_factory.mktemp("tiny") / "ckpt", seed=1234, preset_name="tiny"
    )


@pytest.fixture(scope="session")
def tiny_model(tiny_dir) -> KimiLinearForCausalLM:
    return load_model(tiny_dir, dtype=torch.float32)


@pytest.fixture(scope="session")
def reference(tiny_dir) -> ReferenceKimi:
    return ReferenceKimi(tiny_dir)


@pytest.fixture
def rng(request) -> torch.Generator:
    """A generator seeded per test, so every test draws its own fresh inputs."""
    seed = sum(ord(c) * (i + 1) for i, c in enumerate(request.node.name)) % (2**31)
    return torch.Generator().manual_seed(seed)
