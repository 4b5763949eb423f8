"""OpenAI Chat Completions (`/v1/chat/completions`): opencode, aider, Cline, Kimi Code, the SDK."""

from __future__ import annotations

from typing import Any

import orjson

from k3 import ir
from k3.dialects.common import (
    Turn,
    arguments_text,
    as_dict,
    as_list,
    as_str,
    function_tool,
    image_from_url,
    json_text,
    opt_bool,
    opt_float,
    opt_int,
    opt_str,
    stop_list,
)
from k3.errors import ProxyError, bad_request, openai_error
from k3.sse import DONE, unnamed
from k3.tools.ids import from_chat_id, new_call_id, to_chat_id

ID_PREFIX = "chatcmpl-"

# Keys with a meaning only on OpenAI's platform (or handled above): never forwarded to the engine.
_CONSUMED = frozenset(
    {
        "messages", "model", "stream", "stream_options", "tools", "tool_choice", "parallel_tool_calls",
        "max_tokens", "max_completion_tokens", "temperature", "top_p", "stop", "reasoning_effort",
        "response_format", "functions", "function_call",
        "n", "user", "store", "metadata", "service_tier", "modalities", "audio", "prediction",
        "web_search_options", "safety_identifier", "prompt_cache_key", "prompt_cache_retention", "verbosity",
    }
)  # fmt: skip

# ---------------------------------------------------------------------------------------------
# Ingress


def _parts(content: Any, where: str) -> list[ir.Part]:
    if content is None:
        return []
    if isinstance(content, str):
        return [ir.TextPart(content)]
    parts: list[ir.Part] = []
    for i, item in enumerate(as_list(content, where)):
        item_where = f"{where}[{i}]"
        if isinstance(item, str):
            parts.append(ir.TextPart(item))
            continue
        item = as_dict(item, item_where)
        kind = item.get("type")
        if kind == "image_url":
            image = item.get("image_url")
            url = image.get("url") if isinstance(image, dict) else image
            parts.append(image_from_url(url, f"{item_where}.image_url.url"))
        elif isinstance(item.get("text"), str):  # text, input_text, output_text
            parts.append(ir.TextPart(item["text"]))
        elif kind == "refusal" and isinstance(item.get("refusal"), str):
            parts.append(ir.TextPart(item["refusal"]))
        elif not isinstance(kind, str):
            raise bad_request(f"{item_where}.type must be a string", f"{item_where}.type")
        # input_audio / file parts: the engine cannot read them
    return parts


def _text(content: Any, where: str) -> str:
    return "".join(p.text for p in _parts(content, where) if isinstance(p, ir.TextPart))


def _tool_content(content: Any, where: str) -> tuple[str, list[ir.ImagePart]]:
    if isinstance(content, list):
        parts = _parts(content, where)
        text = "\n".join(p.text for p in parts if isinstance(p, ir.TextPart))
        return text, [p for p in parts if isinstance(p, ir.ImagePart)]
    return json_text(content) if content is not None else "", []


def _assistant(raw: dict[str, Any], where: str) -> ir.Message:
    parts: list[ir.Part] = []
    reasoning = raw.get("reasoning_content")
    if reasoning is None:
        reasoning = raw.get("reasoning")
    if reasoning is not None:
        text = as_str(reasoning, f"{where}.reasoning_content")
        if text:
            parts.append(ir.ReasoningPart(text))
    parts.extend(p for p in _parts(raw.get("content"), f"{where}.content") if isinstance(p, ir.TextPart))
    calls = raw.get("tool_calls")
    for j, call in enumerate(as_list(calls, f"{where}.tool_calls") if calls is not None else ()):
        call_where = f"{where}.tool_calls[{j}]"
        call = as_dict(call, call_where)
        function = as_dict(call.get("function"), f"{call_where}.function")
        name = as_str(function.get("name"), f"{call_where}.function.name")
        call_id = from_chat_id(opt_str(call.get("id"), f"{call_where}.id") or "") or new_call_id()
        parts.append(ir.ToolCallPart(call_id, name, arguments_text(function.get("arguments"))))
    legacy = raw.get("function_call")
    if legacy is not None:
        legacy = as_dict(legacy, f"{where}.function_call")
        name = as_str(legacy.get("name"), f"{where}.function_call.name")
        parts.append(ir.ToolCallPart(new_call_id(), name, arguments_text(legacy.get("arguments"))))
    return ir.Message("assistant", parts)


def _messages(value: Any) -> list[ir.Message]:
    messages: list[ir.Message] = []
    for i, raw in enumerate(as_list(value, "messages")):
        where = f"messages[{i}]"
        raw = as_dict(raw, where)
        role = raw.get("role")
        if role in ("system", "developer"):
            messages.append(
                ir.Message("system", [ir.TextPart(_text(raw.get("content"), f"{where}.content"))])
            )
        elif role == "assistant":
            messages.append(_assistant(raw, where))
        elif role in ("tool", "function"):
            call_id = from_chat_id(opt_str(raw.get("tool_call_id"), f"{where}.tool_call_id") or "")
            text, images = _tool_content(raw.get("content"), f"{where}.content")
            messages.append(ir.Message("tool", [ir.ToolResultPart(call_id, text, False, images)]))
        elif role == "user":
            messages.append(ir.Message("user", _parts(raw.get("content"), f"{where}.content")))
        else:
            raise bad_request(
                f"{where}.role must be system, developer, user, assistant or tool", f"{where}.role"
            )
    return messages


def _tools(value: Any, legacy: Any) -> list[ir.ToolDef]:
    tools = []
    items = as_list(value, "tools") if value is not None else []
    for i, tool in enumerate(items):
        tool = as_dict(tool, f"tools[{i}]")
        tools.append(function_tool(tool.get("function", tool), f"tools[{i}].function"))  # nested or flat
    for i, function in enumerate(as_list(legacy, "functions") if legacy is not None else []):
        tools.append(function_tool(function, f"functions[{i}]"))
    return tools


def _tool_choice(value: Any) -> Any:
    if value is None or value in ("auto", "none", "required"):
        return value
    choice = as_dict(value, "tool_choice")
    function = as_dict(choice.get("function"), "tool_choice.function")
    return {
        "type": "function",
        "function": {"name": as_str(function.get("name"), "tool_choice.function.name")},
    }


def ingress(body: dict[str, Any], default_model: str) -> ir.CanonicalRequest:
    max_tokens = opt_int(body.get("max_completion_tokens"), "max_completion_tokens")
    if max_tokens is None:
        max_tokens = opt_int(body.get("max_tokens"), "max_tokens")
    options = body.get("stream_options")
    include_usage = None
    if options is not None:
        include_usage = opt_bool(
            as_dict(options, "stream_options").get("include_usage"), "stream_options.include_usage"
        )
    response_format = body.get("response_format")
    if response_format is not None:
        response_format = as_dict(response_format, "response_format")
    return ir.CanonicalRequest(
        model=opt_str(body.get("model"), "model") or default_model,
        messages=_messages(body.get("messages", [])),
        stream=opt_bool(body.get("stream"), "stream") or False,
        tools=_tools(body.get("tools"), body.get("functions")),
        tool_choice=_tool_choice(body.get("tool_choice")),
        parallel_tool_calls=opt_bool(body.get("parallel_tool_calls"), "parallel_tool_calls"),
        max_tokens=max_tokens,
        temperature=opt_float(body.get("temperature"), "temperature"),
        top_p=opt_float(body.get("top_p"), "top_p"),
        stop=stop_list(body.get("stop"), "stop"),
        reasoning_effort=opt_str(body.get("reasoning_effort"), "reasoning_effort"),
        include_usage=include_usage,
        response_format=response_format,
        extra={k: v for k, v in body.items() if k not in _CONSUMED},
    )


# ---------------------------------------------------------------------------------------------
# Egress


def usage_json(usage: ir.Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.input_tokens + usage.output_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_input_tokens},
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
    }


def _tool_call(index: int, part: ir.ToolCallPart) -> dict[str, Any]:
    return {
        "id": to_chat_id(part.id),
        "type": "function",
        "function": {"name": part.name, "arguments": part.arguments},
    }


def render(response: ir.CanonicalResponse, turn: Turn) -> dict[str, Any]:
    text = "".join(p.text for p in response.parts if isinstance(p, ir.TextPart))
    reasoning = (
        "".join(p.text for p in response.parts if isinstance(p, ir.ReasoningPart))
        if turn.show_reasoning
        else ""
    )
    calls = [
        _tool_call(i, p) for i, p in enumerate(p for p in response.parts if isinstance(p, ir.ToolCallPart))
    ]
    message: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = calls
    return {
        "id": turn.id,
        "object": "chat.completion",
        "created": turn.created,
        "model": turn.request.model,
        "choices": [
            {"index": 0, "message": message, "finish_reason": response.stop_reason, "logprobs": None}
        ],
        "usage": usage_json(response.usage),
    }


class Stream:
    """Canonical events -> Chat Completions chunks, then `data: [DONE]`."""

    keepalive = b": keep-alive\n\n"

    def __init__(self, turn: Turn):
        self._turn = turn
        head = {
            "id": turn.id,
            "object": "chat.completion.chunk",
            "created": turn.created,
            "model": turn.request.model,
        }
        # Every chunk shares this prefix; only the delta and finish_reason change.
        self._prefix = b"data: " + orjson.dumps(head)[:-1] + b',"choices":[{"index":0,"delta":'
        self._head = head
        # OpenAI sends the usage chunk only when asked; so do we.
        self._usage = turn.request.include_usage is True
        self._show = turn.show_reasoning

    def _chunk(self, delta: dict[str, Any] | bytes, finish: str | None = None) -> bytes:
        body = delta if isinstance(delta, bytes) else orjson.dumps(delta)
        tail = (
            b',"finish_reason":null}]}\n\n'
            if finish is None
            else b',"finish_reason":"' + finish.encode() + b'"}]}\n\n'
        )
        return self._prefix + body + tail

    def start(self) -> bytes:
        return self._chunk(b'{"role":"assistant","content":""}')

    def feed(self, event: ir.Event) -> bytes:
        if isinstance(event, ir.TextDelta):
            return self._chunk(b'{"content":' + orjson.dumps(event.text) + b"}")
        if isinstance(event, ir.ReasoningDelta):
            if not self._show:
                return b""
            return self._chunk(b'{"reasoning_content":' + orjson.dumps(event.text) + b"}")
        if isinstance(event, ir.ToolCallStart):
            call = {
                "index": event.index,
                "id": to_chat_id(event.id),
                "type": "function",
                "function": {"name": event.name, "arguments": ""},
            }
            return self._chunk({"tool_calls": [call]})
        if isinstance(event, ir.ToolCallDelta):
            return self._chunk(
                {"tool_calls": [{"index": event.index, "function": {"arguments": event.text}}]}
            )
        if isinstance(event, ir.Finish):
            out = self._chunk(b"{}", event.stop_reason)
            if self._usage:
                out += unnamed({**self._head, "choices": [], "usage": usage_json(event.usage)})
            return out + DONE
        return b""

    def error(self, err: ProxyError) -> bytes:
        return unnamed(openai_error(err)) + DONE


def models_json(ids: list[str], created: int) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [{"id": i, "object": "model", "created": created, "owned_by": "k3"} for i in ids],
    }
