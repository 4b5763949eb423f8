"""Helpers shared by the runtime tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from click.testing import CliRunner

from engine.cli import main as engine_cli
from engine.model import preset
from engine.runtime import Engine, Scheduler
from engine.runtime.loader import CHAT_TEMPLATE_FILE
from engine.synth import write_synthetic_checkpoint


def random_prompt(rng: torch.Generator, n: int, vocab: int = 256) -> list[int]:
    """n random byte tokens (the tiny model's ordinary text range)."""
    return torch.randint(0, vocab, (n,), generator=rng).tolist()


def tiny_engine(
    *, device: str = "cpu", max_context: int = 8192, prefix_cache_gib: float = 0, **options: Any
) -> Engine:
    """The tiny synthetic engine in FP32 (the CPU default may be BF16; the checks compare with FP32
    tolerances), prefix cache off unless asked (hits would change what is measured)."""
    return Engine.load(
        synthetic="tiny",
        device=device,
        dtype=torch.float32,
        max_context=max_context,
        prefix_cache_gib=prefix_cache_gib,
        **options,
    )


@contextmanager
def running_scheduler(engine: Engine, max_active: int, max_queue: int | None = None) -> Iterator[Scheduler]:
    """A started scheduler over ``engine`` (queue as deep as ``max_active`` unless given), stopped on exit."""
    scheduler = Scheduler(
        engine, max_active=max_active, max_queue=max_active if max_queue is None else max_queue
    )
    scheduler.start()
    try:
        yield scheduler
    finally:
        scheduler.stop()


def decode_with_and_without_graphs(
    graphs: Engine, eager: Engine, prompt: list[int], n: int
) -> tuple[list[list[int]], list[list[int]]]:
    """The ``n`` greedy tokens after ``prompt`` (as `Engine.decode` returns them) from an engine replaying
    CUDA graphs and from one decoding eagerly."""
    runs = []
    for eng in (graphs, eager):
        seq = eng.prefill([prompt], max_new_tokens=n)
        runs.append(eng.decode(seq, n))
        eng.release(seq)
    return runs[0], runs[1]


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


@contextmanager
def submitted_together(scheduler: Scheduler) -> Iterator[None]:
    """Requests submitted inside join at the same step of a running scheduler: this thread holds the
    scheduler's (reentrant) lock, which its loop takes before it admits anything or steps on."""
    with scheduler._cond:
        yield
