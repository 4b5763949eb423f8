"""Measured memory bandwidth of a device: the roofline's denominator, measured one way per device.

On a GPU: `dst.copy_(src)` of 1 GiB buffers under `triton.testing.do_bench` (which flushes L2 between
calls), the one denominator of every GPU receipt (kernels and decode alike). On the CPU: a copy of a buffer
much larger than the last-level cache, rotating between several buffers so no cache serves a repeat,
timed with perf_counter. Bytes moved = 2 × size (read + write).
"""

from __future__ import annotations

import time

import torch

GPU_COPY_BYTES = 1 << 30


def copy_bandwidth_gbs(
    device: str = "cpu", size_mib: int = 256, buffers: int = 3, repeats: int = 10
) -> list[float]:
    """GB/s (1e9 bytes/s) of timed copies; the caller quotes the median. On CUDA the size and count are
    fixed (GPU_COPY_BYTES, do_bench's own repeats) so every GPU receipt shares one denominator."""
    if str(device).startswith("cuda"):
        return _gpu_copy_gbs(device)
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


def _gpu_copy_gbs(device: str) -> list[float]:
    import triton.testing

    src = torch.empty(GPU_COPY_BYTES, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    times_ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=500, return_mode="all")
    return [2 * GPU_COPY_BYTES / (t * 1e-3) / 1e9 for t in times_ms]


def _sync(device: str) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()
