"""Equivalence checker: every variant against the operation's reference, on fresh random inputs.

Per check: new inputs from a fresh seed (recorded, so a failure can be replayed), output buffers and
split-K scratch poisoned with NaN before each run, every output element required to be written (no NaN
left), state an op updates in place (the KDA step's) run on a copy per variant and compared like the output, and ``|actual - expected| <= atol + rtol * |expected|`` with ``atol = atol_rms * rms(expected)``
and tolerances by output dtype (:data:`TOLERANCES`). Both sides compute FP32 dot products of identical
FP32 values and differ only in summation order and the final rounding, so the tolerances are the output
dtype's rounding step plus a small FP32 allowance; any layout, nibble or scale bug is orders larger.
"""

from __future__ import annotations

import contextlib
import math
import secrets
from dataclasses import dataclass

import torch

from engine.kernel_tools.cases import CASES
from engine.kernels import registry
from engine.kernels.workspace import poisoned_scratch


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol_rms: float


# Rounding step of the output dtype (one ulp is at most 2^-7 / 2^-10 relative) + an FP32 summation allowance.
TOLERANCES = {
    torch.float32: Tolerance(rtol=1e-4, atol_rms=1e-4),
    torch.bfloat16: Tolerance(rtol=2**-7, atol_rms=1e-4),
    torch.float16: Tolerance(rtol=2**-10, atol_rms=1e-4),
}


@dataclass(frozen=True)
class CheckResult:
    op: str
    variant: str
    shape: dict
    seed: int
    passed: bool
    max_abs_error: float = math.nan
    worst_ratio: float = math.nan  # max |a - e| / (atol + rtol |e|); <= 1 passes
    unwritten: int = 0
    skipped: str = ""
    failure: str = ""

    def describe(self) -> str:
        shape = ",".join(f"{k}={v}" for k, v in self.shape.items())
        if self.skipped:
            return f"SKIP {self.op}.{self.variant} [{shape}]: {self.skipped}"
        status = "ok  " if self.passed else "FAIL"
        detail = f"max|err|={self.max_abs_error:.3g} err/tol={self.worst_ratio:.3g}"
        if self.unwritten:
            detail += f" unwritten={self.unwritten}"
        if self.failure:
            detail += f" ({self.failure})"
        return f"{status} {self.op}.{self.variant} [{shape}] seed={self.seed} {detail}"


@contextlib.contextmanager
def _exact_fp32():
    """The reference must not use TF32 on a GPU."""
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def _run(v: registry.Variant, case, device, options: dict) -> list[torch.Tensor]:
    """[out, then every argument the op updates in place], each run on its own copy of those."""
    out = torch.full(case.out_shape, float("nan"), dtype=case.out_dtype, device=device)
    args = list(registry.packed_args(v, case.args))  # the weights in the variant's layout, as at load
    for i in case.mutated:
        args[i] = args[i].clone()
    with poisoned_scratch(), _exact_fp32():
        result = v.fn(*args, **case.kwargs, **options, out=out)
    if result is not out:
        raise AssertionError("the variant did not return the out tensor it was given")
    return [out, *(args[i] for i in case.mutated)]


def check(
    op: str,
    variant: str,
    shape: dict,
    *,
    device: torch.device | str = "cpu",
    seed: int | None = None,
    options: dict | None = None,
) -> CheckResult:
    """Check one variant of ``op`` at ``shape`` against the reference on ``device``.

    ``options`` are extra keyword arguments for the variant only (e.g. a Triton ``config``).
    """
    seed = secrets.randbits(62) if seed is None else seed
    chosen = registry.variant(op, variant)
    reason = registry.unavailable_reason(chosen, device)
    if reason is not None:
        return CheckResult(op, variant, shape, seed, passed=False, skipped=reason)
    device = torch.device(device)
    case = CASES[op](shape, torch.Generator(device).manual_seed(seed), device)
    expected = _run(registry.variant(op, registry.REFERENCE), case, device, {})
    try:
        actual = _run(chosen, case, device, options or {})
    except Exception as error:  # a crash is a failed check, reported with the others
        return CheckResult(op, variant, shape, seed, passed=False, failure=f"{type(error).__name__}: {error}")
    results = [
        _compare(op, variant, shape, seed, e, a, tolerance(chosen, e.dtype))
        for e, a in zip(expected, actual, strict=True)
    ]
    return max(results, key=lambda r: (not r.passed, r.worst_ratio))  # the worst of out and the states


# A SwiGLU (INT4 or dense banks) whose gate and up are BF16 before silu(gate) * up: three roundings, and silu scales the gate's
# relative error by |1 + g(1 - sigmoid(g))| (< 6 for g > -5); below that silu * up is small next to the rms,
# so the atol term covers it.
ROUNDED_SWIGLU = Tolerance(rtol=2**-6, atol_rms=2**-10)


def tolerance(v: registry.Variant, out_dtype: torch.dtype) -> Tolerance:
    """The output dtype's tolerance, or the variant's own precision's when that is coarser."""
    out_tol = TOLERANCES[out_dtype]
    if v.precision is None:
        return out_tol
    own = ROUNDED_SWIGLU if v.op.endswith("_grouped_swiglu") else TOLERANCES[v.precision]
    return own if own.rtol > out_tol.rtol else out_tol


def _compare(op, variant, shape, seed, expected, actual, tol: Tolerance) -> CheckResult:
    e, a = expected.double().cpu(), actual.double().cpu()
    if torch.isnan(e).any():
        return CheckResult(op, variant, shape, seed, passed=False, failure="reference left NaN in its output")
    unwritten = int(torch.isnan(a).sum())
    rms = float(e.square().mean().sqrt())
    allowed = tol.atol_rms * rms + tol.rtol * e.abs()
    error = (a - e).abs()
    ratio = float((error / allowed).nan_to_num(nan=math.inf).max())
    return CheckResult(
        op,
        variant,
        shape,
        seed,
        passed=unwritten == 0 and ratio <= 1.0,
        max_abs_error=float(error.nan_to_num(nan=math.inf).max()),
        worst_ratio=ratio,
        unwritten=unwritten,
    )


def check_all(
    shapes: dict[str, list[dict]], *, device: torch.device | str = "cpu", variants: list[str] | None = None
) -> list[CheckResult]:
    """Every non-reference variant (or those named) of every op in ``shapes`` meant for ``device``, at
    each of its shapes."""
    results = []
    for op, op_shapes in shapes.items():
        for v in registry.variants(op):
            if v.is_reference or (variants is not None and v.name not in variants):
                continue
            if not registry.built_for(v, device):
                continue
            results += [check(op, v.name, shape, device=device) for shape in op_shapes]
    return results


def assert_equivalent(results: list[CheckResult]) -> None:
    """Raise with every failing (or skipped) check listed."""
    bad = [r for r in results if not r.passed]
    if bad:
        raise AssertionError("kernel equivalence failed:\n" + "\n".join(r.describe() for r in bad))
