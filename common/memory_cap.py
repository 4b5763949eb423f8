"""Memory caps: run under a stated limit and report the peak (the engine enforces it, receipts record it).

On a GPU the cap is the allocator's (`torch.cuda.set_per_process_memory_fraction`); the CUDA context is
outside that cap, so the whole-process figure from NVML is recorded as well. On the CPU the cap is on
resident memory, watched by a sampling thread. Going over the cap fails the run with a message naming it.
"""

from __future__ import annotations

import os
import threading

import psutil

GIB = 1 << 30
# The cap `kimi-engine serve` and the runners plan under unless --memory-cap-gib says otherwise: on a GPU
# the allocator's, on the CPU resident memory (the engine also refuses a plan larger than physical RAM).
DEFAULT_CAP_GIB = {"cuda": 32.0, "cpu": 16.0}


def default_cap_gib(device: str) -> float:
    """The default memory cap on `device` ("cpu", "cuda", "cuda:N")."""
    return DEFAULT_CAP_GIB["cuda" if str(device).startswith("cuda") else "cpu"]


class MemoryCapExceeded(RuntimeError):
    """The run used more memory than its cap allows."""


class MemoryCap:
    """`with MemoryCap(32, device="cuda") as cap: ...; cap.report()`.

    `cap_gib=None` measures peaks without enforcing a limit.
    """

    def __init__(self, cap_gib: float | None, device: str = "cpu", poll_s: float = 0.01):
        self.cap_gib = cap_gib
        self.device = str(device)
        self.poll_s = poll_s
        self._peak_rss = 0
        self._baseline_rss = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._exceeded: str | None = None
        self._process = psutil.Process(os.getpid())
        self._previous_fraction: tuple[int, float] | None = None  # (device index, fraction) to restore

    @property
    def on_gpu(self) -> bool:
        return self.device.startswith("cuda")

    def __enter__(self) -> MemoryCap:
        self._baseline_rss = self._peak_rss = self._process.memory_info().rss
        if self.on_gpu:
            self._enter_gpu()
        self._thread = threading.Thread(target=self._watch_rss, name="memory-cap", daemon=True)
        self._thread.start()
        return self

    def _enter_gpu(self) -> None:
        import torch

        index = torch.device(self.device).index or 0
        torch.cuda.reset_peak_memory_stats(index)
        if self.cap_gib is not None:
            total = torch.cuda.get_device_properties(index).total_memory
            if self.cap_gib * GIB > total:
                raise MemoryCapExceeded(
                    f"memory cap {self.cap_gib} GiB is larger than the device's {total / GIB:.1f} GiB"
                )
            self._previous_fraction = (index, _memory_fraction(index))
            torch.cuda.set_per_process_memory_fraction(self.cap_gib * GIB / total, index)

    def _watch_rss(self) -> None:
        while not self._stop.wait(self.poll_s):
            self._sample_rss()

    def _sample_rss(self) -> None:
        rss = self._process.memory_info().rss
        self._peak_rss = max(self._peak_rss, rss)
        # On a GPU the cap applies to device memory, not to host RSS.
        if not self.on_gpu and self.cap_gib is not None and rss > self.cap_gib * GIB and not self._exceeded:
            self._exceeded = (
                f"memory cap exceeded: resident memory reached {rss / GIB:.2f} GiB, over the cap of "
                f"{self.cap_gib} GiB"
            )

    def check(self) -> None:
        """Raise now if the cap has been exceeded (call it inside long loops to fail fast)."""
        self._sample_rss()
        if self._exceeded:
            raise MemoryCapExceeded(self._exceeded)

    def __exit__(self, exc_type, exc, tb) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()
        self._sample_rss()
        if self._previous_fraction is not None:  # the cap ends with the block: later work gets the old limit
            import torch

            index, fraction = self._previous_fraction
            torch.cuda.set_per_process_memory_fraction(fraction, index)
            self._previous_fraction = None
        if self.on_gpu and exc_type is not None and "out of memory" in str(exc).lower() and self.cap_gib:
            raise MemoryCapExceeded(f"memory cap exceeded: the allocator cap of {self.cap_gib} GiB") from exc
        if exc_type is None and self._exceeded:
            raise MemoryCapExceeded(self._exceeded)

    def report(self) -> dict:
        """Cap and peaks in GiB, for a receipt's `memory_cap` field."""
        out = {
            "cap_gib": self.cap_gib,
            "device": self.device,
            "enforced_by": "torch.cuda.set_per_process_memory_fraction" if self.on_gpu else "rss-watch",
            "peak_rss_gib": self._peak_rss / GIB,
            "baseline_rss_gib": self._baseline_rss / GIB,
        }
        if self.on_gpu:
            import torch

            index = torch.device(self.device).index or 0
            out["peak_allocated_gib"] = torch.cuda.max_memory_allocated(index) / GIB
            out["peak_reserved_gib"] = torch.cuda.max_memory_reserved(index) / GIB
            out["nvml_process_gib"] = _nvml_process_gib(index)
        return out


def _nvml_process_gib(index: int) -> float | None:
    """This process's whole GPU memory as NVML sees it (context + allocator), or None when unreadable."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid == os.getpid() and proc.usedGpuMemory is not None:
                    return proc.usedGpuMemory / GIB
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # NVML missing or restricted: the allocator figures still stand
        return None
    return None


def _memory_fraction(index: int) -> float:
    """The allocator's current per-process fraction (1.0 where torch cannot say: no cap)."""
    import torch

    getter = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    return float(getter(index)) if getter is not None else 1.0
