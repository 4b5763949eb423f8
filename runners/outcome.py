"""What a runner prints when it is done: a short table of what it just measured, the receipt paths,
and a warning when the machine was busy with other work while it ran (docs/METHODS.md)."""

from __future__ import annotations

from pathlib import Path

import click

from harness.receipt import load_receipt

MAX_FIGURES = 5  # per receipt: the derived figures first (ratios, rooflines), then sample medians


def _figures(receipt: dict) -> list[str]:
    units = receipt.get("units", {})
    shown = []
    derived = receipt.get("derived", {})
    # Byte counts (sizes, not results) go last: a table of what was measured comes first.
    for key in sorted(derived, key=lambda k: units.get(k) == "B"):
        value = derived[key]
        if isinstance(value, int | float) and not isinstance(value, bool):
            shown.append(f"{key} {value:.4g}{' ' + units[key] if key in units else ''}")
    for key, stats in receipt.get("summary", {}).items():
        if len(shown) >= MAX_FIGURES:
            break
        shown.append(f"{key} {stats['median']:.4g}{' ' + units[key] if key in units else ''} (median)")
    return shown[:MAX_FIGURES]


def report(written: list[Path]) -> None:
    """The result table of the receipts a runner wrote, then their paths, then any busy-machine warning."""
    if not written:
        click.echo("no receipts were written")
        return
    receipts = [load_receipt(path) for path in written]
    width = max(len(r["name"]) for r in receipts)
    hardware = receipts[0]["hardware"]["hardware_id"]
    click.echo(f"\nresults on {hardware}:")
    for receipt in receipts:
        click.echo(f"  {receipt['name']:<{width}}  " + ", ".join(_figures(receipt)))
    click.echo("receipts:")
    for path in written:
        click.echo(f"  {path}")
    busy = [r for r in receipts if r["hardware"].get("load", {}).get("disturbed")]
    if busy:
        load = busy[0]["hardware"]["load"]
        names = ", ".join(f"{b['name']} {b['cpu_pct']:g}%" for b in load["busy_others"][:4]) or "none seen"
        click.echo(
            f"WARNING: the machine was busy with other work during {len(busy)} of {len(receipts)} receipts "
            f"(other processes {load['others_cpu_pct']:g}% of a core: {names}; load average "
            f"{load['loadavg'][0]:g}; steal {load['cpu_steal_pct']:g}%). Their numbers may be low: rerun on "
            "a quiet machine before quoting them.",
            err=True,
        )
