import pytest
import torch

import engine.kernels  # noqa: F401  (registers every operation)
from engine.kernels import registry
from engine.kernels.defaults import SHIPPED_DEFAULTS
from engine.kernels.triton_gemv import INTERPRETED

OPS = [op.name for op in registry.operations()]


def test_kernel_interpreter_is_active():
    """Without a GPU the conftest must have switched the Triton kernels to the interpreter."""
    if torch.cuda.is_available():
        pytest.skip("running on a GPU")
    assert INTERPRETED, registry.unavailable_reason(registry.variant("w4a16_gemv", "triton"), "cpu")
    assert registry.unavailable_reason(registry.variant("w4a16_gemv", "triton"), "cpu") is None


def test_every_operation_has_a_reference_first():
    for op in OPS:
        found = registry.variants(op)
        assert found[0].is_reference and found[0].backend == "torch"
        assert len(found) >= 2, f"{op} has no fast variant"


def test_selection_order_argument_then_env_then_default(monkeypatch):
    monkeypatch.delenv(registry.ENV_VAR, raising=False)
    selected = registry.select("w4a16_gemv", device="cpu")
    assert (selected.variant.name, selected.source) == ("int4pack", "shipped default")
    monkeypatch.setenv(registry.ENV_VAR, " w4a16_gemv = triton , route_combine=reference")
    selected = registry.select("w4a16_gemv", device="cpu")
    assert (selected.variant.name, selected.source) == ("triton", registry.ENV_VAR)
    selected = registry.select("w4a16_gemv", "reference", device="cpu")
    assert (selected.variant.name, selected.source) == ("reference", "argument")


@pytest.mark.parametrize(
    "value,message",
    [
        ("w4a16_gemv", "not of the form"),
        ("=triton", "not of the form"),
        ("w4a16_gemv=", "not of the form"),
        ("w4a16_gemv=fast", "no variant 'fast'; available: cpp, int4pack, reference, triton"),
        ("w4a16_gmev=triton", "unknown kernel operation"),
        ("w4a16_gemv=triton,w4a16_gemv=reference", "two variants"),
    ],
)
def test_bad_env_is_an_error_naming_the_problem(monkeypatch, value, message):
    monkeypatch.setenv(registry.ENV_VAR, value)
    with pytest.raises(registry.KernelSelectionError, match=message):
        registry.select("route_combine", device="cpu")


def test_unavailable_variant_raises_with_the_reason(monkeypatch):
    monkeypatch.setattr(registry, "_triton_unavailable", lambda dev: "no driver here")
    with pytest.raises(
        registry.KernelUnavailable, match=r"w4a16_gemv=triton \(argument\) cannot run on cpu: no driver"
    ):
        registry.get("w4a16_gemv", "triton", "cpu")
    assert registry.get("w4a16_gemv", device="cpu") is registry.variant("w4a16_gemv", "int4pack").fn


def test_cuda_unavailable_reason_on_a_cpu_machine():
    if torch.cuda.is_available():
        pytest.skip("has CUDA")
    reason = registry.unavailable_reason(registry.variant("w4a16_gemv", "triton"), "cuda")
    assert reason == "CUDA is not available"


def test_duplicate_registrations_are_refused():
    with pytest.raises(registry.KernelSelectionError, match="already has a variant"):
        registry.register("w4a16_gemv", "triton", backend="triton", description="")(lambda: None)
    with pytest.raises(registry.KernelSelectionError, match="already defined"):
        registry.define("w4a16_gemv", "")


def test_shipped_defaults_cover_every_operation_on_both_devices():
    for device, table in SHIPPED_DEFAULTS.items():
        assert set(table) == set(OPS), device
        for op, name in table.items():
            registry.variant(op, name)
