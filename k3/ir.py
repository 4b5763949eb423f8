"""The canonical IR between the three client dialects and the upstream OpenAI-Chat engine.

Two invariants every module keeps:

1. `ToolCallPart.arguments` and `ToolCallEnd.arguments` are the raw JSON *string* the model
   produced (or the client echoed). Nothing re-serialises them on the way back upstream.
2. Reasoning text is carried verbatim, byte for byte, in `ReasoningPart.text` and in the
   `ReasoningDelta` events.

Requests are lowered into `CanonicalRequest`; the upstream reply (JSON or SSE) is turned into
one canonical event stream (`Event`), which feeds both the streaming and the JSON egress of
every dialect.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["system", "user", "assistant", "tool"]
StopReason = Literal["stop", "length", "tool_calls", "content_filter"]

# ---------------------------------------------------------------------------------------------
# Message parts


@dataclass(slots=True)
class TextPart:
    text: str


@dataclass(slots=True)
class ImagePart:
    url: str  # an http(s) URL or a `data:<media>;base64,...` URI, exactly as the engine gets it


@dataclass(slots=True)
class ReasoningPart:
    text: str
    signature: str | None = None  # opaque token a client echoed (thinking signature, encrypted_content)
    redacted: bool = False


@dataclass(slots=True)
class ToolCallPart:
    id: str
    name: str
    arguments: str  # raw JSON string, never re-serialised
    custom: bool = False  # a Responses freeform (custom) tool call: arguments are {"input": "..."}


@dataclass(slots=True)
class ToolResultPart:
    tool_call_id: str
    content: str
    is_error: bool = False
    images: list[ImagePart] = field(default_factory=list)


Part = TextPart | ImagePart | ReasoningPart | ToolCallPart | ToolResultPart


@dataclass(slots=True)
class Message:
    role: Role
    parts: list[Part]


@dataclass(slots=True)
class ToolDef:
    name: str
    description: str
    parameters: dict[str, Any]
    custom: bool = False  # Responses freeform tool, exposed upstream as a function with one `input` string


@dataclass(slots=True)
class CanonicalRequest:
    """One client turn, dialect-free. `model` is what the client asked for (echoed back to it)."""

    model: str
    messages: list[Message]
    stream: bool = False
    tools: list[ToolDef] = field(default_factory=list)
    # Already in OpenAI Chat form: "auto" | "none" | "required" | {"type":"function","function":{"name":..}}
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: list[str] = field(default_factory=list)
    reasoning_effort: str | None = None
    thinking_enabled: bool | None = None  # Anthropic `thinking.type == "disabled"` gives False
    include_usage: bool | None = None  # Chat `stream_options.include_usage`
    response_format: Any = None
    extra: dict[str, Any] = field(default_factory=dict)  # engine keys forwarded verbatim (seed, top_k, ...)


@dataclass(slots=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    reasoning_tokens: int = 0


# ---------------------------------------------------------------------------------------------
# Canonical stream events (upstream -> client). Ordering contract:
#  * ReasoningDelta* is always closed by one ReasoningEnd before any text or tool call follows;
#    reasoning may reopen later (interleaved thinking), as a new segment.
#  * ToolCallStart(i), ToolCallDelta(i)*, ToolCallEnd(i) for each call; calls never interleave.
#  * Finish is the last event, exactly once.


@dataclass(slots=True)
class TextDelta:
    text: str


@dataclass(slots=True)
class ReasoningDelta:
    text: str


@dataclass(slots=True)
class ReasoningEnd:
    text: str  # the whole segment
    signature: str | None = None  # k3/reasoning's signature of the segment, when the client is shown it


@dataclass(slots=True)
class ToolCallStart:
    index: int
    id: str
    name: str


@dataclass(slots=True)
class ToolCallDelta:
    index: int
    text: str


@dataclass(slots=True)
class ToolCallEnd:
    index: int
    id: str
    name: str
    arguments: str  # the full raw argument string: the concatenation of the deltas


@dataclass(slots=True)
class Finish:
    stop_reason: StopReason
    usage: Usage
    stop_sequence: str | None = None  # the matched stop string, when the engine reports it


Event = TextDelta | ReasoningDelta | ReasoningEnd | ToolCallStart | ToolCallDelta | ToolCallEnd | Finish


@dataclass(slots=True)
class CanonicalResponse:
    """A whole reply, folded from the event stream (JSON egress)."""

    parts: list[Part]
    stop_reason: StopReason
    usage: Usage
    stop_sequence: str | None = None
