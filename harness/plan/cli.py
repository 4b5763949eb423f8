"""The `kimi-harness plan` command: its options and its text report."""

from __future__ import annotations

import json

import click

from harness.plan.ceilings import DEFAULT_RESERVE, Estimate
from harness.plan.hardware import LINKS, SPEC_HELP
from harness.plan.models import GB, MODELS, QUANT_NAMES


def _gb(value: float) -> str:
    return f"{value / GB:,.2f} GB"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


def report_lines(e: Estimate) -> list[str]:
    lines = [
        f"{e.model} ({e.quant}) on {e.hardware}: context {e.context} tokens, batch {e.batch}, "
        f"weights on {e.layout}"
    ]
    parts = ", ".join(f"{k.replace('_', ' ')} {_gb(v)}" for k, v in e.need.items())
    verdict = "fits" if e.fits else "does not fit"
    lines.append(
        f"memory: {verdict}: the devices need {_gb(e.device_need)} of {_gb(e.device_memory)} ({parts})"
    )
    if e.host_need:
        lines.append(f"host RAM: the routed experts need {_gb(e.host_need)} of {_gb(e.host_memory)}")
    if e.decode_tok_s is None:
        lines.append("decode ceiling: none (does not fit)")
    else:
        terms = ", ".join(f"{k} {_ms(v)}" for k, v in e.decode_terms_s.items() if v)
        lines.append(
            f"decode ceiling: {e.decode_tok_s:,.2f} tok/s at batch {e.batch} "
            f"({e.step_bytes / GB:,.3f} GB read per step; {terms})"
        )
    if e.prefill_tok_s is None:
        lines.append(f"prefill compute bound: not computed ({e.prefill_note})")
    else:
        lines.append(f"prefill compute bound: {e.prefill_tok_s:,.0f} tok/s ({e.prefill_note})")
    lines += ["sources:", *(f"  {s}" for s in e.sources)]
    return lines


@click.command("plan")
@click.option("--model", "model_name", required=True, type=click.Choice(list(MODELS)), help="The model.")
@click.option("--hardware", "spec", required=True, help=SPEC_HELP)
@click.option(
    "--quant",
    type=click.Choice(QUANT_NAMES),
    help="Weight format: kimi-linear-48b int4 (default), int4-int8-head, int4-int4-head, bf16; "
    "kimi-k3 mxfp4 (default, the release), ud-iq1_s.",
)
@click.option("--context", default=4096, show_default=True, help="Tokens in each sequence's cache.")
@click.option("--batch", default=1, show_default=True, help="Sequences decoded together.")
@click.option("--per-node", type=int, help="Devices per node [default: the device's usual node, 8 or 72].")
@click.option(
    "--network", type=click.Choice(list(LINKS)), help="Network between nodes [default: the device's usual]."
)
@click.option(
    "--reserve-gb",
    default=DEFAULT_RESERVE / GB,
    show_default=True,
    help="Memory kept per device for the CUDA context and allocator slack (an assumption).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the estimate as JSON.")
def plan_command(model_name, spec, quant, context, batch, per_node, network, reserve_gb, as_json) -> None:
    """Whether a model's weights and cache fit on hardware, and its decode and prefill ceilings.

    Computed from the model's architecture (harness/plan/models.py) and the vendors' published figures
    (harness/plan/hardware.py, each with its source); nothing is measured. Ceilings are upper bounds.
    """
    from harness.plan import plan

    try:
        e = plan(
            model_name, spec, quant=quant, context=context, batch=batch, per_node=per_node,
            network=network, reserve=reserve_gb * GB,
        )  # fmt: skip
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    click.echo(json.dumps(e.as_dict(), indent=2) if as_json else "\n".join(report_lines(e)))
