"""`python -m runners training`: train (or take from the cache) a checkpoint with `kimi-engine train`'s
recipe and write its training.json as a receipt (suite `training`): loss curve, held-out perplexity and
bits per byte, steps, tokens, wall time. A cached checkpoint's receipt repeats the wall time of the run
that made it (the receipt says so)."""

from __future__ import annotations

import json
from pathlib import Path

import click
import torch

from common.click_options import count_option
from engine.model.loading import TRAINING_RECORD, Checkpoint
from engine.training.cli import CACHE_DIR, trained_checkpoint
from engine.training.trainer import DEFAULT_RECIPES, recipe_for
from harness.receipt import write_receipt
from runners.options import results_option
from runners.regenerate import regenerate


@click.command("training")
@click.option("--config", "preset_name", type=click.Choice(sorted(DEFAULT_RECIPES)), default="tiny",
              show_default=True, help="Model size.")  # fmt: skip
@click.option("--steps", type=click.IntRange(min=1), help="Optimizer steps (default per preset).")
@click.option(
    "--seed", type=int, default=0, show_default=True, help="Seed of the initialisation and batches."
)
@count_option("--threads", default=1, help="CPU threads for torch.")
@click.option("--corpus", "corpus_root", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Train on the .py files under this directory instead of the standard library.")  # fmt: skip
@click.option("--cache-dir", type=click.Path(file_okay=False, path_type=Path), default=CACHE_DIR,
              show_default=".cache/training of this checkout", help="Cache of trained checkpoints (kimi-engine train's).")  # fmt: skip
@results_option
@click.option("--no-regenerate", is_flag=True, help="Write the receipt only; skip RESULTS.md and figures.")
def training_command(
    preset_name, steps, seed, threads, corpus_root, cache_dir, results, no_regenerate
) -> None:
    """Train a checkpoint on the stdlib's source and record how training went as a receipt."""
    torch.set_num_threads(threads)
    recipe = recipe_for(preset_name, seed=seed, steps=steps)
    path, cached = trained_checkpoint(recipe, cache_dir, corpus_root=corpus_root, progress=True)
    record = json.loads((path / TRAINING_RECORD).read_text())
    derived = {k: record[k] for k in ("heldout_ppl", "heldout_bits_per_byte", "heldout_nll_nats", "wall_seconds",
                                      "steps", "tokens", "uniform_ppl")}  # fmt: skip
    receipt = write_receipt(
        "training",
        f"{preset_name}.seed{seed}.steps{recipe.steps}",
        config={
            "preset": preset_name,
            "recipe": record["recipe"],
            "corpus": record["corpus"],
            "router_bias": record["router_bias"],
            "checkpoint": str(path),
            "weights_sha256": Checkpoint.open(path).weights_sha256(),
            "cached": cached,
            "machine": record["machine"],
        },
        samples={"loss_nats": record["loss_curve"]},
        units={
            "loss_nats": "nats/token",
            "heldout_ppl": "perplexity",
            "heldout_bits_per_byte": "bits/byte",
            "heldout_nll_nats": "nats/token",
            "wall_seconds": "s",
            "steps": "steps",
            "tokens": "tokens",
            "uniform_ppl": "perplexity",
        },
        derived=derived,
        notes="trained weights (kimi-engine train); loss_nats: training loss of every step"
        + ("; taken from the cache: wall time is that of the run that trained it" if cached else ""),
        results_dir=results,
    )
    click.echo(f"wrote {receipt}")
    if not no_regenerate:
        regenerate(results)
