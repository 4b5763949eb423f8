"""`kimi-engine train`: a trained checkpoint in the real layout, cached by recipe under `.cache/training/`."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import click
import torch

from engine.model.loading import INDEX_FILE, TRAINING_RECORD, parameter_for
from engine.model.presets import PRESETS
from engine.model.synthetic_tokenizer import write_synthetic_tokenizer
from engine.model.tokenizer import TIKTOKEN_FILE, Tokenizer
from engine.progress import progress_bar
from engine.runtime.loader import CHAT_TEMPLATE_FILE
from engine.server.chat_template import SYNTHETIC_CHAT_TEMPLATE
from engine.synth import write_checkpoint
from engine.training.corpus import Corpus, build_corpus
from engine.training.trainer import DEFAULT_RECIPES, TRAINER_VERSION, Recipe, evaluate, recipe_for, train

CACHE_DIR = Path(__file__).resolve().parents[2] / ".cache" / "training"
LOG_EVERY = 10  # steps between progress lines when stderr is not a terminal
HELDOUT_TEXT = "heldout.txt"  # the held-out files, concatenated: what accuracy runners evaluate on


def trained_checkpoint(
    recipe: Recipe, cache_dir: Path = CACHE_DIR, *, corpus_root: Path | None = None, progress: bool = False
) -> tuple[Path, bool]:
    """The cached checkpoint of `recipe` (path, True), or train, write and cache it (path, False)."""
    with tempfile.TemporaryDirectory() as tmp:
        # the tokenizer the preset's synthetic checkpoints ship (write_checkpoint writes it again)
        write_synthetic_tokenizer(tmp, PRESETS[recipe.preset].bos_token_id or 256)
        tokenizer = Tokenizer.from_dir(tmp)
        tokenizer_sha = hashlib.sha256((Path(tmp) / TIKTOKEN_FILE).read_bytes()).hexdigest()
        corpus = build_corpus(Path(tmp), cache_dir, corpus_root)
    target = cache_dir / f"{recipe.preset}-{recipe.key(corpus.sha256, tokenizer_sha)}"
    if (target / INDEX_FILE).exists() and (target / TRAINING_RECORD).exists():
        return target, True
    shutil.rmtree(target, ignore_errors=True)
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    _train_into(recipe, corpus, tokenizer, partial, progress=progress)
    partial.rename(target)
    return target, False


def _train_into(recipe: Recipe, corpus: Corpus, tokenizer: Tokenizer, out: Path, *, progress: bool) -> None:
    length = recipe.steps if recipe.steps is not None else round(recipe.seconds)
    label = f"training {recipe.preset}"
    with progress_bar(length=length, label=label, show=progress, item_show_func=lambda s: s) as bar:

        def on_step(step: int, loss: float, elapsed: float) -> None:
            done = step if recipe.steps is not None else min(length, int(elapsed))
            bar.update(done - bar.pos, f"step {step} loss {loss:.3f}")
            if progress and not sys.stderr.isatty() and step % LOG_EVERY == 0:  # a log file gets lines
                click.echo(f"step {step} loss {loss:.4f} elapsed {elapsed:.0f}s", err=True)

        run = train(recipe, corpus, on_step=on_step)
    if progress:
        click.echo("measuring held-out perplexity ...", err=True)
    heldout = evaluate(run.model, corpus.heldout_ids, tokenizer, recipe.seq_len, recipe.eval_tokens)
    record = {
        "weights": "trained",
        "writer": "kimi-engine train",
        "trainer_version": TRAINER_VERSION,
        "recipe": dataclasses.asdict(recipe),
        "router_bias": "auxiliary-loss-free update: bias_i += rate * sign(mean load - load_i) per step",
        "corpus": corpus.describe(),
        "steps": run.steps,
        "tokens": run.tokens,
        "wall_seconds": run.wall_seconds,
        "loss_curve": run.losses,
        "uniform_ppl": run.model.config.vocab_size,
        **heldout,
        "heldout_text": HELDOUT_TEXT,
        "machine": {
            "platform": platform.platform(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        },
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    write_checkpoint(
        run.model.config,
        out,
        lambda spec: parameter_for(run.model, spec.name).detach(),
        extra_files={
            TRAINING_RECORD: json.dumps(record, indent=2) + "\n",
            HELDOUT_TEXT: corpus.heldout_text,
            # the synthetic tokenizer's template, so `kimi-engine serve --weights` serves it as chat
            CHAT_TEMPLATE_FILE: SYNTHETIC_CHAT_TEMPLATE,
        },
        progress=progress,
    )


@click.command("train")
@click.option(
    "--config", "preset_name", type=click.Choice(sorted(DEFAULT_RECIPES)), required=True, help="Model size."
)
@click.option(
    "--steps", type=click.IntRange(min=1), help="Optimizer steps (deterministic; default per preset)."
)
@click.option(
    "--minutes",
    type=click.FloatRange(min=0, min_open=True),
    help="Train for this wall time instead of a step count (the result then depends on machine load).",
)
@click.option(
    "--seed", type=int, default=0, show_default=True, help="Seed of the initialisation and batches."
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    help="Copy the checkpoint here (default: only the cache entry, whose path is printed).",
)
@click.option("--batch-size", type=click.IntRange(min=1), help="Sequences per step (default per preset).")
@click.option(
    "--seq-len", type=click.IntRange(min=2), help="Tokens per training sequence (default per preset)."
)
@click.option(
    "--lr", type=click.FloatRange(min=0, min_open=True), help="Peak learning rate (default per preset)."
)
@click.option(
    "--threads", type=click.IntRange(min=1), help="CPU threads for torch (default: torch's choice)."
)
@click.option(
    "--corpus",
    "corpus_root",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Train on the .py files under this directory instead of the interpreter's standard library.",
)
@click.option(
    "--cache-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=CACHE_DIR,
    show_default=".cache/training of this checkout",
    help="Where trained checkpoints and the encoded corpus are cached, keyed by recipe.",
)
def train_command(
    preset_name, steps, minutes, seed, out, batch_size, seq_len, lr, threads, corpus_root, cache_dir
) -> None:
    """Train a Kimi-Linear of the given size on the Python standard library's source (next-token loss).

    The corpus is the running interpreter's stdlib .py files (sorted; 1 in 20 held out by a hash of the
    path), tokenised with the BPE the preset's synthetic checkpoints ship (trained here on the same
    files' training split, cached). The model is the engine's own modules
    (chunked KDA, MLA, MoE with the router's correction bias balanced the auxiliary-loss-free way); AdamW,
    warm-up + cosine schedule, gradient clipping. The checkpoint has the real layout plus training.json
    (corpus sha256, steps, tokens, wall time, loss curve, held-out perplexity and bits per byte) and
    heldout.txt. A recipe already trained is taken from the cache, not retrained.
    """
    if steps is not None and minutes is not None:
        raise click.UsageError("give --steps or --minutes, not both")
    if threads:
        torch.set_num_threads(threads)
    recipe = recipe_for(preset_name, seed=seed, steps=steps, minutes=minutes, batch_size=batch_size,
                        seq_len=seq_len, lr=lr)  # fmt: skip
    if out is not None and out.exists() and any(out.iterdir()):
        raise click.ClickException(f"{out} exists and is not empty; refusing to overwrite it")
    path, cached = trained_checkpoint(recipe, cache_dir, corpus_root=corpus_root, progress=True)
    record = json.loads((path / TRAINING_RECORD).read_text())
    click.echo(
        f"{'cached' if cached else 'trained'}: {path} ({record['steps']} steps, {record['tokens']:,} tokens, "
        f"held-out perplexity {record['heldout_ppl']:.2f}, {record['heldout_bits_per_byte']:.3f} bits/byte; "
        f"uniform {record['uniform_ppl']})"
    )
    if out is not None:
        shutil.copytree(path, out, dirs_exist_ok=True)
        click.echo(f"copied to {out}")
