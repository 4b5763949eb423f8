"""Kernel registry: every operation has one reference implementation and any number of named variants.

Selection order for ``get(op)``: the explicit ``variant`` argument, then ``KIMI_KERNELS=op=variant,...``,
then the shipped default for the device type (``engine/kernels/defaults.py``). A selected variant that
cannot run on the device raises :class:`KernelUnavailable` with the reason; nothing falls back silently.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

ENV_VAR = "KIMI_KERNELS"
REFERENCE = "reference"
BACKENDS = ("torch", "torch-cpu", "cpp-cpu", "triton")


class KernelSelectionError(ValueError):
    """An unknown operation or variant was asked for (argument or ``KIMI_KERNELS``)."""


class KernelUnavailable(RuntimeError):
    """The selected variant cannot run on this device; the message says why."""


@dataclass(frozen=True)
class Variant:
    op: str
    name: str
    fn: Callable
    # "torch" (runs anywhere), "torch-cpu" (torch kernels the CPU build only has), "cpp-cpu" (our C++ CPU
    # kernels, built at first use) or "triton"
    backend: str
    description: str
    # ``pack(codes, scales) -> (codes, scales)``: the artifact's INT4 weight in the layout ``fn`` reads, made
    # once at load (None: ``fn`` reads the artifact's own layout). Applied to every weight pair of the op.
    pack: Callable | None = None
    # The dtype the variant rounds its results (or intermediates) to, when coarser than ``out``'s.
    precision: torch.dtype | None = None
    # Fast for many rows too (a GEMM): prefill runs it rather than dequantising the weight.
    many_rows: bool = False
    # An expert op that sorts all of a call's routes by expert itself and reads each chosen expert once:
    # prefill passes it every token's routes in one call, not one call per expert.
    groups_routes: bool = False

    @property
    def is_reference(self) -> bool:
        return self.name == REFERENCE


@dataclass
class Operation:
    name: str
    description: str
    weight_args: tuple[tuple[int, int], ...]  # positions of each (codes, scales) pair in the arguments
    variants: dict[str, Variant] = field(default_factory=dict)


@dataclass(frozen=True)
class Selection:
    variant: Variant
    source: str  # "argument" | "KIMI_KERNELS" | "shipped default" | "shipped fallback"
    device_type: str


_OPERATIONS: dict[str, Operation] = {}
# Set by engine.kernels.variants (set_triton_availability): device type -> why Triton kernels cannot run
# there (None: they can).
_triton_unavailable: Callable[[str], str | None] = lambda device_type: "Triton kernels are not registered"
# Set by engine.kernels.cpp_cpu (set_cpp_availability): why our C++ CPU kernels cannot run (None: they can).
_cpp_unavailable: Callable[[], str | None] = lambda: "the C++ CPU kernels are not registered"


def define(op: str, description: str, *, weight_args: tuple[tuple[int, int], ...] = ()) -> None:
    if op in _OPERATIONS:
        raise KernelSelectionError(f"operation {op!r} is already defined")
    _OPERATIONS[op] = Operation(op, description, weight_args)


def register(
    op: str,
    name: str,
    *,
    backend: str,
    description: str,
    pack: Callable | None = None,
    precision: torch.dtype | None = None,
    many_rows: bool = False,
    groups_routes: bool = False,
) -> Callable[[Callable], Callable]:
    """Decorator adding ``fn`` as variant ``name`` of ``op`` (``name="reference"`` is the reference)."""
    if backend not in BACKENDS:
        raise KernelSelectionError(f"unknown backend {backend!r}")

    def decorate(fn: Callable) -> Callable:
        operation = _operation(op)
        if name in operation.variants:
            raise KernelSelectionError(f"{op} already has a variant named {name!r}")
        if pack is not None and not operation.weight_args:
            raise KernelSelectionError(f"{op} has no weight arguments to pack")
        operation.variants[name] = Variant(
            op, name, fn, backend, description, pack, precision, many_rows, groups_routes
        )
        return fn

    return decorate


def packed_args(v: Variant, args: tuple) -> tuple:
    """``args`` (in the artifact's layout) with every weight pair of ``v.op`` packed for ``v``."""
    if v.pack is None:
        return args
    packed = list(args)
    for codes, scales in _operation(v.op).weight_args:
        packed[codes], packed[scales] = v.pack(packed[codes], packed[scales])
    return tuple(packed)


def set_triton_availability(check: Callable[[str], str | None]) -> None:
    global _triton_unavailable
    _triton_unavailable = check


def set_cpp_availability(check: Callable[[], str | None]) -> None:
    global _cpp_unavailable
    _cpp_unavailable = check


def _operation(op: str) -> Operation:
    try:
        return _OPERATIONS[op]
    except KeyError:
        raise KernelSelectionError(
            f"unknown kernel operation {op!r}; known: {', '.join(_OPERATIONS)}"
        ) from None


def operations() -> list[Operation]:
    return list(_OPERATIONS.values())


def variants(op: str) -> list[Variant]:
    """Variants of ``op``, reference first."""
    found = _operation(op).variants
    return sorted(found.values(), key=lambda v: (not v.is_reference, v.name))


def variant(op: str, name: str) -> Variant:
    found = _operation(op).variants
    if name not in found:
        raise KernelSelectionError(f"{op} has no variant {name!r}; available: {', '.join(sorted(found))}")
    return found[name]


def device_type(device: torch.device | str | None = None) -> str:
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device).type


def built_for(v: Variant, device: torch.device | str | None = None) -> bool:
    """Whether ``v`` is meant for ``device`` at all (a CPU-only torch kernel is not meant for a GPU); Triton
    variants are meant for every device, their availability there is :func:`unavailable_reason`'s."""
    return v.backend not in ("torch-cpu", "cpp-cpu") or device_type(device) == "cpu"


def unavailable_reason(v: Variant, device: torch.device | str | None = None) -> str | None:
    """Why ``v`` cannot run on ``device`` (None when it can)."""
    if v.backend == "torch":
        return None
    if v.backend in ("torch-cpu", "cpp-cpu"):
        dev = device_type(device)
        if dev != "cpu":
            return f"{v.name} kernels run on the CPU only, not on {dev}"
        return _cpp_unavailable() if v.backend == "cpp-cpu" else None
    return _triton_unavailable(device_type(device))


def env_selection(value: str | None = None) -> dict[str, str]:
    """Parse ``KIMI_KERNELS`` (``op=variant`` entries, comma-separated); every entry must name real things."""
    value = os.environ.get(ENV_VAR, "") if value is None else value
    chosen: dict[str, str] = {}
    for entry in filter(None, (part.strip() for part in value.split(","))):
        op, sep, name = (s.strip() for s in entry.partition("="))
        if not sep or not op or not name:
            raise KernelSelectionError(f"{ENV_VAR} entry {entry!r} is not of the form op=variant")
        variant(op, name)  # validates both names
        if op in chosen and chosen[op] != name:
            raise KernelSelectionError(f"{ENV_VAR} selects two variants for {op}")
        chosen[op] = name
    return chosen


def unused_env_entries(bound_ops: Iterable[str], chosen: dict[str, str] | None = None) -> list[str]:
    """The ``KIMI_KERNELS`` entries (``op=variant``; ``chosen``: already parsed) naming an operation outside
    ``bound_ops``, the operations a loaded model calls (none for dense weights): they select nothing."""
    bound = set(bound_ops)
    chosen = env_selection() if chosen is None else chosen
    return [f"{op}={name}" for op, name in chosen.items() if op not in bound]


def select(op: str, variant_name: str | None = None, device: torch.device | str | None = None) -> Selection:
    """Resolve which variant runs ``op`` on ``device`` and why; raises if it cannot run there."""
    from engine.kernels.defaults import SHIPPED_DEFAULTS, SHIPPED_FALLBACKS

    dev = device_type(device)
    if variant_name is not None:
        chosen, source = variant(op, variant_name), "argument"
    elif op in (env := env_selection()):
        chosen, source = variant(op, env[op]), ENV_VAR
    else:
        defaults = SHIPPED_DEFAULTS.get(dev)
        if defaults is None or op not in defaults:
            raise KernelSelectionError(f"no shipped default for {op} on {dev}")
        chosen, source = variant(op, defaults[op]), "shipped default"
        reason = unavailable_reason(chosen, dev)
        fallback = SHIPPED_FALLBACKS.get(dev, {}).get(op)
        if (
            reason is not None
            and fallback is not None
            and unavailable_reason(variant(op, fallback), dev) is None
        ):
            _warn_fallback(op, chosen.name, fallback, dev, reason)
            chosen, source = variant(op, fallback), "shipped fallback"
    reason = unavailable_reason(chosen, dev)
    if reason is not None:
        raise KernelUnavailable(f"{op}={chosen.name} ({source}) cannot run on {dev}: {reason}")
    return Selection(chosen, source, dev)


@functools.cache
def _warn_fallback(op: str, default: str, fallback: str, dev: str, reason: str) -> None:
    """Once per operation and reason: which kernel runs instead of the shipped default, and why."""
    warnings.warn(f"{op}: the shipped default {default} cannot run on {dev} ({reason}); using {fallback}",
                  RuntimeWarning, stacklevel=3)  # fmt: skip


def get(op: str, variant_name: str | None = None, device: torch.device | str | None = None) -> Callable:
    """The function implementing ``op`` on ``device`` (see :func:`select`). Resolve once, outside hot loops."""
    return select(op, variant_name, device).variant.fn


def resolve(device: torch.device | str | None, choices: dict[str, str] | None = None) -> dict[str, Selection]:
    """Every operation's selection on ``device``: ``choices`` (op -> variant) where given, otherwise as
    :func:`select` decides. For a model load: resolve once, bind the functions, call them directly."""
    choices = choices or {}
    for op, name in choices.items():
        variant(op, name)  # validates both names
    return {op: select(op, choices.get(op), device) for op in _OPERATIONS}


DEFAULT_SELECTION = "default"


def named_choices(name: str) -> dict[str, str]:
    """Per-operation choices for a selection name: ``default`` (KIMI_KERNELS, then the shipped defaults) or a
    variant name, used for every operation that has a variant of that name (the others as ``default``)."""
    if name == DEFAULT_SELECTION:
        return {}
    chosen = {op: name for op, operation in _OPERATIONS.items() if name in operation.variants}
    if not chosen:
        known = sorted({v for operation in _OPERATIONS.values() for v in operation.variants})
        raise KernelSelectionError(
            f"no operation has a variant named {name!r}; use {DEFAULT_SELECTION!r} or one of {', '.join(known)}"
        )
    return chosen
