"""Where a measurement ran: a JSON-able descriptor of GPUs, CPU, software versions and the git commit.

Every receipt embeds one. Without a GPU or without NVML the descriptor is still complete for the CPU
and says why its GPU part is empty.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
import time
from functools import lru_cache
from pathlib import Path

import psutil

REPO_ROOT = Path(__file__).resolve().parents[1]


def describe() -> dict:
    """The full descriptor of this machine, right now."""
    gpus, gpu_note = _gpus()
    desc = {
        "gpus": gpus,
        "gpu_note": gpu_note,
        "cpu": _cpu(),
        "os": {"system": platform.system(), "release": platform.release(), "platform": platform.platform()},
        "software": _software(),
        "git": git_state(),
        "load": machine_load(),
    }
    desc["hardware_id"] = hardware_id(desc)
    return desc


def hardware_id(desc: dict) -> str:
    """A short stable id that groups receipts: 'NVIDIA-H200' (x2 when several) or, for a CPU, its cores, model and
    widest vector tier: 'cpu-2c-AMD-EPYC-avx512bf16'."""
    if desc["gpus"]:
        name = _slug(desc["gpus"][0]["name"])
        count = len(desc["gpus"])
        return name if count == 1 else f"{name}-x{count}"
    cpu = desc["cpu"]
    base = f"cpu-{cpu['logical_cores']}c-{_slug(cpu['model'])}"
    if "vector_flags" not in cpu:  # a descriptor that did not record them (an import) keeps the plain id
        return base
    tier = vector_tier(cpu["vector_flags"])
    return f"{base}-{tier}" if tier else base


def _slug(text: str) -> str:
    text = re.sub(r"\((R|TM|C)\)", "", text, flags=re.IGNORECASE)
    text = re.sub(r"\b(CPU|@.*)$", "", text.strip())
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-") or "unknown"


def _gpus() -> tuple[list[dict], str]:
    try:
        import pynvml
    except ImportError:
        return [], "pynvml (nvidia-ml-py) is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return [], f"NVML unavailable: {exc}"
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        cuda_driver = pynvml.nvmlSystemGetCudaDriverVersion()
        cuda_driver_text = f"{cuda_driver // 1000}.{cuda_driver % 1000 // 10}"
        gpus = [_gpu(pynvml, i, driver, cuda_driver_text) for i in range(pynvml.nvmlDeviceGetCount())]
    finally:
        pynvml.nvmlShutdown()
    return gpus, "" if gpus else "NVML reports no GPU"


def _gpu(pynvml, index: int, driver: str | None, cuda_driver: str) -> dict:
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)

    def read(fn, *args):
        # Some fields are not supported on every board (or inside a MIG slice): record None, not a crash.
        try:
            return fn(handle, *args)
        except pynvml.NVMLError:
            return None

    clock = pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_MEM
    mig = read(pynvml.nvmlDeviceGetMigMode)
    power = read(pynvml.nvmlDeviceGetPowerManagementLimit)
    memory = read(pynvml.nvmlDeviceGetMemoryInfo)
    return {
        "index": index,
        "name": _text(pynvml.nvmlDeviceGetName(handle)),
        "uuid": _text(read(pynvml.nvmlDeviceGetUUID)),
        "driver_version": driver,
        "cuda_driver_version": cuda_driver,
        "memory_total_bytes": memory.total if memory else None,
        "sm_clock_mhz": read(pynvml.nvmlDeviceGetClockInfo, clock[0]),
        "sm_clock_max_mhz": read(pynvml.nvmlDeviceGetMaxClockInfo, clock[0]),
        "mem_clock_mhz": read(pynvml.nvmlDeviceGetClockInfo, clock[1]),
        "mem_clock_max_mhz": read(pynvml.nvmlDeviceGetMaxClockInfo, clock[1]),
        "power_limit_w": power / 1000 if power is not None else None,
        "pcie_gen": read(pynvml.nvmlDeviceGetCurrPcieLinkGeneration),
        "pcie_width": read(pynvml.nvmlDeviceGetCurrPcieLinkWidth),
        "persistence_mode": read(pynvml.nvmlDeviceGetPersistenceMode),
        "mig_mode": mig[0] if mig else None,
    }


def _text(value) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


# The vector extensions the engine's CPU paths depend on (BF16 default, AVX-512 kernels): two machines of
# one model name may differ in them, and their numbers then differ too.
VECTOR_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")

# Widest first: the tier a CPU's id names. Two machines of one model name (an AVX-512 BF16 EPYC and an
# AVX2-only one) decode at different speeds and must not share an id.
VECTOR_TIERS = (("amx", "amx_tile"), ("avx512bf16", "avx512_bf16"), ("avx512", "avx512f"), ("avx2", "avx2"))


def vector_flags(cpu_flags) -> list[str]:
    """The VECTOR_FLAGS among a CPU's flags (/proc/cpuinfo's names), in VECTOR_FLAGS' order."""
    return [flag for flag in VECTOR_FLAGS if flag in cpu_flags]


def vector_tier(flags: list[str]) -> str | None:
    """The widest tier of VECTOR_TIERS among `flags` (None when it has none of them)."""
    return next((tier for tier, flag in VECTOR_TIERS if flag in flags), None)


def _cpu() -> dict:
    model = platform.processor() or ""
    named, flags = False, set[str]()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():  # the first CPU's lines
            if line.startswith("model name") and not named:
                model, named = line.split(":", 1)[1].strip(), True
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
            if named and flags:
                break
    except OSError:
        pass
    return {
        "model": model or platform.machine(),
        "arch": platform.machine(),
        "physical_cores": psutil.cpu_count(logical=False),
        "logical_cores": psutil.cpu_count(logical=True),
        "ram_bytes": psutil.virtual_memory().total,
        "vector_flags": vector_flags(flags),
    }


BUSY_OTHERS_PCT = 25.0  # other processes' CPU (percent of one core) above which a run counts as disturbed
STEAL_PCT = 5.0  # hypervisor steal above which a run counts as disturbed
_LOAD_TTL_S = 10.0  # one look serves the receipts a runner writes in a burst
_load_seen: tuple[float, dict] | None = None


def machine_load(window_s: float = 0.2) -> dict:
    """How busy the machine was besides this run, looked at over `window_s`: load averages, CPU steal,
    the frequency, and the other processes using CPU (this process and its children excluded).
    `disturbed` says whether the numbers beside it deserve suspicion."""
    global _load_seen
    now = time.monotonic()
    if _load_seen is not None and now - _load_seen[0] < _LOAD_TTL_S:
        return _load_seen[1]
    ours = {os.getpid()} | {c.pid for c in psutil.Process().children(recursive=True)}
    others = [p for p in psutil.process_iter(["name", "cmdline"]) if p.pid not in ours]
    for proc in others:
        try:
            proc.cpu_percent(None)
        except psutil.Error:
            pass
    times = psutil.cpu_times_percent(interval=window_s)
    busy = []
    for proc in others:
        try:
            pct = proc.cpu_percent(None)
        except psutil.Error:
            continue
        if pct >= 5.0:
            busy.append({"name": _program(proc.info), "cpu_pct": round(pct, 1)})
    busy.sort(key=lambda b: -b["cpu_pct"])
    freq = psutil.cpu_freq()
    steal = getattr(times, "steal", 0.0)
    others_pct = sum(b["cpu_pct"] for b in busy)
    load = {
        "loadavg": [round(v, 2) for v in os.getloadavg()],
        "cpu_steal_pct": steal,
        "others_cpu_pct": round(others_pct, 1),
        "busy_others": busy[:8],
        "cpu_mhz": round(freq.current) if freq else None,
        "disturbed": others_pct > BUSY_OTHERS_PCT or steal > STEAL_PCT,
    }
    _load_seen = (now, load)
    return load


def _program(info: dict) -> str:
    """'python -m pytest' rather than 'python'; never further arguments (they may hold keys)."""
    name, args = info.get("name") or "?", info.get("cmdline") or []
    return f"{name} -m {args[2]}" if len(args) > 2 and args[1] == "-m" else name


def _software() -> dict:
    versions: dict[str, str | None] = {
        "python": platform.python_version(),
        "implementation": sys.implementation.name,
    }
    try:
        import torch

        versions["torch"] = torch.__version__
        versions["cuda_runtime"] = torch.version.cuda
    except ImportError:
        versions["torch"] = None
        versions["cuda_runtime"] = None
    try:
        import triton

        versions["triton"] = triton.__version__
    except ImportError:
        versions["triton"] = None
    return versions


@lru_cache(maxsize=1)
def git_state() -> dict:
    """The project's commit and whether the working tree differs from it (a dirty receipt is flagged)."""

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = os.environ.get("KIMI_GIT_COMMIT") or git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}
