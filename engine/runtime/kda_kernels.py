"""Prefill kernels for the KDA layers: the model's own chunked form, or `fla`'s `chunk_kda` on a GPU.

Both take the model's already-normalised, already-scaled q and k, the log-space per-channel decay g and
beta, and update the FP32 state [B, H, d_k, d_v] in place (fla uses the same state layout).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

import torch

from engine.model import KimiLinearForCausalLM
from engine.model.kda import KimiDeltaAttention, kda_chunked

KDA_KERNELS = ("auto", "torch", "fla")


def fla_available() -> bool:
    return importlib.util.find_spec("fla") is not None and torch.cuda.is_available()


def fla_chunk_kda(q, k, v, g, beta, state: torch.Tensor) -> torch.Tensor:
    """`kda_chunked`'s contract through fla's Triton kernels (scale 1: q arrives scaled)."""
    from fla.ops.kda import chunk_kda

    out, final = chunk_kda(q, k, v, g, beta, scale=1.0, initial_state=state, output_final_state=True)
    state.copy_(final)
    return out


def select_kda_kernel(choice: str, device: torch.device) -> tuple[str, Callable]:
    """(name, kernel) for `choice` in KDA_KERNELS: auto takes fla on a GPU when it is installed."""
    if choice not in KDA_KERNELS:
        raise ValueError(f"unknown KDA kernel {choice!r}; choose one of {', '.join(KDA_KERNELS)}")
    on_gpu = device.type == "cuda"
    if choice == "fla" and not (on_gpu and fla_available()):
        raise ValueError("the fla KDA kernel needs a CUDA device and the flash-linear-attention package")
    if choice == "fla" or (choice == "auto" and on_gpu and fla_available()):
        return "fla", fla_chunk_kda
    return "torch", kda_chunked


def use_kda_kernel(model: KimiLinearForCausalLM, kernel: Callable) -> None:
    for module in model.modules():
        if isinstance(module, KimiDeltaAttention):
            module.chunked_kernel = kernel
