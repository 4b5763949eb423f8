"""Tool-call ids: minting them, and mapping them reversibly to each client dialect's id style.

The upstream id (what the engine sees in `tool_calls[].id` and `tool_call_id`) is the canonical
one. Client dialects get an id with their customary prefix; the mapping is injective and exactly
reversible, so the id a client sends back always maps to the upstream id it was given:

* Chat: identity (the upstream already speaks Chat) for ids made only of `[A-Za-z0-9_-]`; any
  other id, such as the Kimi K2 model-native `functions.bash:0`, becomes
  `call_k3e_` + base64url(id), so clients see a proxy id while the engine gets its own back.
* Anthropic (`tool_use.id`, pattern `[A-Za-z0-9_-]+`): `toolu_…`.
* Responses (`function_call.call_id`): `call_…`.

For a prefix P and an upstream id made only of `[A-Za-z0-9_-]`, the client id is the id itself
when it already starts with P (and not with one of our markers `Pk3_`, `Pk3e_`), else
`P + "k3_" + id`. Any other id becomes `P + "k3e_" + base64url(id)`. Ids a client invents itself
pass through unchanged.
"""

from __future__ import annotations

import base64
import binascii
import re
import secrets

ANTHROPIC_PREFIX = "toolu_"
RESPONSES_PREFIX = "call_"

_SAFE = re.compile(r"[A-Za-z0-9_-]*")


def new_call_id() -> str:
    """A fresh upstream id for a call parsed out of text."""
    return "call_" + secrets.token_hex(12)


def to_client_id(upstream_id: str, prefix: str) -> str:
    """The client-facing id for `upstream_id` in a dialect whose ids start with `prefix`."""
    plain, encoded = prefix + "k3_", prefix + "k3e_"
    safe = _SAFE.fullmatch(upstream_id) is not None
    if safe and upstream_id.startswith(prefix) and not upstream_id.startswith((plain, encoded)):
        return upstream_id
    if safe:
        return plain + upstream_id
    return encoded + base64.urlsafe_b64encode(upstream_id.encode()).decode().rstrip("=")


def from_client_id(client_id: str, prefix: str) -> str:
    """Inverse of `to_client_id`; ids we did not mint come back unchanged."""
    plain, encoded = prefix + "k3_", prefix + "k3e_"
    if client_id.startswith(plain):
        return client_id[len(plain) :]
    if client_id.startswith(encoded):
        body = client_id[len(encoded) :]
        try:
            raw = base64.b64decode(body + "=" * (-len(body) % 4), altchars=b"-_", validate=True)
            upstream_id = raw.decode()
        except (binascii.Error, ValueError):
            return client_id
        # Only an id we could have minted maps back; anything else is foreign.
        return upstream_id if to_client_id(upstream_id, prefix) == client_id else client_id
    return client_id


def to_chat_id(upstream_id: str) -> str:
    """The Chat client's id: the upstream id itself when it is plain, else an encoded proxy id."""
    if _SAFE.fullmatch(upstream_id) is not None:
        return upstream_id
    return to_client_id(upstream_id, RESPONSES_PREFIX)


def from_chat_id(client_id: str) -> str:
    """Inverse of `to_chat_id`; any other id (a plain one, one the client invented) is unchanged."""
    if not client_id.startswith(RESPONSES_PREFIX + "k3e_"):
        return client_id
    upstream_id = from_client_id(client_id, RESPONSES_PREFIX)
    return upstream_id if to_chat_id(upstream_id) == client_id else client_id


def to_anthropic_id(upstream_id: str) -> str:
    return to_client_id(upstream_id, ANTHROPIC_PREFIX)


def from_anthropic_id(client_id: str) -> str:
    return from_client_id(client_id, ANTHROPIC_PREFIX)


def to_responses_id(upstream_id: str) -> str:
    return to_client_id(upstream_id, RESPONSES_PREFIX)


def from_responses_id(client_id: str) -> str:
    return from_client_id(client_id, RESPONSES_PREFIX)
