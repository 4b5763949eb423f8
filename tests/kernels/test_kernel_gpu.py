"""On a GPU: every fast variant at the full Kimi-Linear decode shapes (skipped without CUDA)."""

import pytest

import engine.kernels  # noqa: F401
from engine.kernel_tools.equivalence import check
from engine.kernel_tools.shapes import kimi_shapes
from engine.kernels import registry
from engine.model import preset

FULL = [
    pytest.param(op, v.name, shape, id=f"{op}.{v.name}-{shape['name']}")
    for op, shapes in kimi_shapes(preset("full"), batches=(1, 8)).items()
    for v in registry.variants(op)
    if not v.is_reference
    for shape in shapes
]


@pytest.mark.gpu
@pytest.mark.parametrize("op,variant,shape", FULL)
def test_full_size_variant_matches_reference_on_gpu(op, variant, shape):
    result = check(op, variant, shape, device="cuda")
    assert result.passed, result.describe()
