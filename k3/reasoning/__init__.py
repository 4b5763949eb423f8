"""Reasoning across turns: signatures, the ledger, fingerprints and restoration.

Public interface:

* `ReasoningMemory.open(ledger_path=None, *, reasoning_field="reasoning_content",
  secret_dir=None, max_entries=4096, max_bytes=128 MiB, ttl_s=7 days, max_signature_bytes=1 MiB)`
  – the one object the proxy holds (`reasoning_field` may be "auto": each turn is then sent back
  in the reasoning field detected for it, `RecordedTurn.field`).
  * `begin_turn(session, position=None) -> RecordedTurn` (`position`: how many assistant turns
    precede this one in the conversation; not `k3.dialects.common.Turn`, the client's turn): its
    `entry_id`, `field`, `add(event)` for every `k3.tools` event in order, `sign(segment_text) -> str`
    (thinking-block signature / `encrypted_content`), `commit()` (idempotent; call it when the
    upstream stream ends, before the last client bytes, and again in a `finally`).
  * `restore(message, signatures, session, position=None) -> dict`: the exact upstream assistant
    message for a client's assistant message (`position` assistant messages before it) (OpenAI-Chat form, tool-call ids already mapped back to upstream
    ids); `signatures` is the turn's signature(s) or None.
  * `stats()` – entries, bytes, hits, misses, fingerprint_hits, fingerprint_misses, evictions,
    expired, signature_restores, rejected_signatures, write_errors. `close()`.
* `session_key(*parts) -> str` – hash of what identifies a client (auth header, preset, …).
* `SignatureCodec(secret, max_bytes)` (`sign(payload) -> str`, `verify(sig) -> dict | None`),
  `Ledger(path, *, max_entries, max_bytes, ttl_s)` (`put/get/find/stats/close`),
  `load_or_create_secret(directory)`, `fingerprint(message)`.
* `REASONING_FIELDS`, `render_upstream(record, field)`, `detect_reasoning_field(delta)`.
"""

from k3.reasoning.codec import SignatureCodec
from k3.reasoning.fields import REASONING_FIELDS, detect_reasoning_field, render_upstream
from k3.reasoning.fingerprint import fingerprint
from k3.reasoning.ledger import Ledger
from k3.reasoning.memory import ReasoningMemory, RecordedTurn, session_key
from k3.reasoning.secret import load_or_create_secret

__all__ = [
    "REASONING_FIELDS",
    "Ledger",
    "RecordedTurn",
    "ReasoningMemory",
    "SignatureCodec",
    "detect_reasoning_field",
    "fingerprint",
    "load_or_create_secret",
    "render_upstream",
    "session_key",
]
