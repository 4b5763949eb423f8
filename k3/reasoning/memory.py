"""Reasoning kept across turns: record what the engine said, give the client a signature, and
put the exact upstream message back when the client returns the turn.

    memory = ReasoningMemory.open(ledger_path, reasoning_field="reasoning_content")
    # answering a request
    turn = memory.begin_turn(session, position)  # mints the ledger entry id; position: assistant
                                                  # turns before this one in the history
    turn.add(event)                               # every Text / Reasoning / ToolCall, in order
    signature = turn.sign(segment_reasoning)      # per reasoning segment, for thinking blocks / encrypted_content
    turn.commit()                                 # as soon as the upstream stream ends (idempotent)
    # next request, for each assistant message the client sent back (OpenAI-Chat form)
    upstream_message = memory.restore(message, signatures, session, position)

Restoration order: (1) the ledger entry named by an authentic signature of this session, (2)
the reasoning text carried inside such signatures, (3) the fingerprint of the visible text and
tool calls at that position in the history (clients that strip reasoning; identical turns each
get their own), else the client's own message. Signatures are HMACs
bound to the session: forged, edited, oversized or other sessions' signatures are ignored and
never reach the engine. A stored turn only replaces a client message whose tool calls (names, in
order) match it; the client's tool-call ids are kept, since the tool results refer to them.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import sqlite3
import threading

from k3.reasoning.codec import SignatureCodec
from k3.reasoning.fields import check_field, echoed_reasoning, render_upstream
from k3.reasoning.fingerprint import visible_text
from k3.reasoning.ledger import Ledger, scope_of
from k3.reasoning.secret import load_or_create_secret
from k3.tools.events import Event, Reasoning, Text, ToolCall

log = logging.getLogger("k3.reasoning")


def session_key(*parts: str | None) -> str:
    """A session key from what identifies a client (auth header or API key, client preset, …).

    Hashed, so the raw credential never travels further than this call.
    """
    joined = "\0".join(p or "" for p in parts)
    return hashlib.sha256(b"k3-session\0" + joined.encode("utf-8", "surrogatepass")).hexdigest()


def _tool_names(message: dict) -> list[str]:
    names = []
    for call in message.get("tool_calls") or []:
        fn = call.get("function") if isinstance(call, dict) else None
        names.append(fn.get("name", "") if isinstance(fn, dict) else "")
    return names


class RecordedTurn:
    """One upstream response being recorded (see the module docstring)."""

    def __init__(self, memory: ReasoningMemory, session: str, position: int | None = None) -> None:
        self.entry_id = secrets.token_hex(16)
        self.position = position
        self.field: str | None = None  # the detected reasoning field, when the memory runs on "auto"
        self._memory, self._session = memory, session
        self._segments: list[tuple[str, list[str]]] = []  # ("reasoning" | "text", pieces), in order
        self._calls: list[dict] = []
        self._committed = False

    def add(self, event: Event) -> None:
        if isinstance(event, ToolCall):
            self._calls.append(
                {
                    "id": event.id,
                    "type": "function",
                    "function": {"name": event.name, "arguments": event.arguments},
                }
            )
            return
        if not isinstance(event, Reasoning | Text) or not event.text:
            return
        kind = "reasoning" if isinstance(event, Reasoning) else "text"
        if not self._segments or self._segments[-1][0] != kind:
            self._segments.append((kind, []))
        self._segments[-1][1].append(event.text)

    def sign(self, reasoning: str) -> str:
        """The signature for one reasoning segment: the entry id, the session tag and (when it
        fits) the segment text, so the reasoning survives even a ledger miss."""
        payload = {"i": self.entry_id, "s": self._memory.session_tag(self._session), "r": reasoning}
        try:
            return self._memory.codec.sign(payload)
        except ValueError:
            del payload["r"]
            return self._memory.codec.sign(payload)

    def record(self) -> dict:
        """The turn as stored: visible text, reasoning and raw tool calls (segments if interleaved)."""
        segments = [[kind, "".join(pieces)] for kind, pieces in self._segments]
        content = "".join(t for kind, t in segments if kind == "text")
        reasoning = "".join(t for kind, t in segments if kind == "reasoning")
        record = {"content": content, "reasoning": reasoning, "tool_calls": self._calls}
        if sum(kind == "reasoning" for kind, _ in segments) > 1 or (
            segments and segments[0][0] == "text" and reasoning
        ):
            record["segments"] = segments
        if self.field:
            record["field"] = self.field
        return record

    def commit(self) -> None:
        """Write the turn to the ledger once; later calls do nothing."""
        if self._committed:
            return
        self._committed = True
        self._memory.remember(self._session, self.entry_id, self.record(), self.position)


class ReasoningMemory:
    def __init__(
        self, ledger: Ledger, codec: SignatureCodec, reasoning_field: str = "reasoning_content"
    ) -> None:
        self.ledger, self.codec = ledger, codec
        self.reasoning_field = reasoning_field if reasoning_field == "auto" else check_field(reasoning_field)
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(("signature_restores", "rejected_signatures", "write_errors"), 0)

    @classmethod
    def open(
        cls,
        ledger_path: str | None = None,
        *,
        reasoning_field: str = "reasoning_content",
        secret_dir: str | None = None,
        max_entries: int = 4096,
        max_bytes: int = 128 << 20,
        ttl_s: float = 7 * 24 * 3600,
        max_signature_bytes: int = 1 << 20,
    ) -> ReasoningMemory:
        """Open the ledger (in memory when `ledger_path` is None) and the signing secret.

        The secret lives in `secret_dir`, by default the ledger's directory; with neither, it is
        random per process and signatures stop verifying after a restart (as does the ledger).
        """
        ledger = Ledger(ledger_path, max_entries=max_entries, max_bytes=max_bytes, ttl_s=ttl_s)
        directory = secret_dir or (os.path.dirname(os.path.abspath(ledger_path)) if ledger_path else None)
        secret = load_or_create_secret(directory) if directory else secrets.token_bytes(32)
        return cls(ledger, SignatureCodec(secret, max_signature_bytes), reasoning_field)

    def close(self) -> None:
        self.ledger.close()

    def begin_turn(self, session: str, position: int | None = None) -> RecordedTurn:
        return RecordedTurn(self, session, position)

    def session_tag(self, session: str) -> str:
        return scope_of(session)[:16]

    def remember(self, session: str, entry_id: str, record: dict, position: int | None = None) -> None:
        try:
            self.ledger.put(session, entry_id, record, position)
        except sqlite3.Error:  # losing one turn's memory must not fail the response
            log.exception("ledger write failed")
            self._count("write_errors")

    def restore(
        self, message: dict, signatures: str | list[str] | None, session: str, position: int | None = None
    ) -> dict:
        """The upstream assistant message to send for a client's assistant message, the one with
        `position` assistant messages before it in the history."""
        payloads = []
        for signature in [signatures] if isinstance(signatures, str) else signatures or []:
            payload = self.codec.verify(signature)
            if payload is None or payload.get("s") != self.session_tag(session):
                self._count("rejected_signatures")
                continue
            payloads.append(payload)
        for entry_id in dict.fromkeys(p["i"] for p in payloads if isinstance(p.get("i"), str)):
            record = self.ledger.get(session, entry_id)
            if record is not None and self._matches(record, message):
                return self._render(record, message)
        texts = [p["r"] for p in payloads if isinstance(p.get("r"), str)]
        if texts:
            self._count("signature_restores")
            return self._render(self._client_record(message, "".join(texts)), message)
        record = self.ledger.find(session, message, position)
        if record is not None and self._matches(record, message):
            return self._render(record, message)
        return self._render(self._client_record(message, echoed_reasoning(message)), message)

    def stats(self) -> dict:
        with self._lock:
            counts = dict(self._counts)
        return {**self.ledger.stats(), **counts}

    def _count(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1

    @staticmethod
    def _matches(record: dict, message: dict) -> bool:
        return _tool_names(record) == _tool_names(message)

    @staticmethod
    def _client_record(message: dict, reasoning: str) -> dict:
        return {
            "content": visible_text(message.get("content")),
            "reasoning": reasoning,
            "tool_calls": list(message.get("tool_calls") or []),
        }

    def _render(self, record: dict, message: dict) -> dict:
        field = self.reasoning_field
        if field == "auto":
            field = record.get("field") or "reasoning_content"
        upstream = render_upstream(record, field)
        for call, client_call in zip(
            upstream.get("tool_calls", []), message.get("tool_calls") or [], strict=False
        ):
            if isinstance(client_call, dict) and isinstance(client_call.get("id"), str) and client_call["id"]:
                call["id"] = client_call["id"]
        return upstream
