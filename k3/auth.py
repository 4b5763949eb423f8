"""`--api-key`: every route that serves a turn or shows configuration needs the key, sent as
`x-api-key` (Anthropic) or `Authorization: Bearer` (OpenAI); compared in constant time."""

from __future__ import annotations

import hmac

from k3.errors import ProxyError


def unauthorized() -> ProxyError:
    return ProxyError(401, "missing or invalid credentials", code="invalid_api_key")


class ApiKey:
    def __init__(self, key: str | None) -> None:
        self._key = key.encode() if key else None

    @property
    def enabled(self) -> bool:
        return self._key is not None

    def allows(self, headers: dict[str, str]) -> bool:
        if self._key is None:
            return True
        candidates = [headers.get("x-api-key", "")]
        auth = headers.get("authorization", "")
        if auth[:7].lower() == "bearer ":
            candidates.append(auth[7:].strip())
        ok = False
        for candidate in candidates:
            if candidate:
                ok |= hmac.compare_digest(candidate.encode(), self._key)
        return ok

    def check(self, headers: dict[str, str]) -> None:
        """Raise the 401 unless the headers carry the key."""
        if not self.allows(headers):
            raise unauthorized()
