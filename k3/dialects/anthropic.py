"""Anthropic Messages (`/v1/messages`): Claude Code, opencode's Anthropic provider, the SDKs.

Tool-call ids are the engine's, shown as `toolu_…` (k3.tools.ids) and mapped back on the way in.
"""

from __future__ import annotations

from typing import Any

import orjson

from k3 import ir
from k3.dialects.common import (
    DEFAULT_SCHEMA,
    Turn,
    arguments_text,
    as_dict,
    as_list,
    as_str,
    data_uri,
    image_from_url,
    json_text,
    opt_bool,
    opt_float,
    opt_int,
    opt_str,
    stop_list,
)
from k3.errors import ProxyError, anthropic_error, bad_request
from k3.sse import named
from k3.tools.ids import from_anthropic_id, to_anthropic_id

ID_PREFIX = "msg_"

STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "content_filter": "refusal",
}

# Claude Code sends `output_config.effort`; engines know low/medium/high.
_EFFORT = {"low": "low", "medium": "medium", "high": "high", "xhigh": "high", "max": "high"}

# ---------------------------------------------------------------------------------------------
# Ingress


def _tool_result(block: dict[str, Any], where: str) -> ir.ToolResultPart:
    call_id = from_anthropic_id(as_str(block.get("tool_use_id"), f"{where}.tool_use_id"))
    content = block.get("content")
    images: list[ir.ImagePart] = []
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):
        texts = []
        for j, item in enumerate(content):
            item_where = f"{where}.content[{j}]"
            item = as_dict(item, item_where)
            kind = item.get("type")
            if kind == "text":
                texts.append(as_str(item.get("text"), f"{item_where}.text"))
            elif kind == "image":
                images.append(_image(item, item_where))
            else:
                texts.append(json_text(item))
        text = "\n".join(texts)
    else:
        raise bad_request(f"{where}.content must be a string or an array", f"{where}.content")
    is_error = opt_bool(block.get("is_error"), f"{where}.is_error") or False
    return ir.ToolResultPart(call_id, text, is_error, images)


def _image(block: dict[str, Any], where: str) -> ir.ImagePart:
    source = as_dict(block.get("source"), f"{where}.source")
    kind = source.get("type")
    if kind == "base64":
        return data_uri(source.get("media_type"), source.get("data"), f"{where}.source")
    if kind == "url":
        return image_from_url(source.get("url"), f"{where}.source.url")
    raise bad_request(f"{where}.source.type must be 'base64' or 'url'", f"{where}.source.type")


def _document(block: dict[str, Any], where: str) -> ir.TextPart:
    source = as_dict(block.get("source"), f"{where}.source")
    title = block.get("title")
    head = f"{title}\n" if isinstance(title, str) and title else ""
    if source.get("type") == "text":
        return ir.TextPart(head + as_str(source.get("data"), f"{where}.source.data"))
    media = source.get("media_type") or source.get("type")
    # The engine reads text and images only; say so rather than drop the block silently.
    return ir.TextPart(
        f"{head}[document of type {media} omitted: the local engine reads text and images only]"
    )


def _blocks(content: Any, role: str, where: str) -> tuple[list[ir.Part], list[ir.ToolResultPart]]:
    """Content blocks -> (parts, tool results). Tool results go before the rest of a user turn."""
    if isinstance(content, str):
        return [ir.TextPart(content)], []
    parts: list[ir.Part] = []
    results: list[ir.ToolResultPart] = []
    for i, block in enumerate(as_list(content, f"{where}.content")):
        block_where = f"{where}.content[{i}]"
        block = as_dict(block, block_where)
        kind = block.get("type")
        if kind == "text":
            parts.append(ir.TextPart(as_str(block.get("text"), f"{block_where}.text")))
        elif kind == "image":
            parts.append(_image(block, block_where))
        elif kind == "tool_result":
            results.append(_tool_result(block, block_where))
        elif kind == "tool_use" and role == "assistant":
            call_id = from_anthropic_id(as_str(block.get("id"), f"{block_where}.id"))
            name = as_str(block.get("name"), f"{block_where}.name")
            parts.append(ir.ToolCallPart(call_id, name, arguments_text(block.get("input"))))
        elif kind == "thinking" and role == "assistant":
            text = as_str(block.get("thinking"), f"{block_where}.thinking")
            parts.append(ir.ReasoningPart(text, opt_str(block.get("signature"), f"{block_where}.signature")))
        elif kind == "redacted_thinking" and role == "assistant":
            parts.append(
                ir.ReasoningPart("", opt_str(block.get("data"), f"{block_where}.data"), redacted=True)
            )
        elif kind == "document":
            parts.append(_document(block, block_where))
        elif not isinstance(kind, str):
            raise bad_request(f"{block_where}.type must be a string", f"{block_where}.type")
        # Other block types (server tool results, search results, ...) have no engine meaning.
    return parts, results


def _system(value: Any) -> list[ir.Part]:
    if value is None:
        return []
    if isinstance(value, str):
        return [ir.TextPart(value)] if value else []
    parts: list[ir.Part] = []
    for i, block in enumerate(as_list(value, "system")):
        block = as_dict(block, f"system[{i}]")
        text = as_str(block.get("text"), f"system[{i}].text")
        if text:
            parts.append(ir.TextPart(text))
    return parts


def _tools(value: Any) -> list[ir.ToolDef]:
    if value is None:
        return []
    tools = []
    for i, tool in enumerate(as_list(value, "tools")):
        tool = as_dict(tool, f"tools[{i}]")
        schema = tool.get("input_schema")
        kind = tool.get("type")
        if schema is None and kind not in (None, "custom"):
            continue  # server tools (web_search_2025..., bash_2025...) run at Anthropic, not here
        name = as_str(tool.get("name"), f"tools[{i}].name")
        description = opt_str(tool.get("description"), f"tools[{i}].description") or ""
        schema = DEFAULT_SCHEMA if schema is None else as_dict(schema, f"tools[{i}].input_schema")
        tools.append(ir.ToolDef(name, description, schema))
    return tools


def _tool_choice(value: Any) -> tuple[Any, bool | None]:
    """-> (Chat tool_choice, parallel_tool_calls)."""
    if value is None:
        return None, None
    choice = as_dict(value, "tool_choice")
    kind = choice.get("type")
    parallel = opt_bool(choice.get("disable_parallel_tool_use"), "tool_choice.disable_parallel_tool_use")
    parallel = None if parallel is None else not parallel
    if kind == "auto":
        return "auto", parallel
    if kind == "any":
        return "required", parallel
    if kind == "none":
        return "none", parallel
    if kind == "tool":
        name = as_str(choice.get("name"), "tool_choice.name")
        return {"type": "function", "function": {"name": name}}, parallel
    raise bad_request("tool_choice.type must be one of auto, any, tool, none", "tool_choice.type")


def _thinking(body: dict[str, Any]) -> tuple[bool | None, str | None]:
    """-> (thinking enabled, reasoning effort)."""
    effort = None
    config = body.get("output_config")
    if isinstance(config, dict) and isinstance(config.get("effort"), str):
        effort = _EFFORT.get(config["effort"])
    thinking = body.get("thinking")
    if thinking is None:
        return None, effort
    thinking = as_dict(thinking, "thinking")
    kind = as_str(thinking.get("type"), "thinking.type")
    if kind == "disabled":
        return False, effort
    budget = opt_int(thinking.get("budget_tokens"), "thinking.budget_tokens")
    if effort is None and budget:
        effort = "low" if budget <= 4096 else "medium" if budget <= 16384 else "high"
    return True, effort


def ingress(body: dict[str, Any], default_model: str) -> ir.CanonicalRequest:
    model = opt_str(body.get("model"), "model") or default_model
    messages: list[ir.Message] = []
    system = _system(body.get("system"))
    if system:
        messages.append(ir.Message("system", system))
    for i, raw in enumerate(as_list(body.get("messages", []), "messages")):
        where = f"messages[{i}]"
        raw = as_dict(raw, where)
        role = raw.get("role")
        if role not in ("user", "assistant", "system"):
            raise bad_request(f"{where}.role must be user, assistant or system", f"{where}.role")
        parts, results = _blocks(raw.get("content"), role, where)
        if results:
            messages.append(ir.Message("tool", list(results)))
        if role == "system":
            parts = [p for p in parts if isinstance(p, ir.TextPart)]
        if parts or role == "assistant":
            messages.append(ir.Message(role, parts))
    tool_choice, parallel = _tool_choice(body.get("tool_choice"))
    thinking_enabled, effort = _thinking(body)
    extra = {}
    top_k = opt_int(body.get("top_k"), "top_k")
    if top_k is not None:
        extra["top_k"] = top_k
    return ir.CanonicalRequest(
        model=model,
        messages=messages,
        stream=opt_bool(body.get("stream"), "stream") or False,
        tools=_tools(body.get("tools")),
        tool_choice=tool_choice,
        parallel_tool_calls=parallel,
        max_tokens=opt_int(body.get("max_tokens"), "max_tokens"),
        temperature=opt_float(body.get("temperature"), "temperature"),
        top_p=opt_float(body.get("top_p"), "top_p"),
        stop=stop_list(body.get("stop_sequences"), "stop_sequences"),
        reasoning_effort=effort,
        thinking_enabled=thinking_enabled,
        extra=extra,
    )


# ---------------------------------------------------------------------------------------------
# Egress


def tool_input(arguments: str) -> dict[str, Any]:
    """tool_use.input must be an object: unparseable or non-object arguments give {}."""
    try:
        value = orjson.loads(arguments) if arguments else {}
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def usage_json(usage: ir.Usage) -> dict[str, int]:
    # Anthropic counts cached prompt tokens apart from input_tokens.
    return {
        "input_tokens": max(0, usage.input_tokens - usage.cached_input_tokens),
        "output_tokens": usage.output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": usage.cached_input_tokens,
    }


def render(response: ir.CanonicalResponse, turn: Turn) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    show = turn.show_reasoning
    for part in response.parts:
        if isinstance(part, ir.TextPart):
            content.append({"type": "text", "text": part.text})
        elif isinstance(part, ir.ToolCallPart):
            content.append(
                {
                    "type": "tool_use",
                    "id": to_anthropic_id(part.id),
                    "name": part.name,
                    "input": tool_input(part.arguments),
                }
            )
        elif isinstance(part, ir.ReasoningPart) and show:
            content.append({"type": "thinking", "thinking": part.text, "signature": part.signature or ""})
    if not content:
        content.append({"type": "text", "text": ""})
    return {
        "id": turn.id,
        "type": "message",
        "role": "assistant",
        "model": turn.request.model,
        "content": content,
        "stop_reason": "stop_sequence" if response.stop_sequence else STOP_REASONS[response.stop_reason],
        "stop_sequence": response.stop_sequence,
        "usage": usage_json(response.usage),
    }


_PING = named("ping", {"type": "ping"})
_STOP_BLOCK = b'event: content_block_stop\ndata: {"type":"content_block_stop","index":%d}\n\n'
_DELTA = (
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":%d,"delta":{"type":"%s","%s":'
)


class Stream:
    """Canonical events -> Anthropic SSE frames. One content block is open at a time."""

    keepalive = _PING

    def __init__(self, turn: Turn):
        self._turn = turn
        self._show = turn.show_reasoning
        self._index = -1
        self._open: str | None = None  # "thinking" | "text" | "tool_use"

    def start(self) -> bytes:
        message: dict[str, Any] = {
            "id": self._turn.id,
            "type": "message",
            "role": "assistant",
            "model": self._turn.request.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": 0,
                "output_tokens": 0,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        }
        return named("message_start", {"type": "message_start", "message": message}) + _PING

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        self._open = None
        return _STOP_BLOCK % self._index

    def _open_block(self, kind: str, block: dict[str, Any]) -> bytes:
        head = self._close()
        self._index += 1
        self._open = kind
        return head + named(
            "content_block_start",
            {"type": "content_block_start", "index": self._index, "content_block": block},
        )

    def _delta(self, kind: bytes, key: bytes, value: str) -> bytes:
        return (_DELTA % (self._index, kind, key)) + orjson.dumps(value) + b"}}\n\n"

    def feed(self, event: ir.Event) -> bytes:
        if isinstance(event, ir.TextDelta):
            head = b"" if self._open == "text" else self._open_block("text", {"type": "text", "text": ""})
            return head + self._delta(b"text_delta", b"text", event.text)
        if isinstance(event, ir.ReasoningDelta):
            if not self._show:
                return b""
            head = (
                b""
                if self._open == "thinking"
                else self._open_block("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            )
            return head + self._delta(b"thinking_delta", b"thinking", event.text)
        if isinstance(event, ir.ReasoningEnd):
            if self._open != "thinking":
                return b""
            tail = self._delta(b"signature_delta", b"signature", event.signature) if event.signature else b""
            return tail + self._close()
        if isinstance(event, ir.ToolCallStart):
            return self._open_block(
                "tool_use",
                {"type": "tool_use", "id": to_anthropic_id(event.id), "name": event.name, "input": {}},
            )
        if isinstance(event, ir.ToolCallDelta):
            return self._delta(b"input_json_delta", b"partial_json", event.text)
        if isinstance(event, ir.ToolCallEnd):
            return self._close()
        if isinstance(event, ir.Finish):
            stop_reason = "stop_sequence" if event.stop_sequence else STOP_REASONS[event.stop_reason]
            delta = {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": event.stop_sequence},
                "usage": usage_json(event.usage),
            }
            return (
                self._close()
                + named("message_delta", delta)
                + named("message_stop", {"type": "message_stop"})
            )
        return b""

    def error(self, err: ProxyError) -> bytes:
        return named("error", anthropic_error(err))


def models_json(ids: list[str]) -> dict[str, Any]:
    data = [
        {
            "type": "model",
            "id": i,
            "display_name": i,
            "created_at": "1970-01-01T00:00:00Z",
            "lifecycle": "active",
        }
        for i in ids
    ]
    return {
        "data": data,
        "has_more": False,
        "first_id": ids[0] if ids else None,
        "last_id": ids[-1] if ids else None,
    }
