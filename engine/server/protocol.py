"""OpenAI Chat Completions requests: validation into a `ChatRequest`, and OpenAI-shaped errors.

Accepted: model, messages (system | developer | user | assistant | tool; text content as a string or
text parts), tools, tool_choice, max_tokens / max_completion_tokens, temperature, top_p, top_k and min_p
(vLLM's; top_k -1 or 0 keeps every token), stop, seed, stream, stream_options.include_usage, n = 1, and
vLLM's ignore_eos. Other keys are ignored (clients and
proxies add their own), except features this engine does not have (logprobs, non-text content,
structured output, penalties): those are refused with a 400 rather than silently dropped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

ROLES = ("system", "developer", "user", "assistant", "tool")


class ApiError(Exception):
    """An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


@dataclass(frozen=True)
class ChatRequest:
    model: str | None
    messages: list[dict]  # normalised: content is a string, tool call arguments are JSON strings
    tools: list[dict] | None
    max_tokens: int | None
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    stop: list[str]
    seed: int | None
    stream: bool
    include_usage: bool
    ignore_eos: bool


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _text(content: Any, param: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise bad_request("content must be a string or a list of content parts", param)
    texts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text" or not isinstance(part.get("text"), str):
            raise bad_request(f"only text content parts are supported (got {kind!r})", f"{param}[{i}]")
        texts.append(part["text"])
    return "".join(texts)


def _tool_calls(calls: Any, param: str) -> list[dict]:
    if not isinstance(calls, list):
        raise bad_request("tool_calls must be a list", param)
    out = []
    for i, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise bad_request("a tool call needs function.name", f"{param}[{i}]")
        arguments = function.get("arguments", "{}")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        call_id = call.get("id") if isinstance(call.get("id"), str) else f"call_{i}"
        out.append(
            {
                "id": call_id,
                "type": "function",
                "function": {"name": function["name"], "arguments": arguments},
            }
        )
    return out


def normalize_messages(messages: Any) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages must be a non-empty list", "messages")
    out = []
    for i, message in enumerate(messages):
        param = f"messages[{i}]"
        if not isinstance(message, dict):
            raise bad_request("a message must be an object", param)
        role = message.get("role")
        if role not in ROLES:
            raise bad_request(f"role must be one of {', '.join(ROLES)}", f"{param}.role")
        entry: dict[str, Any] = {
            "role": "system" if role == "developer" else role,
            "content": _text(message.get("content"), f"{param}.content"),
        }
        if isinstance(message.get("name"), str):
            entry["name"] = message["name"]
        if role == "assistant":
            reasoning = message.get("reasoning_content", message.get("reasoning"))
            if isinstance(reasoning, str) and reasoning:
                entry["reasoning_content"] = reasoning
            if message.get("tool_calls"):
                entry["tool_calls"] = _tool_calls(message["tool_calls"], f"{param}.tool_calls")
        if role == "tool":
            call_id = message.get("tool_call_id")
            entry["tool_call_id"] = call_id if isinstance(call_id, str) else ""
        out.append(entry)
    return out


def _tools(tools: Any) -> list[dict] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise bad_request("tools must be a list", "tools")
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise bad_request("a tool needs type 'function' and function.name", f"tools[{i}]")
    return tools or None


def _refuse_unsupported(body: dict) -> None:
    if body.get("n") not in (None, 1):
        raise bad_request("only n = 1 is supported", "n")
    if body.get("logprobs") or body.get("top_logprobs"):
        raise bad_request("logprobs are not supported by this engine", "logprobs")
    for penalty in ("presence_penalty", "frequency_penalty"):
        if body.get(penalty) not in (None, 0, 0.0):
            raise bad_request(f"{penalty} is not supported by this engine (use 0)", penalty)
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise bad_request("only response_format {'type': 'text'} is supported", "response_format")


def parse_chat_request(body: Any) -> ChatRequest:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    _refuse_unsupported(body)
    messages = normalize_messages(body.get("messages"))
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and not (_is_int(max_tokens) and max_tokens >= 1):
        raise bad_request("max_tokens must be a positive integer", "max_tokens")
    temperature = body.get("temperature", 1.0)
    if temperature is None:
        temperature = 1.0
    if not (_is_number(temperature) and 0 <= temperature <= 2):
        raise bad_request("temperature must be a number from 0 to 2", "temperature")
    top_p = body.get("top_p", 1.0)
    if top_p is None:
        top_p = 1.0
    if not (_is_number(top_p) and 0 < top_p <= 1):
        raise bad_request("top_p must be a number in (0, 1]", "top_p")
    top_k = body.get("top_k")
    top_k = 0 if top_k is None or top_k == -1 else top_k
    if not (_is_int(top_k) and top_k >= 0):
        raise bad_request("top_k must be a whole number >= 1 (or -1 / 0 for no limit)", "top_k")
    min_p = body.get("min_p")
    min_p = 0.0 if min_p is None else min_p
    if not (_is_number(min_p) and 0 <= min_p <= 1):
        raise bad_request("min_p must be a number from 0 to 1", "min_p")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request("model must be a string", "model")
    stop = body.get("stop")
    stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not (isinstance(stop, list) and all(isinstance(s, str) and s for s in stop)):
        raise bad_request("stop must be a non-empty string or a list of them", "stop")
    seed = body.get("seed")
    if seed is not None and not _is_int(seed):
        raise bad_request("seed must be an integer", "seed")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad_request("stream must be a boolean", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise bad_request("stream_options must be an object", "stream_options")
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise bad_request("ignore_eos must be a boolean", "ignore_eos")
    return ChatRequest(
        model=model,
        messages=messages,
        tools=_tools(body.get("tools")),
        max_tokens=max_tokens,
        temperature=float(temperature),
        top_p=float(top_p),
        top_k=top_k,
        min_p=float(min_p),
        stop=stop,
        seed=seed,
        stream=stream,
        include_usage=bool(options.get("include_usage")),
        ignore_eos=ignore_eos,
    )
