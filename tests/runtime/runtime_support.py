"""Helpers shared by the runtime tests."""

from __future__ import annotations

from pathlib import Path

import torch
from click.testing import CliRunner

from engine.cli import main as engine_cli
from engine.model import preset
from engine.runtime.loader import CHAT_TEMPLATE_FILE
from engine.synth import write_synthetic_checkpoint


def random_prompt(rng: torch.Generator, n: int, vocab: int = 256) -> list[int]:
    """n random byte tokens (the tiny model's ordinary text range)."""
    return torch.randint(0, vocab, (n,), generator=rng).tolist()


# A chat template of our own, so a test can tell the artifact's copy from the built-in synthetic one.
ARTIFACT_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_tiny_artifact(directory: Path, plan: str = "default") -> tuple[Path, Path]:
    """A tiny synthetic checkpoint with a chat template, quantised by `kimi-engine quantize` (the CLI,
    in process): returns (checkpoint, artifact)."""
    checkpoint = write_synthetic_checkpoint(preset("tiny"), directory / "checkpoint", seed=5)
    (checkpoint / CHAT_TEMPLATE_FILE).write_text(ARTIFACT_CHAT_TEMPLATE)
    artifact = directory / "artifact"
    result = CliRunner().invoke(engine_cli, ["quantize", str(checkpoint), str(artifact), "--plan", plan])
    if result.exit_code != 0:
        raise RuntimeError(f"kimi-engine quantize failed:\n{result.output}")
    return checkpoint, artifact
