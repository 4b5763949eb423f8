"""Measured memory bandwidth of a device: the roofline's denominator.

A device-to-device copy of a buffer much larger than the last-level cache, rotating between several
buffers so no cache serves a repeat; bytes moved = 2 × size (read + write).
"""

from __future__ import annotations

import time

import torch


def copy_bandwidth_gbs(
    device: str = "cpu", size_mib: int = 256, buffers: int = 3, repeats: int = 10
) -> list[float]:
    """GB/s (1e9 bytes/s) of `repeats` timed copies; the caller quotes the median."""
    n = size_mib << 20
    sources = [torch.randint(0, 255, (n,), dtype=torch.uint8, device=device) for _ in range(buffers)]
    targets = [torch.empty_like(s) for s in sources]
    samples = []
    for i in range(repeats + 1):
        src, dst = sources[i % buffers], targets[(i + 1) % buffers]
        _sync(device)
        start = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        if i:  # the first copy pays for page faults: untimed warm-up
            samples.append(2 * n / (time.perf_counter() - start) / 1e9)
    return samples


def _sync(device: str) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()
