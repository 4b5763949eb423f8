import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.codec import (
    CodecError,
    LinearWeight,
    dequantize,
    group_squared_error,
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
    rounding=st.sampled_from(["absmax", "signed"]),
)
def test_roundtrip_bound_holds_across_magnitudes(rows, groups, magnitude, seed, rounding):
    w = (torch.randn(rows, groups * 32, generator=torch.Generator().manual_seed(seed)) * magnitude).to(
        torch.bfloat16
    )
    q = quantize(w, "int4", 32, rounding=rounding)
    assert ((dequantize(q) - w.float()).abs() <= roundtrip_error_bound(q, rounding)).all()


@pytest.mark.parametrize("fmt,qmax", [("int4", 7), ("int8", 127)])
@pytest.mark.parametrize("group", [32, 128])
@pytest.mark.parametrize("scale_dtype", [torch.bfloat16, torch.float16])
def test_signed_rounding_gives_the_extreme_the_extra_level(fmt, qmax, group, scale_dtype):
    """Each group's extreme encodes as -(QMAX + 1) exactly, its scale taking the extreme's sign; every element
    is within one step (a value of the other sign clamps at QMAX), and the squared error is below absmax's."""
    w = _weight(seed=group + qmax)
    q = quantize(w, fmt, group, scale_dtype, rounding="signed")
    codes = integer_codes(q).view(24, -1, group)
    assert codes.min() >= -qmax - 1 and codes.max() <= qmax
    extreme_at = w.float().view(24, -1, group).abs().argmax(-1, keepdim=True)
    assert (codes.gather(-1, extreme_at) == -qmax - 1).all()
    extreme = w.float().view(24, -1, group).gather(-1, extreme_at).squeeze(-1)
    assert torch.equal(q.scales < 0, extreme > 0)  # both signs occur in a random weight
    ratio = (dequantize(q) - w.float()).abs() / roundtrip_error_bound(q, "signed")
    assert ratio.max() <= 1.0
    if fmt == "int4":  # and is needed: some other-sign value lies beyond QMAX + 0.5 steps and clamps
        assert ratio.max() > 0.5
    absmax = quantize(w, fmt, group, scale_dtype)
    assert group_squared_error(q, w).sum() < group_squared_error(absmax, w).sum()


def test_the_bound_refuses_a_rounding_it_does_not_cover():
    with pytest.raises(CodecError, match="mse"):
        roundtrip_error_bound(quantize(_weight(), "int4", 32), "mse")


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


def _random_groups(kind: str, seed: int) -> torch.Tensor:
    """Rows of groups from several distributions: normal, heavy-tailed, uniform, and one outlier per row."""
    gen = torch.Generator().manual_seed(seed)
    shape = (64, 256)
    if kind == "normal":
        return torch.randn(shape, generator=gen)
    if kind == "heavy":
        return torch.randn(shape, generator=gen) / torch.rand(shape, generator=gen).clamp_min(0.05)
    if kind == "uniform":
        return torch.rand(shape, generator=gen) * 2 - 1
    w = torch.randn(shape, generator=gen) * 0.01
    w[torch.arange(64), torch.randint(0, 256, (64,), generator=gen)] = 1.0
    return w


@pytest.mark.parametrize("kind", ["normal", "heavy", "uniform", "outlier"])
@pytest.mark.parametrize("fmt", ["int4", "int8"])
@pytest.mark.parametrize("group", [32, 64])
@pytest.mark.parametrize("scale_dtype", [torch.bfloat16, torch.float16])
def test_mse_rounding_never_has_a_larger_group_error_than_absmax(kind, fmt, group, scale_dtype):
    w = _random_groups(kind, seed=group + len(kind))
    absmax = quantize(w, fmt, group, scale_dtype)
    mse = quantize(w, fmt, group, scale_dtype, rounding="mse")
    error_absmax, error_mse = group_squared_error(absmax, w), group_squared_error(mse, w)
    assert (
        error_mse <= error_absmax
    ).all()  # tolerance 0: absmax is one of the candidates, kept unless beaten
    assert error_mse.sum() < error_absmax.sum()  # and the search does find better scales
    # The same layout: dtypes, shapes, positive finite scales and codes the decoders (and kernels) accept.
    assert mse.data.dtype == absmax.data.dtype and mse.data.shape == absmax.data.shape
    assert mse.scales.dtype == scale_dtype and mse.scales.shape == absmax.scales.shape
    assert torch.isfinite(mse.scales.float()).all() and (mse.scales > 0).all()
    qmax = 7 if fmt == "int4" else 127
    codes = integer_codes(mse)
    assert codes.min() >= -qmax - 1 and codes.max() <= qmax
    # Codes are the nearest ones against the stored scale: dequantised values are code * scale exactly.
    assert torch.equal(
        dequantize(mse), (codes.float().view(64, -1, group) * mse.scales.float()[..., None]).view(64, -1)
    )


def test_mse_rounding_keeps_zero_groups_and_refuses_unknown_rules():
    w = torch.zeros(2, 64)
    w[1, 32:] = torch.randn(32)
    q = quantize(w, "int4", 32, rounding="mse")
    assert (integer_codes(q)[0] == 0).all() and q.scales[0, 0] == 1 and group_squared_error(q, w)[0, 0] == 0
    with pytest.raises(CodecError, match="rounding"):
        quantize(w, "int4", 32, rounding="nearest")
