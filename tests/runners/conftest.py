"""A trained tiny checkpoint (a few steps on a small generated corpus), shared by the runner tests."""

from __future__ import annotations

import dataclasses

import pytest

from engine.training.cli import trained_checkpoint
from engine.training.trainer import DEFAULT_RECIPES


@pytest.fixture(scope="session")
def trained_tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("trained")
    corpus = root / "corpus"
    corpus.mkdir()
    for i in range(30):
        (corpus / f"m{i}.py").write_text("".join(f"y{j} = {i} + {j}\n" for j in range(60)))
    recipe = dataclasses.replace(DEFAULT_RECIPES["tiny"], steps=3, batch_size=2, seq_len=16, warmup_steps=1,
                                 eval_tokens=64)  # fmt: skip
    path, _ = trained_checkpoint(recipe, root / "cache", corpus_root=corpus)
    return path
