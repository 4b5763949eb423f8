"""Authenticated, self-contained signatures (Anthropic `signature`, Responses `encrypted_content`).

Format: `k3s1.` + base64url(no padding) of HMAC-SHA256(secret, blob) ‖ blob, where blob is the
zlib-compressed compact JSON payload. The MAC is checked before anything is inflated, and
inflating is bounded, so a forged, edited, truncated, oversized or foreign signature costs
little and yields None; `verify` never raises.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import zlib

PREFIX = "k3s1."
_MAC_BYTES = 32


class SignatureCodec:
    def __init__(self, secret: bytes, max_bytes: int = 1 << 20) -> None:
        if len(secret) < 32:
            raise ValueError("the signing secret must be at least 32 bytes")
        self._secret = secret
        self.max_bytes = max_bytes
        # zlib never grows data by more than ~0.1 % plus a small header.
        self._max_blob = max_bytes + max_bytes // 1000 + 64
        self._max_chars = len(PREFIX) + 4 * -(-(_MAC_BYTES + self._max_blob) // 3)

    def sign(self, payload: dict) -> str:
        """Encode `payload`; raises ValueError if its JSON exceeds `max_bytes`."""
        raw = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")
        if len(raw) > self.max_bytes:
            raise ValueError(f"signature payload of {len(raw)} bytes exceeds {self.max_bytes}")
        blob = zlib.compress(raw, 6)
        mac = hmac.new(self._secret, blob, hashlib.sha256).digest()
        return PREFIX + base64.urlsafe_b64encode(mac + blob).decode().rstrip("=")

    def verify(self, signature: object) -> dict | None:
        """The payload of a signature this install minted, or None for anything else."""
        if (
            not isinstance(signature, str)
            or not signature.startswith(PREFIX)
            or len(signature) > self._max_chars
        ):
            return None
        body = signature[len(PREFIX) :]
        try:
            data = base64.b64decode(body + "=" * (-len(body) % 4), altchars=b"-_", validate=True)
        except (binascii.Error, ValueError):
            return None
        mac, blob = data[:_MAC_BYTES], data[_MAC_BYTES:]
        if not blob or not hmac.compare_digest(mac, hmac.new(self._secret, blob, hashlib.sha256).digest()):
            return None
        inflater = zlib.decompressobj()
        try:
            raw = inflater.decompress(blob, self.max_bytes + 1)
        except zlib.error:
            return None
        if len(raw) > self.max_bytes or not inflater.eof or inflater.unused_data:
            return None
        try:
            payload = json.loads(raw.decode("utf-8", "surrogatepass"))
        except (ValueError, RecursionError):
            return None
        return payload if isinstance(payload, dict) else None
