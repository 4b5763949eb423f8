"""``kimi-engine kernels``: operations, variants, shipped defaults, and what is selected now."""

from __future__ import annotations

import os

import click


@click.command("kernels")
@click.option(
    "--device",
    type=click.Choice(["auto", "cpu", "cuda"]),
    default="auto",
    show_default=True,
    help="Device to resolve the selection for (auto: cuda when available).",
)
@click.option(
    "--compile",
    "targets",
    metavar="sm_90,sm_89",
    default=None,
    help="Instead of listing: compile the Triton launches the engine makes at the full Kimi-Linear shapes "
    "(batches 1 and 8) for these CUDA targets with the installed Triton (no GPU needed) and report "
    "registers, spills, shared memory, weight-load width and barriers in the K loop; exits 1 on a defect.",
)
def kernels(device: str, targets: str | None) -> None:
    """List kernel operations, their variants, the shipped defaults and the variant selected now.

    Selection order: explicit argument (code), then KIMI_KERNELS=op=variant,..., then the shipped
    default for the device. A variant that cannot run on the device is reported with the reason.
    """
    if targets is not None:
        _compile(targets)
        return
    from engine.kernels import defaults, registry

    dev = registry.device_type(None if device == "auto" else device)
    env = os.environ.get(registry.ENV_VAR, "")
    click.echo(f"device: {dev}    {registry.ENV_VAR}={env or '(unset)'}")
    try:
        registry.env_selection()
    except registry.KernelSelectionError as error:
        raise click.ClickException(str(error)) from error
    problems = 0
    for op in registry.operations():
        click.echo(f"\n{op.name}: {op.description}")
        for v in registry.variants(op.name):
            marks = [
                f"default({d})"
                for d, table in defaults.SHIPPED_DEFAULTS.items()
                if table.get(op.name) == v.name
            ]
            reason = registry.unavailable_reason(v, dev)
            status = "runs here" if reason is None else f"unavailable here: {reason}"
            click.echo(f"  {v.name:<14} {v.backend:<7} {' '.join(marks):<28} {status}")
            click.echo(f"  {'':<14} {v.description}")
        try:
            chosen = registry.select(op.name, device=dev)
            click.echo(f"  -> selected on {dev}: {chosen.variant.name} ({chosen.source})")
        except (registry.KernelUnavailable, registry.KernelSelectionError) as error:
            problems += 1
            click.echo(f"  -> NOT RUNNABLE on {dev}: {error}")
    if problems:
        raise SystemExit(1)


def _compile(targets: str) -> None:
    from engine.kernel_tools import aot
    from engine.model import preset

    try:
        archs = aot.parse_targets(targets)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--compile") from None
    defects = 0
    for arch in archs:
        click.echo(f"== sm_{arch} (Triton {aot.triton.__version__})")
        try:
            reports = aot.compile_for(preset("full"), arch)
        except RuntimeError as error:
            raise click.ClickException(str(error)) from None
        for report in reports:
            click.echo(report.describe())
            defects += bool(report.defects)
    if defects:
        click.echo(f"{defects} compiled kernel(s) with defects (see DEFECTS above)", err=True)
        raise SystemExit(1)
