"""CanonicalRequest -> the OpenAI Chat Completions payload sent to `{upstream}/chat/completions`.

Every assistant turn of every dialect reaches the engine through `assistant_to_upstream`, and
only through it. The client's echo (text, tool calls with upstream ids, reasoning) goes to
`TurnMemory.restore` (k3.continuity), which puts back the exact engine message recorded for that
turn when it can find it: by the ledger id in an authentic signature, by the reasoning inside
one, or by the fingerprint of the visible text and tool calls. Reasoning that arrives with a
signature is only ever used through that signature: a forged or edited one brings nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from k3.config import Config
from k3.dialects.common import out_of_range_int
from k3.errors import bad_request
from k3.ir import (
    CanonicalRequest,
    ImagePart,
    Message,
    ReasoningPart,
    TextPart,
    ToolCallPart,
    ToolDef,
    ToolResultPart,
)
from k3.reasoning import render_upstream
from k3.tools import Reasoning, Text, ThinkSplitter

if TYPE_CHECKING:
    from k3.continuity import TurnMemory

TOOL_ERROR_PREFIX = "[tool error] "


def split_think(text: str) -> tuple[str, str]:
    """(visible text, reasoning) of content that carries inline `<think>…</think>`."""
    splitter = ThinkSplitter()
    events = splitter.feed(text) + splitter.finish()
    reasoning = "".join(e.text for e in events if isinstance(e, Reasoning))
    return "".join(e.text for e in events if isinstance(e, Text)), reasoning


def assistant_to_upstream(
    message: Message, config: Config, memory: TurnMemory | None = None, position: int | None = None
) -> dict[str, Any] | None:
    """The engine-side form of one assistant turn (`position` assistant turns into the history);
    None when it carries nothing at all."""
    text: list[str] = []
    reasoning: list[str] = []  # reasoning the client sent without a signature (Chat echo)
    signatures: list[str] = []
    calls: list[dict[str, Any]] = []
    for part in message.parts:
        if isinstance(part, TextPart):
            text.append(part.text)
        elif isinstance(part, ReasoningPart):
            if part.signature:
                signatures.append(part.signature)
            elif not part.redacted:
                reasoning.append(part.text)
        elif isinstance(part, ToolCallPart):
            calls.append(
                {
                    "id": part.id,
                    "type": "function",
                    "function": {"name": part.name, "arguments": part.arguments},
                }
            )
    visible = "".join(text)
    if "<think>" in visible:  # an inline-think client: the fingerprint is over visible text only
        visible, inline = split_think(visible)
        reasoning.insert(0, inline)
    echoed = "".join(reasoning)
    if not (visible or echoed or signatures or calls):
        return None
    if memory is not None:
        echo: dict[str, Any] = {"role": "assistant", "content": visible}
        if echoed:
            echo["reasoning_content"] = echoed
        if calls:
            echo["tool_calls"] = calls
        return memory.restore(echo, signatures, position)
    field = "reasoning_content" if config.reasoning_field == "auto" else config.reasoning_field
    return render_upstream({"content": visible, "reasoning": echoed, "tool_calls": calls}, field)


def _image(part: ImagePart) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": part.url}}


def _user_content(parts: list) -> str | list[dict[str, Any]]:
    if all(isinstance(p, TextPart) for p in parts):
        return "\n".join(p.text for p in parts)
    out: list[dict[str, Any]] = []
    for part in parts:
        if isinstance(part, TextPart):
            out.append({"type": "text", "text": part.text})
        elif isinstance(part, ImagePart):
            out.append(_image(part))
    return out


def tool_to_upstream(tool: ToolDef) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description, "parameters": tool.parameters},
    }


def messages_to_upstream(
    messages: list[Message], config: Config, memory: TurnMemory | None = None
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    pending_images: list[ImagePart] = []  # images returned by tools, shown after the run of results
    position = 0  # assistant turns so far (k3.continuity.assistant_turns)
    for message in messages:
        role = message.role
        if pending_images and role != "tool":
            out.append({"role": "user", "content": [_image(p) for p in pending_images]})
            pending_images = []
        if role == "assistant":
            lowered = assistant_to_upstream(message, config, memory, position)
            position += 1
            if lowered is not None:
                out.append(lowered)
        elif role == "tool":
            for part in message.parts:
                if isinstance(part, ToolResultPart):
                    content = TOOL_ERROR_PREFIX + part.content if part.is_error else part.content
                    out.append({"role": "tool", "tool_call_id": part.tool_call_id, "content": content})
                    pending_images.extend(part.images)
        elif role == "system":
            text = "\n\n".join(p.text for p in message.parts if isinstance(p, TextPart))
            if text and out and out[-1]["role"] == "system":
                out[-1]["content"] += "\n\n" + text  # chat templates want one system message, not a run
            elif text:
                out.append({"role": "system", "content": text})
        elif message.parts:
            out.append({"role": "user", "content": _user_content(message.parts)})
    if pending_images:
        out.append({"role": "user", "content": [_image(p) for p in pending_images]})
    return out


# The request's options the engine takes under the same names, in payload order.
_OPTIONS = ("max_tokens", "temperature", "top_p", "stop", "reasoning_effort", "response_format")


def _copy_given(request: CanonicalRequest, payload: dict[str, Any], names: tuple[str, ...]) -> None:
    """Copy each named option the client gave (not None, not an empty stop list) into the payload."""
    for name in names:
        value = getattr(request, name)
        if value is not None and value != []:
            payload[name] = value


def build_payload(
    request: CanonicalRequest, config: Config, upstream_model: str, memory: TurnMemory | None = None
) -> dict[str, Any]:
    """The engine payload; with `memory`, assistant turns are restored from the ledger."""
    payload: dict[str, Any] = {
        "model": upstream_model,
        "messages": messages_to_upstream(request.messages, config, memory),
        "stream": request.stream,
    }
    if request.tools:
        payload["tools"] = [tool_to_upstream(t) for t in request.tools]
        _copy_given(request, payload, ("tool_choice", "parallel_tool_calls"))
    _copy_given(request, payload, _OPTIONS)
    if request.stream:
        payload["stream_options"] = {"include_usage": True}
    for key, value in request.extra.items():
        payload.setdefault(key, value)
    return payload


def encode_payload(payload: dict[str, Any], body: dict[str, Any] | None = None) -> bytes:
    """The payload as JSON bytes. A value JSON cannot carry (an integer beyond 64 bits) is the
    client's doing: a 400 naming the field, in the client's `body` when it is there."""
    try:
        return orjson.dumps(payload)
    except TypeError as exc:
        where = (out_of_range_int(body) if body is not None else None) or out_of_range_int(payload)
        if where is None:
            raise bad_request(f"the request cannot be forwarded as JSON: {exc}") from None
        raise bad_request(
            f"{where} is an integer outside the 64-bit range JSON engines accept", where
        ) from None
