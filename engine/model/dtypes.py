"""The default compute dtype per device: BF16 on a GPU and on CPUs with native BF16 arithmetic, else FP32.

On a CPU with avx512_bf16 or AMX-BF16, torch's BF16 GEMV reads half the bytes of FP32 at full speed, and
decode measured faster than FP32 (`python -m runners decode --dtype fp32` vs `--dtype bf16`); without those
instructions BF16 is emulated and FP32 is the faster choice. FP32 stays selectable everywhere.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


@functools.cache
def cpu_has_native_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether the CPU advertises BF16 arithmetic (Linux: the flags in /proc/cpuinfo; elsewhere: no)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return False
    flags = next(
        (line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), []
    )
    return any(flag in flags for flag in BF16_CPU_FLAGS)


def default_dtype(device: torch.device | str) -> torch.dtype:
    """BF16 on a GPU and on a CPU with native BF16, FP32 on other CPUs."""
    if torch.device(device).type == "cuda" or cpu_has_native_bf16():
        return torch.bfloat16
    return torch.float32
