"""Reasoning continuity: the proxy's side of k3.reasoning.

A turn that produced reasoning or tool calls is recorded in the ledger (reasoning text, visible
text, raw tool-call argument strings, upstream ids) and each reasoning segment shown to the
client is signed. When the client sends that turn back, `TurnMemory.restore` puts the recorded
engine message in its place (k3.reasoning.memory gives the lookup order and the security rules).

Sessions: entries and signatures belong to the client that received them, identified by its
credential (x-api-key or Authorization), its preset and, when it sends one, its own session
header (Claude Code, Codex, opencode). Nothing is hashed or written for a turn that needs none of
this: a plain text answer is not recorded.
"""

from __future__ import annotations

from k3.config import Config
from k3.ir import Message, Part, ReasoningPart, TextPart, ToolCallPart
from k3.reasoning import ReasoningMemory, session_key
from k3.reasoning.memory import RecordedTurn
from k3.tools.events import Reasoning, Text, ToolCall

SESSION_HEADERS = ("x-claude-code-session-id", "session-id", "x-session-id")


def open_memory(config: Config) -> ReasoningMemory:
    return ReasoningMemory.open(
        config.ledger_path,
        reasoning_field=config.reasoning_field,
        secret_dir=config.state_dir,
        max_entries=config.ledger_max_entries,
        max_bytes=config.ledger_max_bytes,
        ttl_s=config.ledger_ttl,
    )


def assistant_turns(messages: list[Message]) -> int:
    """How many assistant turns a history holds: the position of the turn that answers it, and
    (counted up to a message) that message's position, so a repeated turn finds its own record."""
    return sum(1 for message in messages if message.role == "assistant")


def _session_header(headers: dict[str, str]) -> str | None:
    for name in SESSION_HEADERS:
        value = headers.get(name)
        if value:
            return value
    return None


class TurnMemory:
    """One request's access to the memory: restore on the way in, sign and record on the way out."""

    __slots__ = ("_memory", "_headers", "_preset", "_position", "_key", "_turn", "committed")

    def __init__(
        self, memory: ReasoningMemory, headers: dict[str, str], preset: str, position: int | None = None
    ) -> None:
        """`position`: the reply's place in the conversation (`assistant_turns` of the request)."""
        self._memory = memory
        self._position = position
        self._headers = headers
        self._preset = preset
        self._key: str | None = None
        self._turn: RecordedTurn | None = None
        self.committed = False

    @property
    def session(self) -> str:
        if self._key is None:
            headers = self._headers
            credential = headers.get("x-api-key") or headers.get("authorization")
            self._key = session_key(credential, self._preset, _session_header(headers))
        return self._key

    def restore(self, message: dict, signatures: list[str], position: int | None = None) -> dict:
        """The engine's form of a client assistant message (OpenAI-Chat, upstream tool-call ids),
        `position` assistant messages into the history."""
        return self._memory.restore(message, signatures, self.session, position)

    def sign(self, reasoning: str) -> str:
        """The signature of one reasoning segment of this turn (thinking signature, encrypted_content)."""
        return self._ledger_turn().sign(reasoning)

    def skip(self) -> None:
        """Nothing of this turn needs restoring later (a plain text answer): record nothing."""
        self.committed = True

    def commit(self, parts: list[Part], field: str | None) -> None:
        """Record the turn once. The caller skips turns with nothing to restore later (no
        reasoning, no tool call); `field` is the reasoning field the reply used (for `auto`).
        """
        if self.committed:
            return
        self.committed = True
        turn = self._ledger_turn()
        turn.field = field
        for part in parts:
            if isinstance(part, TextPart):
                turn.add(Text(part.text))
            elif isinstance(part, ReasoningPart):
                turn.add(Reasoning(part.text))
            elif isinstance(part, ToolCallPart):
                turn.add(ToolCall(part.id, part.name, part.arguments))
        turn.commit()

    def _ledger_turn(self) -> RecordedTurn:
        if self._turn is None:
            self._turn = self._memory.begin_turn(self.session, self._position)
        return self._turn
