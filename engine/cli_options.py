"""Options shared by the command lines that load the engine (`kimi-engine serve` and the runners decode,
profile, accuracy, llamacpp, kernels): each spelled, described and defaulted once.

Dtypes are spelled bf16, fp16, fp32 everywhere (the receipts', the quantiser's --scale-dtype and llama.cpp's
spelling); PyTorch's and vLLM's bfloat16, float16, float32 (and half, float) are accepted as aliases.
Model sizes are `--synthetic PRESET` everywhere, and `--quant` is a choice of the plans or `none`.
"""

from __future__ import annotations

import click
import torch

from common.memory_cap import default_cap_gib
from engine.model.dtypes import default_dtype
from engine.model.presets import PRESETS
from engine.quant.plan import PLANS
from engine.runtime.engine import DEFAULT_PREFILL_CHUNK
from engine.runtime.kda_kernels import KDA_KERNELS

AUTO = "auto"
NO_QUANT = "none"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DTYPE_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32"}
AUTO_DTYPE = "auto: bf16 on a GPU and on CPUs with native BF16 (avx512_bf16 / AMX), fp32 on other CPUs"


class AliasedChoice(click.Choice):
    """A choice that also takes aliases, converted to their canonical name; --help lists the canonical ones."""

    def __init__(self, choices: list[str], aliases: dict[str, str]):
        super().__init__(choices, case_sensitive=False)
        self.aliases = aliases

    def convert(self, value, param, ctx):
        if isinstance(value, str):
            value = self.aliases.get(value.lower(), value)
        return super().convert(value, param, ctx)


def dtype_name(dtype: torch.dtype) -> str:
    """The option spelling of a torch dtype."""
    return next(name for name, known in DTYPES.items() if known == dtype)


def default_dtype_name(device: torch.device | str) -> str:
    """The spelling of the engine's default dtype on `device` (engine.model.dtypes.default_dtype)."""
    return dtype_name(default_dtype(device))


def resolve_dtype(name: str, device: torch.device | str) -> tuple[str, torch.dtype]:
    """(spelling, torch dtype) of a --dtype value; auto is the engine's default on `device`."""
    name = default_dtype_name(device) if name == AUTO else name
    return name, DTYPES[name]


def dtype_option(default: str = AUTO, what: str = "Weights and activations"):
    """`--dtype auto|bf16|fp16|fp32`."""
    return click.option(
        "--dtype",
        type=AliasedChoice([AUTO, *DTYPES], DTYPE_ALIASES),
        default=default,
        show_default=True,
        help=f"{what}; {AUTO_DTYPE}. Also accepted: bfloat16, float16 (half), float32 (float).",
    )


def synthetic_option(help: str, choices: tuple[str, ...] = tuple(PRESETS), default: str | None = None):
    """`--synthetic PRESET`: random weights of a preset's shapes, built in memory (no download)."""
    return click.option(
        "--synthetic",
        type=click.Choice(list(choices)),
        default=default,
        show_default=default is not None,
        help=help,
    )


def quant_option(help: str):
    """`--quant PLAN|none` (docs/INT4.md); `quant_plan` turns `none` into None."""
    return click.option("--quant", type=click.Choice([NO_QUANT, *PLANS]), default=None, help=help)


def quant_plan(quant: str | None) -> str | None:
    return None if quant in (None, NO_QUANT) else quant


def memory_cap_option(what: str = "The engine plans and runs under this cap"):
    """`--memory-cap-gib`; the default per device is common.memory_cap.default_cap_gib's."""
    return click.option(
        "--memory-cap-gib",
        type=click.FloatRange(min=0, min_open=True),
        default=None,
        help=f"{what} (GPU: allocator cap; CPU: resident memory); a context that cannot fit is refused before "
        f"loading. Default: {default_cap_gib('cuda'):g} on a GPU, {default_cap_gib('cpu'):g} on the CPU.",
    )


def resolve_memory_cap(memory_cap_gib: float | None, device: str) -> float:
    """A --memory-cap-gib value, or the default cap of `device` when none was given."""
    return memory_cap_gib if memory_cap_gib is not None else default_cap_gib(device)


def device_option(what: str = "Where the model runs"):
    """`--device auto|cpu|cuda|cuda:N`; `resolve_device` turns it into a device name."""
    return click.option(
        "--device",
        default=AUTO,
        show_default=True,
        help=f"{what}: cpu, cuda or cuda:N; auto: cuda when available.",
    )


def resolve_device(name: str) -> str:
    """The device a --device value names; a CUDA device that is not there is a usage error."""
    if name == AUTO:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise click.BadParameter("no CUDA device is visible", param_hint="--device")
    return name


prefill_chunk_option = click.option(
    "--prefill-chunk",
    type=click.IntRange(min=1),
    default=DEFAULT_PREFILL_CHUNK,
    show_default=True,
    help="Prompt tokens per prefill step (bounds prefill memory).",
)
cuda_graphs_option = click.option(
    "--cuda-graphs/--no-cuda-graphs",
    default=True,
    show_default=True,
    help="Replay each decode step as a CUDA graph (GPU only).",
)
kda_kernel_option = click.option(
    "--kda-kernel",
    type=click.Choice(KDA_KERNELS),
    default="auto",
    show_default=True,
    help="KDA prefill kernel: torch, cpp (CPU: the chunked form in C++), fla (GPU); auto: fla or cpp, else torch.",
)
