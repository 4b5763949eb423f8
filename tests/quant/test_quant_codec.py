import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.codec import (
    CodecError,
    LinearWeight,
    dequantize,
    integer_codes,
    pack_int4,
    quantize,
    roundtrip_error_bound,
    unpack_int4,
)


def _weight(n=24, k=128, seed=0, scale=0.05) -> torch.Tensor:
    return (torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * scale).to(torch.bfloat16)


def test_every_byte_unpacks_to_its_two_signed_nibbles_low_first():
    packed = torch.arange(256, dtype=torch.uint8).reshape(1, 256)
    codes = unpack_int4(packed).reshape(256, 2).to(torch.int32)
    for byte in range(256):
        low, high = byte & 0xF, byte >> 4
        assert codes[byte, 0] == (low - 16 if low >= 8 else low)  # input 2j: low nibble
        assert codes[byte, 1] == (high - 16 if high >= 8 else high)  # input 2j+1: high nibble
    assert torch.equal(pack_int4(unpack_int4(packed)), packed)


def test_documented_nibble_order_on_a_concrete_row():
    codes = torch.tensor([[1, -2, 7, -8]], dtype=torch.int8)
    assert pack_int4(codes).tolist() == [[0xE1, 0x87]]


@pytest.mark.parametrize("fmt,qmax", [("int4", 7), ("int8", 127)])
@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("scale_dtype", [torch.bfloat16, torch.float16])
def test_roundtrip_within_half_a_step(fmt, qmax, group, scale_dtype):
    w = _weight(seed=group)
    q = quantize(w, fmt, group, scale_dtype)
    assert q.shape == tuple(w.shape) and q.scales.dtype == scale_dtype
    assert integer_codes(q).abs().max() <= qmax
    ratio = (dequantize(q) - w.float()).abs() / roundtrip_error_bound(q)
    assert ratio.max() <= 1.0
    assert ratio.max() > 0.5  # the bound is tight, not vacuous


@settings(max_examples=30, deadline=None)
@given(
    rows=st.integers(1, 5),
    groups=st.integers(1, 4),
    magnitude=st.sampled_from([1e-30, 1e-6, 1.0, 1e4]),
    seed=st.integers(0, 2**16),
)
def test_roundtrip_bound_holds_across_magnitudes(rows, groups, magnitude, seed):
    w = (torch.randn(rows, groups * 32, generator=torch.Generator().manual_seed(seed)) * magnitude).to(
        torch.bfloat16
    )
    q = quantize(w, "int4", 32)
    assert ((dequantize(q) - w.float()).abs() <= roundtrip_error_bound(q)).all()


def test_dequantize_is_exact_in_fp32():
    q = quantize(_weight(), "int4", 32)
    expected = integer_codes(q).double().reshape(24, 4, 32) * q.scales.double().unsqueeze(-1)
    assert torch.equal(dequantize(q).double(), expected.reshape(24, 128))


def test_zero_group_gets_unit_scale_and_zero_codes():
    w = _weight()
    w[3, 32:64] = 0
    q = quantize(w, "int4", 32)
    assert q.scales[3, 1] == 1.0
    assert (dequantize(q)[3, 32:64] == 0).all()


@pytest.mark.parametrize(
    "damage",
    ["swap_nibbles", "double_scales", "scales_along_wrong_axis"],
)
def test_negative_controls_break_the_bound(damage):
    """The bound check must be able to fail: each classic decoder bug is caught."""
    w = _weight(n=64, k=128)
    q = quantize(w, "int4", 32)
    if damage == "swap_nibbles":
        bad = LinearWeight("int4", (q.data >> 4) | (q.data << 4), q.scales, 32)
    elif damage == "double_scales":
        bad = LinearWeight("int4", q.data, q.scales * 2, 32)
    else:
        bad = LinearWeight(
            "int4", q.data, q.scales.reshape(-1)[torch.randperm(q.scales.numel())].reshape(64, 4), 32
        )
    assert ((dequantize(bad) - w.float()).abs() > roundtrip_error_bound(q)).any()


def test_leading_axes_quantise_each_matrix_independently():
    bank = torch.stack([_weight(seed=s) for s in range(3)])
    q = quantize(bank, "int4", 32)
    assert q.data.shape == (3, 24, 64) and q.scales.shape == (3, 24, 4)
    assert torch.equal(q.data[1], quantize(bank[1], "int4", 32).data)


@pytest.mark.parametrize(
    "tensor,group,message",
    [
        (torch.zeros(4, 48), 32, "not a multiple of the group size"),
        (torch.zeros(8), 32, "only matrices"),
        (torch.tensor([[float("inf")] * 32]), 32, "inf or NaN"),
    ],
)
def test_refuses_what_it_cannot_encode(tensor, group, message):
    with pytest.raises(CodecError, match=message):
        quantize(tensor, "int4", group)


def test_fp16_scale_overflow_is_refused():
    with pytest.raises(CodecError, match="overflows"):
        quantize(torch.full((1, 32), 1e6), "int4", 32, torch.float16)


def test_linear_weight_checks_scale_shape():
    with pytest.raises(CodecError, match="scales have shape"):
        LinearWeight("int4", torch.zeros(4, 16, dtype=torch.uint8), torch.zeros(4, 2), 32)
