"""`PackedEmbedding` against the dequantised table: a lookup of INT4 / INT8 rows equals the same rows of
`dequantize(quantize(table))`, exactly in FP32 (dequantisation is exact) and after one BF16 rounding in BF16,
and it dequantises only the looked-up rows."""

from __future__ import annotations

import pytest
import torch

import engine.quant.packed as packed
from engine.quant import LinearWeight, PackedEmbedding, dequantize, quantize


@pytest.mark.parametrize("fmt", ["int4", "int8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lookup_equals_the_dequantised_rows(fmt, dtype):
    rng = torch.Generator().manual_seed(11)
    table = torch.randn(300, 96, generator=rng) * torch.rand(300, 1, generator=rng)  # rows of unequal scale
    weight = quantize(table, fmt, 32)
    embedding = PackedEmbedding(weight, dtype=dtype)
    ids = torch.randint(0, 300, (3, 7), generator=rng)
    ids[0, 0], ids[-1, -1] = 0, 299  # first and last rows
    got = torch.full((3, 7, 96), float("nan"), dtype=dtype)  # poisoned: every element must be written
    got.copy_(embedding(ids))
    want = dequantize(weight)[ids].to(dtype)
    assert got.dtype == dtype and torch.equal(got, want)  # tolerance 0: the same exact values


def test_a_lookup_dequantises_only_its_rows(monkeypatch):
    weight = quantize(torch.randn(1000, 64, generator=torch.Generator().manual_seed(2)), "int4", 32)
    embedding = PackedEmbedding(weight, dtype=torch.float32)
    seen = []
    real = packed.dequantize

    def spy(rows, dtype=torch.float32):
        seen.append(rows.shape)
        return real(rows, dtype)

    monkeypatch.setattr(packed, "dequantize", spy)
    embedding(torch.tensor([[5, 999]]))
    assert seen == [(2, 64)]


def test_a_dense_table_is_refused():
    with pytest.raises(ValueError, match="quantised"):
        PackedEmbedding(LinearWeight("dense", torch.randn(4, 32)), dtype=torch.float32)
