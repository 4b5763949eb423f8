"""Prefill kernels for the KDA layers: the model's own chunked form, the same algebra as one C++ kernel on
the CPU (`cpp`), or `fla`'s `chunk_kda` on a GPU.

All take the model's already-normalised, already-scaled q and k, the log-space per-channel decay g and
beta, and update the FP32 state [B, H, d_k, d_v] in place (fla uses the same state layout).
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable

import torch

from engine.kernels import cpp_cpu
from engine.model.kda import CHUNK_SIZE, EXP_FLOOR, SUB_CHUNK, kda_chunked, l2_normalize

KDA_KERNELS = ("auto", "torch", "cpp", "fla")
CPP_TOLERANCE = 1e-4  # FP32 throughout; only the order of the d_k sums and the exp's last bit differ
log = logging.getLogger(__name__)


def fla_available() -> bool:
    return importlib.util.find_spec("fla") is not None and torch.cuda.is_available()


def fla_chunk_kda(q, k, v, g, beta, state: torch.Tensor) -> torch.Tensor:
    """`kda_chunked`'s contract through fla's Triton kernels (scale 1: q arrives scaled)."""
    from fla.ops.kda import chunk_kda

    out, final = chunk_kda(q, k, v, g, beta, scale=1.0, initial_state=state, output_final_state=True)
    state.copy_(final)
    return out


def cpp_chunk_kda(q, k, v, g, beta, state: torch.Tensor) -> torch.Tensor:
    """`kda_chunked` as one C++ call (inference only): each (batch, head) sequence a task, its chunks in
    order, the same blocks and exponent floor."""
    # The kernel updates a contiguous FP32 state: a strided or other-dtype one is copied back after.
    work = state if state.is_contiguous() and state.dtype == torch.float32 else state.float().contiguous()
    out = cpp_cpu.kda_chunk(q, k, v, g, beta, work, chunk=CHUNK_SIZE, block=SUB_CHUNK, floor=EXP_FLOOR)
    if work is not state:
        state.copy_(work)
    return out


def random_kda_inputs(
    gen: torch.Generator, device: torch.device | str, *, batch: int, tokens: int, heads: int, dim: int
) -> tuple[torch.Tensor, ...]:
    """(q, k, v, g, beta, state) as a KDA layer hands them to a prefill kernel: q and k normalised (q
    scaled), decay g in (-0.5, 0], beta in [0, 1), a small FP32 state; drawn on the CPU from `gen`."""

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(device)

    q = l2_normalize(randn(batch, tokens, heads, dim), 1e-6) * dim**-0.5
    k = l2_normalize(randn(batch, tokens, heads, dim), 1e-6)
    v = randn(batch, tokens, heads, dim)
    g = -torch.rand(batch, tokens, heads, dim, generator=gen).to(device) * 0.5
    beta = torch.rand(batch, tokens, heads, generator=gen).to(device)
    state = randn(batch, heads, dim, dim) * 0.1
    return q, k, v, g, beta, state


def check_against_reference(kernel: Callable, device: torch.device, *, tolerance: float = 2e-3) -> str | None:
    """Run `kernel` and `kda_chunked` on the same random inputs (fresh each call, outputs poisoned) and
    return why they disagree, or None. Tolerance is relative to the output scale (fla's dots are TF32)."""
    gen = torch.Generator(device="cpu").manual_seed(int(torch.randint(0, 2**31, (1,)).item()))
    q, k, v, g, beta, state = random_kda_inputs(gen, device, batch=1, tokens=130, heads=2, dim=64)
    ref_state, out_state = state.clone(), state.clone()
    expected = kda_chunked(q, k, v, g, beta, ref_state)
    out = torch.full_like(expected, float("nan"))
    try:
        out.copy_(kernel(q, k, v, g, beta, out_state))
    except Exception as e:  # an installed package that cannot run here
        return f"{type(e).__name__}: {e}"
    error = max(
        ((out - expected).abs().max() / expected.abs().max()).item(),
        ((out_state - ref_state).abs().max() / ref_state.abs().max()).item(),
    )
    if not error <= tolerance:  # also catches NaN
        return f"relative error {error:.2e} against kda_chunked (tolerance {tolerance:.0e})"
    return None


def select_kda_kernel(choice: str, device: torch.device) -> tuple[str, Callable]:
    """(name, kernel) for `choice` in KDA_KERNELS. auto takes fla on a GPU when it is installed, and cpp
    on the CPU when our C++ library builds, each only if it passes a check against the chunked form at
    load; otherwise torch (with a warning when the faster one failed its check)."""
    if choice not in KDA_KERNELS:
        raise ValueError(f"unknown KDA kernel {choice!r}; choose one of {', '.join(KDA_KERNELS)}")
    on_gpu = device.type == "cuda"
    if choice == "fla" and not (on_gpu and fla_available()):
        raise ValueError("the fla KDA kernel needs a CUDA device and the flash-linear-attention package")
    cpp_missing = "it runs on the CPU only" if on_gpu else cpp_cpu.unavailable()
    if choice == "cpp" and cpp_missing is not None:
        raise ValueError(f"the cpp KDA kernel cannot run: {cpp_missing}")
    if choice == "fla" or (choice == "auto" and on_gpu and fla_available()):
        candidate, kernel, tolerance = "fla", fla_chunk_kda, 2e-3
    elif choice in ("cpp", "auto") and cpp_missing is None:
        candidate, kernel, tolerance = "cpp", cpp_chunk_kda, CPP_TOLERANCE
    else:
        return "torch", kda_chunked
    problem = check_against_reference(kernel, device, tolerance=tolerance)
    if problem is None:
        return candidate, kernel
    if choice == candidate:
        raise ValueError(f"the {candidate} KDA kernel failed its check on {device}: {problem}")
    log.warning(
        "the %s KDA kernel failed its check on %s (%s); using the torch chunked form",
        candidate,
        device,
        problem,
    )
    return "torch", kda_chunked
