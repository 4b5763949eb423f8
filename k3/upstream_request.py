"""CanonicalRequest -> the OpenAI Chat Completions payload sent to `{upstream}/chat/completions`.

SEAM for reasoning restoration (k3/reasoning): every assistant turn of every dialect reaches
the engine through `assistant_to_upstream(message, config)`, and only through it. The message
still carries what the client echoed: `ReasoningPart`s (thinking blocks with their signature,
Responses reasoning items with `encrypted_content`, Chat `reasoning_content`), text and
`ToolCallPart`s with the client's argument strings. Today the function rebuilds the turn from
that echo; a ledger/signature lookup that returns the exact engine message plugs in here.
"""

from __future__ import annotations

from typing import Any

from k3.config import Config
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

TOOL_ERROR_PREFIX = "[tool error] "


def assistant_to_upstream(message: Message, config: Config) -> dict[str, Any] | None:
    """The engine-side form of one assistant turn; None when it carries nothing at all."""
    text: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for part in message.parts:
        if isinstance(part, TextPart):
            text.append(part.text)
        elif isinstance(part, ReasoningPart):
            if not part.redacted:
                reasoning.append(part.text)
        elif isinstance(part, ToolCallPart):
            calls.append(
                {
                    "id": part.id,
                    "type": "function",
                    "function": {"name": part.name, "arguments": part.arguments},
                }
            )
    if not (text or reasoning or calls):
        return None
    out: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
    if reasoning and config.reasoning_field != "none":
        out[config.reasoning_field] = "".join(reasoning)
    if calls:
        out["tool_calls"] = calls
    return out


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


def messages_to_upstream(messages: list[Message], config: Config) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    pending_images: list[ImagePart] = []  # images returned by tools, shown after the run of results
    for message in messages:
        role = message.role
        if pending_images and role != "tool":
            out.append({"role": "user", "content": [_image(p) for p in pending_images]})
            pending_images = []
        if role == "assistant":
            lowered = assistant_to_upstream(message, config)
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


def build_payload(request: CanonicalRequest, config: Config, upstream_model: str) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "model": upstream_model,
        "messages": messages_to_upstream(request.messages, config),
        "stream": request.stream,
    }
    if request.tools:
        payload["tools"] = [tool_to_upstream(t) for t in request.tools]
        if request.tool_choice is not None:
            payload["tool_choice"] = request.tool_choice
        if request.parallel_tool_calls is not None:
            payload["parallel_tool_calls"] = request.parallel_tool_calls
    if request.max_tokens is not None:
        payload["max_tokens"] = request.max_tokens
    if request.temperature is not None:
        payload["temperature"] = request.temperature
    if request.top_p is not None:
        payload["top_p"] = request.top_p
    if request.stop:
        payload["stop"] = request.stop
    if request.reasoning_effort is not None:
        payload["reasoning_effort"] = request.reasoning_effort
    if request.response_format is not None:
        payload["response_format"] = request.response_format
    if request.stream:
        payload["stream_options"] = {"include_usage": True}
    for key, value in request.extra.items():
        payload.setdefault(key, value)
    return payload
