"""``kimi-engine quantize`` and ``kimi-engine verify``."""

from __future__ import annotations

import sys
from pathlib import Path

import click
import torch

from common.click_options import count_option, text_option
from engine.codec import ROUNDINGS, SCALE_DTYPES, CodecError
from engine.progress import stderr_progress
from engine.quant.build import build_artifact
from engine.quant.manifest import ArtifactError
from engine.quant.plan import HEAD_PRECISIONS, PLANS, PlanError, make_plan
from engine.quant.verify import verify_artifact


def _plan_help() -> str:
    return "; ".join(f"{name}: {plan.description}" for name, plan in PLANS.items())


@click.command(
    "quantize",
    help=f"""Quantise checkpoint SRC into artifact directory DST.

Streams SRC (HF safetensors, sharded or not) one tensor at a time into safetensors shards plus
manifest.json (plan, codec, shapes, per-shard and per-tensor sha256, source hashes); routed experts
are stacked per layer into banks with the shared expert as the last slot. See docs/INT4.md.

Plans: {_plan_help()}.""",
)
@click.argument("src", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("dst", type=click.Path(path_type=Path))
@click.option("--plan", "plan_name", type=click.Choice(list(PLANS)), default="default", show_default=True,
              help="Quantisation plan: which tensors become INT4/INT8 and at what group size (docs/INT4.md).")  # fmt: skip
@click.option("--group-size", type=int, help="Inputs per scale (power of two >= 16; plan default 32).")
@click.option("--lm-head", type=click.Choice(HEAD_PRECISIONS), help="Override the plan's LM head precision.")
@click.option("--scale-dtype", type=click.Choice(sorted(SCALE_DTYPES)), help="Override the scale dtype.")
@click.option("--rounding", type=click.Choice(ROUNDINGS),
              help="Override how group scales are chosen (same layout and size): the signed extreme / -(qmax+1), "
              "as llama.cpp's Q4_0 (signed, the plans' default); absmax / qmax; or a search minimising each "
              "group's squared error (mse).")  # fmt: skip
@count_option("--shard-mib", default=2048, help="Output shard size.")
@text_option("--device", default="auto", help="Where to quantise: cpu, cuda, or auto.")
@click.option("--force", is_flag=True, help="Replace DST if it is an existing artifact.")
@click.option(
    "--verify/--no-verify", default=True, show_default=True, help="Verify the artifact once written."
)
def quantize(src, dst, plan_name, group_size, lm_head, scale_dtype, rounding, shard_mib, device, force, verify) -> None:  # fmt: skip
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        plan = make_plan(
            plan_name, group_size=group_size, lm_head=lm_head, scale_dtype=scale_dtype, rounding=rounding
        )
        manifest = build_artifact(
            src,
            dst,
            plan,
            max_shard_bytes=shard_mib * 2**20,
            device=device,
            overwrite=force,
            progress=stderr_progress,
        )
    except (ArtifactError, PlanError, CodecError) as error:
        raise click.ClickException(str(error)) from error
    source_bytes = manifest["source"]["tensor_bytes"]
    stored = manifest["stored_tensor_bytes"]
    quantised = sum(
        len(e["sources"]) for e in manifest["tensors"].values() if e["precision"] in ("int4", "int8")
    )
    click.echo(
        f"wrote {dst}: {len(manifest['shards'])} shards, {quantised} of {manifest['source']['tensor_count']} "
        f"source tensors quantised, {source_bytes:,} -> {stored:,} bytes ({source_bytes / stored:.2f}x smaller)"
    )
    if verify:
        _report(verify_artifact(dst, source=src, progress=stderr_progress))


@click.command("verify")
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--source",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Checkpoint to round-trip against (default: the one recorded in the manifest, if present).",
)
@click.option(
    "--no-source", is_flag=True, help="Skip the round trip; only check hashes and self-consistency."
)
@count_option("--sample", default=16, minimum=0, help="Source tensors (or bank slots) to round-trip.")
@click.option("--all", "check_all", is_flag=True, help="Round-trip every tensor instead of a sample.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the sample.")
def verify(directory, source, no_source, sample, check_all, seed) -> None:
    """Re-hash every shard of artifact DIRECTORY and check round-trip error bounds on a sample.

    A flipped byte, a swapped or missing tensor, or an out-of-bound round trip is named; exits 1 then.
    """
    report = verify_artifact(
        directory,
        source=source,
        use_recorded_source=not no_source,
        sample=None if check_all else sample,
        seed=seed,
        progress=stderr_progress,
    )
    _report(report)


def _report(report) -> None:
    click.echo(report.summary())
    if not report.ok:
        sys.exit(1)
