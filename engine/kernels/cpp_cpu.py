"""W4A16, and the dense GEMV of the LM head and the projections, on the CPU through our own C++ kernels
(cpp_cpu.cpp), FP32 sums; and KDA's chunked prefill (`kda_chunk`, used by engine.runtime.kda_kernels).

They read the artifact's INT4 layout as stored (no repacked copy) and run each operation as one call:
the dense GEMV reads each weight row once for all rows of ``x``; the expert ops loop over the routes
inside the kernel (no per-route Python, no gathered copy of the bank; the route ids are host memory on
the CPU, so nothing synchronises), and the SwiGLU computes gate and up of a row together. Work is split
over torch's threads (``torch.set_num_threads``). The ops are torch library ops with fake
implementations, so the compiled decode step traces them as opaque calls in one graph.

The library is compiled on first use with the machine's own vector extensions (``-march=native``) into
``$KIMI_CACHE_DIR/cpu-kernels/<cpu>`` (default ``~/.cache/local-kimi``); later processes load it from
there. Without a C++ compiler the variants are unavailable, with the build's error as the reason.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import platform
from collections.abc import Iterator
from pathlib import Path

import torch

from engine.kernels import reference, registry  # noqa: F401  (reference defines the operations)
from engine.kernels.signatures import dense_swiglu_shape, gemv_shape, grouped_shape, output

SOURCE = Path(__file__).with_suffix(".cpp")
NAME = "kimi_cpp_cpu"
VARIANT = "cpp"
GROUP_SIZES = (32, 64, 128)
_ready = False  # the library is loaded (a plain flag: the compiled step traces no build logic)


def _cpu_tag() -> str:
    """The CPU model and flags: a library built with -march=native runs on this kind of CPU only."""
    try:
        info = Path("/proc/cpuinfo").read_text()
        lines = [line for line in info.splitlines() if line.startswith(("model name", "flags"))][:2]
    except OSError:
        lines = [platform.processor()]
    return f"{platform.machine()}-" + hashlib.sha256("\n".join(lines).encode()).hexdigest()[:12]


def build_dir() -> Path:
    base = Path(os.environ.get("KIMI_CACHE_DIR", Path.home() / ".cache" / "local-kimi"))
    return base / "cpu-kernels" / _cpu_tag()


@functools.cache
def _load() -> str | None:
    """Build (or load the cached build of) the library and register its fakes; the error if that fails."""
    from torch.utils import cpp_extension

    directory = build_dir()
    directory.mkdir(parents=True, exist_ok=True)
    try:
        with _build_lock(directory):
            cpp_extension.load_inline(
                NAME,
                cpp_sources=[SOURCE.read_text()],
                extra_cflags=["-O3", "-march=native", "-fopenmp", "-ffp-contract=fast"],
                extra_ldflags=["-fopenmp"],
                build_directory=str(directory),
                is_python_module=False,
            )
    except (RuntimeError, OSError, ImportError) as error:  # no compiler, no ninja, a failed build
        return f"building {SOURCE.name} failed: {str(error).strip().splitlines()[-1]}"
    _register_fakes()
    global _ready
    _ready = True
    return None


@contextlib.contextmanager
def _build_lock(directory: Path) -> Iterator[None]:
    """One builder at a time, by an OS lock that dies with its process.

    torch's own lock is a file that a build killed part-way (Ctrl-C, an OOM kill) leaves behind, and
    every later process then waits on it forever. Holding this lock, no other process can be building,
    so a torch lock file found here is such a leftover and is removed.
    """
    with open(directory / "build.flock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            (directory / "lock").unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def unavailable() -> str | None:
    """Why the kernels cannot run here (None when they can); builds the library on first call."""
    return _load()


def _register_fakes() -> None:
    @torch.library.register_fake(f"{NAME}::mm")
    def _(x, codes, scales, group):
        return x.new_empty((x.shape[0], codes.shape[0]), dtype=torch.float32)

    @torch.library.register_fake(f"{NAME}::dense_mm")
    def _(x, weight):
        return x.new_empty((x.shape[0], weight.shape[0]), dtype=torch.float32)

    @torch.library.register_fake(f"{NAME}::dense_grouped")
    def _(x, gate, up, route_ids):
        return x.new_empty((*route_ids.shape, gate.shape[1]), dtype=torch.float32)

    @torch.library.register_fake(f"{NAME}::kda_chunk")
    def _(q, k, v, g, beta, state, chunk, block, floor):
        return v.new_empty(v.shape)

    @torch.library.register_fake(f"{NAME}::grouped")
    def _(x, codes, scales, route_ids, group):
        return x.new_empty((*route_ids.shape, codes.shape[1]), dtype=torch.float32)

    @torch.library.register_fake(f"{NAME}::grouped_swiglu")
    def _(x, gate, gate_scales, up, up_scales, route_ids, group):
        return x.new_empty((*route_ids.shape, gate.shape[1]), dtype=torch.float32)


def _ops():
    if not _ready and (reason := _load()) is not None:
        raise registry.KernelUnavailable(f"cpp kernels cannot run: {reason}")
    return torch.ops.kimi_cpp_cpu


def flush_denormals() -> None:
    """Take denormal FP32 numbers as zero (x86's FTZ and DAZ) on this thread and on every worker of its
    OpenMP team, which torch's own `set_flush_denormal` leaves as they were; without the library, on this
    thread only.

    KDA's decays are products of many factors below one, and in its chunked prefill they and their
    products fall below FP32's smallest normal number (1.2e-38) often. x86 computes with such numbers in
    microcode, many times slower; their values are far below anything a logit can show. By hand, on 2
    cores: a 64-token prefill of `small` took 150 instead of 206 ms."""
    if unavailable() is None:
        _ops().flush_denormals()
    else:
        torch.set_flush_denormal(True)


def kda_chunk(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    *,
    chunk: int,
    block: int,
    floor: float,
) -> torch.Tensor:
    """`engine.model.kda.kda_chunked`'s contract in C++ (inference only): q, k, g [B, T, H, d_k], v [B, T, H, d_v],
    beta [B, T, H], state [B, H, d_k, d_v] FP32 updated in place -> o [B, T, H, d_v] FP32. One task per
    (batch, head) runs its chunks in order with every temporary in the core's cache; `chunk`, `block` and
    `floor` are kda.py's CHUNK_SIZE, SUB_CHUNK and EXP_FLOOR. d_k must equal d_v."""
    return _ops().kda_chunk(
        q.float(), k.float(), v.float(), g.float(), beta.float(), state, chunk, block, floor
    )


def _variant(op: str, description: str, *, groups_routes: bool = False):
    return registry.register(
        op, VARIANT, backend="cpp-cpu", description=description, many_rows=True, groups_routes=groups_routes
    )


def _check_group(group_size: int) -> None:
    if group_size not in GROUP_SIZES:
        raise ValueError(f"cpp kernels take group sizes {GROUP_SIZES}, got {group_size}")


@_variant("w4a16_gemv", "C++ GEMV on the artifact's codes, FP32 activations; each row read once for all x")
def w4a16_gemv(x, codes, scales, group_size, *, out=None, out_dtype=None):
    shape = gemv_shape("int4", x, codes, scales, group_size)
    _check_group(group_size)
    out = output(out, (shape.batch, shape.n), out_dtype or x.dtype, x.device)
    out.copy_(_ops().mm(x, codes, scales, group_size))
    return out


@_variant(
    "w16a16_gemv",
    "C++ GEMV on the weight as stored (FP32/BF16/FP16), FP32 sums; each row read once for all x",
)
def w16a16_gemv(x, weight, *, out=None, out_dtype=None):
    shape = gemv_shape("dense", x, weight, None, None)
    out = output(out, (shape.batch, shape.n), out_dtype or x.dtype, x.device)
    out.copy_(_ops().dense_mm(x, weight.contiguous()))
    return out


@_variant(
    "w4a16_grouped_gemv",
    "C++ loop over the routes in one call on the artifact's codes, FP32; where experts repeat (a batch, a "
    "prompt), routes sorted by expert and each chosen expert's rows decoded once for all its routes",
    groups_routes=True,
)
def w4a16_grouped_gemv(x, codes, scales, route_ids, group_size, *, out=None, out_dtype=None):
    shape = grouped_shape(x, codes, scales, route_ids, group_size)
    _check_group(group_size)
    out = output(out, (shape.batch, shape.slots, shape.n), out_dtype or x.dtype, x.device)
    out.copy_(_ops().grouped(x, codes, scales, route_ids, group_size))
    return out


@_variant(
    "w4a16_grouped_swiglu",
    "C++: gate and up rows of each route together, silu(gate) * up in FP32, one call; where experts repeat, "
    "routes sorted by expert and each chosen expert's rows decoded once for all its routes",
    groups_routes=True,
)
def w4a16_grouped_swiglu(x, gate_codes, gate_scales, up_codes, up_scales, route_ids, group_size, *, out=None):
    shape = grouped_shape(x, gate_codes, gate_scales, route_ids, group_size)
    grouped_shape(x, up_codes, up_scales, route_ids, group_size)
    if shape.per_slot_input:
        raise ValueError("the gate/up projection takes x as [B, K]")
    _check_group(group_size)
    out = output(out, (shape.batch, shape.slots, shape.n), x.dtype, x.device)
    out.copy_(_ops().grouped_swiglu(x, gate_codes, gate_scales, up_codes, up_scales, route_ids, group_size))
    return out


registry.set_cpp_availability(unavailable)


@_variant(
    "w16a16_grouped_gemv",
    "C++: routes sorted by expert, each chosen expert's rows read once for all its routes, FP32 sums",
)
def w16a16_grouped_gemv(x, bank, route_ids, *, out=None, out_dtype=None):
    shape = grouped_shape(x, bank, None, route_ids, None, "dense")
    out = output(out, (shape.batch, shape.slots, shape.n), out_dtype or x.dtype, x.device)
    out.copy_(_ops().dense_grouped(x, bank, None, route_ids))
    return out


@_variant(
    "w16a16_grouped_swiglu",
    "C++: routes sorted by expert, gate and up rows read once for all its routes, silu(gate) * up in FP32",
)
def w16a16_grouped_swiglu(x, gate, up, route_ids, *, out=None):
    shape = dense_swiglu_shape(x, gate, up, route_ids)
    out = output(out, (shape.batch, shape.slots, shape.n), x.dtype, x.device)
    out.copy_(_ops().dense_grouped(x, gate, up, route_ids))
    return out
