"""Pins the shipped defaults: an ordinary CUDA run uses the Triton kernels the benchmarks measure, an
ordinary CPU run our C++ kernels (expert banks, BF16 head) and torch's int4pack (dense INT4) where decode
measured them faster.

Changing a default is a deliberate act: update this table together with the receipts that justify it.
"""

import pytest

import engine.kernels  # noqa: F401
from engine.kernels import registry
from engine.kernels.defaults import SHIPPED_DEFAULTS

PINNED_CUDA = {
    "w4a16_gemv": "triton",
    "w8a16_gemv": "triton",
    "w16a16_gemv": "triton",
    # Dense expert banks: torch's gathered bmm (no Triton variant yet), never the FP32 reference.
    "w16a16_grouped_gemv": "native",
    "w16a16_grouped_swiglu": "native",
    "w4a16_grouped_gemv": "triton",
    "w4a16_grouped_swiglu": "triton_fused",
    "route_combine": "triton",
    # The fused decode kernels (engine/kernels/fused.py): a few launches per layer instead of dozens.
    "rms_norm": "triton",
    "kda_decode_step": "triton",
    "route_topk": "triton",
}


def test_cuda_defaults_are_pinned_and_never_the_reference():
    assert SHIPPED_DEFAULTS["cuda"] == PINNED_CUDA
    for op, name in PINNED_CUDA.items():
        assert registry.variant(op, name).backend == ("torch" if name == "native" else "triton")


@pytest.mark.parametrize("op", sorted(PINNED_CUDA))
def test_plain_resolution_on_cuda_picks_the_pinned_variant(monkeypatch, op):
    """No argument, no KIMI_KERNELS: what a model load on a GPU gets."""
    monkeypatch.delenv(registry.ENV_VAR, raising=False)
    monkeypatch.setattr(registry, "_triton_unavailable", lambda dev: None)  # pretend a GPU is present
    selected = registry.select(op, device="cuda")
    assert (selected.variant.name, selected.source) == (PINNED_CUDA[op], "shipped default")


PINNED_CPU = {
    "w4a16_gemv": "int4pack",
    "w8a16_gemv": "reference",
    "w16a16_gemv": "cpp",
    # Dense expert banks at decode: the union of the batch's experts, each read once (the `wide` preset's
    # compiled step at 4 and 8 rows measured it faster than Inductor's gathered bmm, equal at 1 row).
    "w16a16_grouped_gemv": "cpp",
    "w16a16_grouped_swiglu": "cpp",
    "w4a16_grouped_gemv": "cpp",
    "w4a16_grouped_swiglu": "cpp",
    "route_combine": "reference",
    # The model's own eager code (the references bind nothing: CPU runs are unchanged).
    "rms_norm": "reference",
    "kda_decode_step": "reference",
    "route_topk": "reference",
}


def test_cpu_defaults_are_pinned_and_run_on_the_cpu():
    assert SHIPPED_DEFAULTS["cpu"] == PINNED_CPU
    for op, name in SHIPPED_DEFAULTS["cpu"].items():
        assert registry.unavailable_reason(registry.variant(op, name), "cpu") is None


@pytest.mark.parametrize("op", sorted(PINNED_CPU))
def test_plain_resolution_on_the_cpu_picks_the_pinned_variant(monkeypatch, op):
    monkeypatch.delenv(registry.ENV_VAR, raising=False)
    selected = registry.select(op, device="cpu")
    assert (selected.variant.name, selected.source) == (PINNED_CPU[op], "shipped default")
