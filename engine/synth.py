"""Synthetic checkpoints: the real file layout, names and dtypes, filled with random values at realistic scales.

Decode speed does not depend on weight values, so a synthetic `full` checkpoint (or a model filled in
memory with `init_synthetic_weights`) stands in for the real 48B weights in benchmarks; results obtained
with one must say "synthetic weights". Checkpoints written here carry a `synthetic.json` marker.

Initialisation (per tensor, from a seed derived from the run seed and the tensor name):
- projections: N(0, 1/fan_in); output projections (o_proj, down_proj, w2) half that std; LM head twice;
- embeddings N(0, 0.5^2); norm weights 1 + N(0, 0.05^2); router bias N(0, 0.05^2);
- short convolutions U(-1/sqrt(K), 1/sqrt(K)) (PyTorch's Conv1d default);
- A_log = log U(1, 16) and dt_bias = softplus^-1(exp U(log 1e-3, log 1e-1)) (fla's KDA initialisation).
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click
import torch
from safetensors.torch import save_file

from engine.model.checkpoint_spec import TensorSpec, checkpoint_tensors
from engine.model.config import KimiLinearConfig
from engine.model.loading import INDEX_FILE, SYNTHETIC_MARKER, parameter_for
from engine.model.presets import PRESETS
from engine.model.synthetic_tokenizer import write_synthetic_tokenizer
from engine.progress import progress_bar

if TYPE_CHECKING:
    from engine.model.model import KimiLinearForCausalLM

MAX_SHARD_BYTES = 4 << 30
_OUTPUT_PROJECTIONS = ("o_proj.weight", "down_proj.weight", "w2.weight")


def tensor_seed(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def synthetic_tensor(spec: TensorSpec, seed: int, *, device: torch.device | str = "cpu") -> torch.Tensor:
    """One tensor of the synthetic checkpoint, in its checkpoint dtype, on `device`."""
    gen = torch.Generator(device=device).manual_seed(tensor_seed(seed, spec.name))

    def normal(std: float) -> torch.Tensor:
        return torch.randn(spec.shape, generator=gen, device=device) * std

    def uniform(low: float, high: float) -> torch.Tensor:
        return torch.rand(spec.shape, generator=gen, device=device) * (high - low) + low

    name = spec.name
    if name.endswith("A_log"):
        t = uniform(1.0, 16.0).log()
    elif name.endswith("dt_bias"):
        dt = uniform(math.log(1e-3), math.log(1e-1)).exp()
        t = dt + torch.log(-torch.expm1(-dt))  # inverse softplus
    elif name.endswith("norm.weight") or name.endswith("layernorm.weight"):
        t = 1.0 + normal(0.05)
    elif name.endswith("e_score_correction_bias"):
        t = normal(0.05)
    elif name.endswith("conv1d.weight"):
        bound = spec.shape[-1] ** -0.5
        t = uniform(-bound, bound)
    elif name == "model.embed_tokens.weight":
        t = normal(0.5)
    else:
        std = spec.shape[-1] ** -0.5
        if name == "lm_head.weight":
            std *= 2.0
        elif name.endswith(_OUTPUT_PROJECTIONS):
            std *= 0.5
        t = normal(std)
    return t.to(spec.dtype)


def plan_shards(specs: list[TensorSpec], max_shard_bytes: int) -> list[list[TensorSpec]]:
    """Group tensors, in order, into shards of at most `max_shard_bytes` (a bigger tensor gets its own)."""
    shards: list[list[TensorSpec]] = [[]]
    size = 0
    for spec in specs:
        if shards[-1] and size + spec.nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(spec)
        size += spec.nbytes
    return shards


def default_shard_bytes(specs: list[TensorSpec]) -> int:
    """At most 4 GiB, and at least two shards so the index is always exercised."""
    total = sum(s.nbytes for s in specs)
    return min(MAX_SHARD_BYTES, max(1, math.ceil(total / 2)))


def shard_file_name(i: int, n: int) -> str:
    return f"model-{i + 1:05d}-of-{n:05d}.safetensors"


def write_checkpoint(
    config: KimiLinearConfig,
    out: str | Path,
    tensor_of: Callable[[TensorSpec], torch.Tensor],
    *,
    extra_files: dict[str, str],
    max_shard_bytes: int | None = None,
    progress: bool = False,
) -> Path:
    """Write config, sharded safetensors + index, the synthetic BPE tokenizer and `extra_files` (name -> text)
    into `out`; `tensor_of(spec)` gives each tensor in its checkpoint dtype. Holds at most one shard in
    memory. Used for synthetic (`kimi-engine synth`) and trained (`kimi-engine train`) checkpoints."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise click.ClickException(f"{out} exists and is not empty; refusing to overwrite it")
    specs = checkpoint_tensors(config)
    shards = plan_shards(specs, max_shard_bytes or default_shard_bytes(specs))
    out.mkdir(parents=True, exist_ok=True)
    weight_map: dict[str, str] = {}
    total = sum(s.nbytes for s in specs)
    with progress_bar(length=total, label=f"writing {out.name}", show=progress) as bar:
        for i, shard in enumerate(shards):
            file_name = shard_file_name(i, len(shards))
            tensors = {}
            for spec in shard:
                tensors[spec.name] = tensor_of(spec).to(spec.dtype).contiguous()
                weight_map[spec.name] = file_name
                bar.update(spec.nbytes)
            save_file(tensors, str(out / file_name), metadata={"format": "pt"})
            del tensors
    (out / "config.json").write_text(json.dumps(config.to_hf_dict(), indent=2) + "\n")
    write_synthetic_tokenizer(out, config.bos_token_id or 256)
    for name, text in extra_files.items():
        (out / name).write_text(text)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")  # last: a partial dir has no index
    return out


def write_synthetic_checkpoint(
    config: KimiLinearConfig,
    out: str | Path,
    *,
    seed: int,
    preset_name: str | None = None,
    max_shard_bytes: int | None = None,
    progress: bool = False,
) -> Path:
    """A checkpoint of synthetic weights (`synthetic_tensor`) with the synthetic marker."""
    marker = {
        "synthetic": True,
        "note": "synthetic weights: random values at realistic scales, not a trained model",
        "preset": preset_name,
        "seed": seed,
        "writer": "kimi-engine synth",
    }
    return write_checkpoint(
        config,
        out,
        lambda spec: synthetic_tensor(spec, seed),
        extra_files={SYNTHETIC_MARKER: json.dumps(marker, indent=2) + "\n"},
        max_shard_bytes=max_shard_bytes,
        progress=progress,
    )


@torch.no_grad()
def init_synthetic_weights(model: KimiLinearForCausalLM, seed: int) -> None:
    """Fill a model in place with synthetic weights, generated on the model's own device (for benchmarks
    at the full shapes without writing 98 GB to disk). Same distributions as the writer; the values
    equal the writer's only when generated on the CPU."""
    device = next(model.parameters()).device
    for spec in checkpoint_tensors(model.config):
        parameter_for(model, spec.name).copy_(synthetic_tensor(spec, seed, device=device))


def _describe_plan(config: KimiLinearConfig, shards: list[list[TensorSpec]]) -> str:
    specs = [s for shard in shards for s in shard]
    params = sum(s.nbytes // s.dtype.itemsize for s in specs)
    dtypes: dict[str, int] = {}
    for s in specs:
        key = str(s.dtype).removeprefix("torch.")
        dtypes[key] = dtypes.get(key, 0) + 1
    lines = [
        f"layers: {config.num_hidden_layers} (MLA at zero-based {list(config.full_attn_layers)})",
        f"tensors: {len(specs)} ({', '.join(f'{n} {d}' for d, n in sorted(dtypes.items()))})",
        f"parameters: {params:,}",
        f"bytes: {sum(s.nbytes for s in specs):,} in {len(shards)} shard(s)",
    ]
    return "\n".join(lines)


@click.command("synth")
@click.option(
    "--config", "preset_name", type=click.Choice(sorted(PRESETS)), required=True, help="Model size."
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for the random weights.")
@click.option(
    "--out", type=click.Path(file_okay=False, path_type=Path), help="Checkpoint directory to create."
)
@click.option(
    "--shard-size-mb",
    type=click.IntRange(min=1),
    help="Maximum shard size in MB (default: 4 GiB, at least 2 shards).",
)
@click.option("--dry-run", is_flag=True, help="Print the tensor/shard plan without writing anything.")
def synth_command(
    preset_name: str, seed: int, out: Path | None, shard_size_mb: int | None, dry_run: bool
) -> None:
    """Write a synthetic Kimi-Linear checkpoint (real names, shapes and dtypes; random weights).

    `tiny` runs a forward pass in well under a second (tests); `small` is a few hundred MB (CPU
    benchmarks); `full` has the real 48B shapes (98 GB of BF16: use --dry-run to inspect the plan, or
    engine.synth.init_synthetic_weights to fill a model in memory). Anything measured with these weights
    must be reported as measured on synthetic weights.
    """
    config = PRESETS[preset_name]
    specs = checkpoint_tensors(config)
    max_bytes = shard_size_mb * 1_000_000 if shard_size_mb else default_shard_bytes(specs)
    shards = plan_shards(specs, max_bytes)
    if dry_run:
        click.echo(_describe_plan(config, shards))
        return
    if out is None:
        raise click.UsageError("--out is required unless --dry-run is given")
    total = sum(s.nbytes for s in specs)
    existing = next((p for p in (out, *out.parents) if p.exists()), Path("."))
    free = shutil.disk_usage(existing).free
    if free < total:
        raise click.ClickException(f"{total:,} bytes needed but only {free:,} free under {out}")
    write_synthetic_checkpoint(
        config, out, seed=seed, preset_name=preset_name, max_shard_bytes=max_bytes, progress=True
    )
    click.echo(f"wrote {out} ({total:,} bytes of tensors, {len(shards)} shard(s), synthetic weights)")
