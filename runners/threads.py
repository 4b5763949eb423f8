"""`--threads` for every runner: the CPU threads of torch (and of llama.cpp, `-t`), default all cores."""

from __future__ import annotations

import os

import click
import torch


def all_cores() -> int:
    """The cores this process may run on (its affinity mask, where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def threads_option(what: str = "torch"):
    """The `--threads` option, the same in every runner."""
    return click.option(
        "--threads",
        type=click.IntRange(1),
        default=None,
        help=f"CPU threads for {what} (recorded in the receipts). Default: all cores ({all_cores()} here).",
    )


def apply_threads(threads: int | None) -> int:
    """Set torch's intra-op threads to `threads` (None: all cores); returns the count now in use."""
    torch.set_num_threads(threads or all_cores())
    return torch.get_num_threads()
