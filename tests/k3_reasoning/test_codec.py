"""Signature codec: round trips, authentication, and bounded decoding."""

import base64
import hashlib
import hmac
import os
import tracemalloc
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from k3.reasoning import SignatureCodec
from k3.reasoning.codec import PREFIX

SECRET = os.urandom(32)


def codec(max_bytes: int = 1 << 20) -> SignatureCodec:
    return SignatureCodec(SECRET, max_bytes)


def forge(blob: bytes, secret: bytes = SECRET) -> str:
    """A signature with a valid MAC around an arbitrary blob (what a leaked secret would allow)."""
    mac = hmac.new(secret, blob, hashlib.sha256).digest()
    return PREFIX + base64.urlsafe_b64encode(mac + blob).decode().rstrip("=")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "plain",
        "line\nbreaks\r\n",
        "unicode: 漢字 🎉 é",
        "trailing   ",
        '{"r": "x", "i": 1}',
        "k3s1.abc",
        "\x00\ud800",
    ],
)
def test_round_trip_and_url_safe_alphabet(text):
    payload = {"i": "0123abcd", "s": "tag", "r": text}
    signature = codec().sign(payload)
    assert signature.startswith(PREFIX)
    assert set(signature[len(PREFIX) :]) <= set(
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    )
    assert codec().verify(signature) == payload


def test_realistic_prose_compresses_and_round_trips():
    prose = "The user wants the weather in Paris, so I will call the tool and then summarise. " * 2500
    signature = codec().sign({"r": prose})
    assert len(signature) < len(prose) // 10
    assert codec().verify(signature) == {"r": prose}


def test_payload_over_the_cap_is_refused_at_signing():
    with pytest.raises(ValueError, match="exceeds"):
        codec(1000).sign({"r": "x" * 2000})


@pytest.mark.parametrize(
    "bad",
    [
        None,
        5,
        b"k3s1.x",
        "",
        "garbage",
        "k3s1",
        PREFIX,
        PREFIX + "!!!!",
        PREFIX + "////",
        PREFIX + "====",
        "EqQKCkYIBxgCKkD-genuine-anthropic-signature",
        "k3r1.eJwrSS0uAQAEXQHB",
        "k3l1.abc",
    ],
)
def test_garbage_and_foreign_signatures_give_none(bad):
    assert codec().verify(bad) is None


def test_another_install_or_an_edited_signature_is_rejected():
    signature = codec().sign({"i": "abc", "r": "secret reasoning"})
    assert SignatureCodec(os.urandom(32)).verify(signature) is None
    body = signature[len(PREFIX) :]
    for pos in range(0, len(body), 3):
        flipped = "A" if body[pos] != "A" else "B"
        edited = PREFIX + body[:pos] + flipped + body[pos + 1 :]
        assert codec().verify(edited) in (None, codec().verify(signature))  # base64 slack bits only
    assert codec().verify(signature[:-4]) is None  # truncated


def test_authentic_but_malformed_blobs_are_rejected():
    assert codec().verify(forge(b"not zlib")) is None
    assert codec().verify(forge(zlib.compress(b"[1, 2]"))) is None  # JSON, not an object
    assert codec().verify(forge(zlib.compress(b"{bad json"))) is None
    assert codec().verify(forge(zlib.compress(b'{"a": 1}')[:-3])) is None  # stream never ends
    assert codec().verify(forge(zlib.compress(b'{"a": 1}') + b"junk")) is None


def test_oversized_signature_is_rejected_before_decoding():
    small = codec(1000)
    huge = PREFIX + "A" * 50_000_000
    assert small.verify(huge) is None


def test_zlib_bomb_is_not_inflated_even_with_a_valid_mac():
    packer, block = zlib.compressobj(9), bytes(1 << 20)
    bomb = b"".join(packer.compress(block) for _ in range(128)) + packer.flush()  # 128 MiB of zeros
    assert len(bomb) < 256 << 10
    signature = forge(bomb)
    tracemalloc.start()
    assert codec(1 << 20).verify(signature) is None
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 8 << 20
    # the inflate cap holds even when the blob itself is small enough to pass the length gate
    assert codec(4096).verify(forge(zlib.compress(b"{" + b" " * 100_000 + b"}"))) is None


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(
        st.text(max_size=300),
        st.text(max_size=300).map(lambda s: PREFIX + s),
        st.binary(max_size=300).map(lambda b: PREFIX + base64.urlsafe_b64encode(b).decode()),
    )
)
def test_verify_never_raises(candidate):
    assert codec().verify(candidate) is None


def test_short_secret_is_refused():
    with pytest.raises(ValueError):
        SignatureCodec(b"short")
