"""OpenAI Responses (`/v1/responses`): Codex, opencode's Responses provider, the SDK.

Stateless: `store`/`previous_response_id` are not kept (Codex resends the whole history with
`store:false`); reasoning comes back through `encrypted_content` (k3.continuity). Tool-call ids
are the engine's, shown as `call_…` in `call_id` (k3.tools.ids) and mapped back on the way in. Freeform `custom` tools (Codex's apply_patch) reach the engine as a function
with one `input` string and come back as `custom_tool_call` items.
"""

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
)
from k3.errors import ProxyError, bad_request, openai_error
from k3.sse import typed
from k3.tools.ids import from_responses_id, to_responses_id

ID_PREFIX = "resp_"
INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}

# ---------------------------------------------------------------------------------------------
# Ingress


def _content(value: Any, where: str) -> list[ir.Part]:
    if isinstance(value, str):
        return [ir.TextPart(value)]
    parts: list[ir.Part] = []
    for i, item in enumerate(as_list(value, where)):
        item_where = f"{where}[{i}]"
        item = as_dict(item, item_where)
        kind = item.get("type")
        if kind in ("input_text", "output_text", "text", "summary_text", "reasoning_text"):
            parts.append(ir.TextPart(as_str(item.get("text"), f"{item_where}.text")))
        elif kind == "refusal":
            parts.append(ir.TextPart(as_str(item.get("refusal"), f"{item_where}.refusal")))
        elif kind == "input_image":
            url = item.get("image_url")
            if isinstance(url, dict):
                url = url.get("url")
            if url is None:
                raise bad_request(
                    f"{item_where}: only image_url images are supported (not file_id)", item_where
                )
            parts.append(image_from_url(url, f"{item_where}.image_url"))
        elif not isinstance(kind, str):
            raise bad_request(f"{item_where}.type must be a string", f"{item_where}.type")
        # input_file / input_audio: the engine cannot read them
    return parts


def _output(value: Any, where: str) -> tuple[str, list[ir.ImagePart]]:
    if isinstance(value, list):
        parts = _content(value, where)
        return "\n".join(p.text for p in parts if isinstance(p, ir.TextPart)), [
            p for p in parts if isinstance(p, ir.ImagePart)
        ]
    return json_text(value) if value is not None else "", []


def _reasoning(item: dict[str, Any], where: str) -> ir.ReasoningPart | None:
    texts = []
    for key in ("content", "summary"):  # raw reasoning text first, else the summary
        value = item.get(key)
        if value:
            texts = [p.text for p in _content(value, f"{where}.{key}") if isinstance(p, ir.TextPart)]
            if texts:
                break
    signature = opt_str(item.get("encrypted_content"), f"{where}.encrypted_content")
    if not texts and not signature:
        return None
    return ir.ReasoningPart("\n\n".join(texts), signature)


def _input(value: Any) -> list[ir.Message]:
    if isinstance(value, str):
        return [ir.Message("user", [ir.TextPart(value)])]
    messages: list[ir.Message] = []

    def assistant_turn() -> ir.Message:
        # Sibling reasoning/message/call items form one assistant turn.
        if messages and messages[-1].role == "assistant":
            return messages[-1]
        messages.append(ir.Message("assistant", []))
        return messages[-1]

    for i, item in enumerate(as_list(value, "input")):
        where = f"input[{i}]"
        if isinstance(item, str):
            messages.append(ir.Message("user", [ir.TextPart(item)]))
            continue
        item = as_dict(item, where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            parts = _content(item.get("content", []), f"{where}.content")
            if role in ("system", "developer"):
                messages.append(ir.Message("system", [p for p in parts if isinstance(p, ir.TextPart)]))
            elif role == "assistant":
                assistant_turn().parts.extend(p for p in parts if isinstance(p, ir.TextPart))
            elif role == "user":
                messages.append(ir.Message("user", parts))
            else:
                raise bad_request(
                    f"{where}.role must be user, assistant, system or developer", f"{where}.role"
                )
        elif kind == "reasoning":
            part = _reasoning(item, where)
            if part is not None:
                assistant_turn().parts.append(part)
        elif kind in ("function_call", "custom_tool_call"):
            call_id = from_responses_id(as_str(item.get("call_id", item.get("id")), f"{where}.call_id"))
            name = as_str(item.get("name"), f"{where}.name")
            if kind == "function_call":
                arguments = arguments_text(item.get("arguments"))
                call = ir.ToolCallPart(call_id, name, arguments)
            else:
                text = as_str(item.get("input"), f"{where}.input")
                call = ir.ToolCallPart(call_id, name, orjson.dumps({"input": text}).decode(), custom=True)
            assistant_turn().parts.append(call)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            call_id = from_responses_id(as_str(item.get("call_id", item.get("id")), f"{where}.call_id"))
            text, images = _output(item.get("output"), f"{where}.output")
            messages.append(ir.Message("tool", [ir.ToolResultPart(call_id, text, False, images)]))
        elif not isinstance(kind, str):
            raise bad_request(f"{where}.type must be a string", f"{where}.type")
        # hosted-tool items (web_search_call, item_reference, ...) have no engine meaning
    return messages


def _custom_parameters(tool: dict[str, Any]) -> dict[str, Any]:
    description = "The raw input of this freeform tool (not JSON)."
    fmt = tool.get("format")
    if isinstance(fmt, dict) and isinstance(fmt.get("definition"), str):
        description += f" It must follow this {fmt.get('syntax', 'grammar')} grammar:\n{fmt['definition']}"
    return {
        "type": "object",
        "properties": {"input": {"type": "string", "description": description}},
        "required": ["input"],
    }


def _tools(value: Any) -> list[ir.ToolDef]:
    tools = []
    for i, tool in enumerate(as_list(value, "tools") if value is not None else []):
        where = f"tools[{i}]"
        tool = as_dict(tool, where)
        kind = tool.get("type", "function")
        if kind == "function":
            tools.append(
                function_tool(tool.get("function", tool), where)
            )  # flat (Responses) or nested (Chat)
        elif kind == "custom":
            name = as_str(tool.get("name"), f"{where}.name")
            description = opt_str(tool.get("description"), f"{where}.description") or ""
            tools.append(ir.ToolDef(name, description, _custom_parameters(tool), custom=True))
        # hosted tools (web_search, file_search, tool_search, ...) run at OpenAI, not here
    return tools


def _tool_choice(value: Any) -> Any:
    """Responses tool_choice -> the Chat shape (the peer forwarded it untranslated)."""
    if value is None or value in ("auto", "none", "required"):
        return value
    choice = as_dict(value, "tool_choice")
    kind = choice.get("type")
    if kind in ("function", "custom"):
        name = choice.get("name")
        if name is None and isinstance(choice.get("function"), dict):
            name = choice["function"].get("name")
        return {"type": "function", "function": {"name": as_str(name, "tool_choice.name")}}
    if kind == "allowed_tools":
        mode = choice.get("mode", "auto")
        return mode if mode in ("auto", "required") else "auto"
    return "auto"  # a hosted tool forced by type: let the model choose among ours


def _response_format(text: Any) -> Any:
    if text is None:
        return None
    fmt = as_dict(text, "text").get("format")
    if fmt is None:
        return None
    fmt = as_dict(fmt, "text.format")
    kind = fmt.get("type")
    if kind == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    if kind == "json_object":
        return {"type": "json_object"}
    return None


def ingress(body: dict[str, Any], default_model: str) -> ir.CanonicalRequest:
    messages = []
    instructions = opt_str(body.get("instructions"), "instructions")
    if instructions:
        messages.append(ir.Message("system", [ir.TextPart(instructions)]))
    messages.extend(_input(body.get("input", [])))
    reasoning = body.get("reasoning")
    effort = None
    if reasoning is not None:
        effort = opt_str(as_dict(reasoning, "reasoning").get("effort"), "reasoning.effort")
    return ir.CanonicalRequest(
        model=opt_str(body.get("model"), "model") or default_model,
        messages=messages,
        stream=opt_bool(body.get("stream"), "stream") or False,
        tools=_tools(body.get("tools")),
        tool_choice=_tool_choice(body.get("tool_choice")),
        parallel_tool_calls=opt_bool(body.get("parallel_tool_calls"), "parallel_tool_calls"),
        max_tokens=opt_int(body.get("max_output_tokens"), "max_output_tokens"),
        temperature=opt_float(body.get("temperature"), "temperature"),
        top_p=opt_float(body.get("top_p"), "top_p"),
        reasoning_effort=effort if effort in ("minimal", "low", "medium", "high") else None,
        response_format=_response_format(body.get("text")),
    )


# ---------------------------------------------------------------------------------------------
# Egress


def usage_json(usage: ir.Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.input_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_input_tokens, "cache_write_tokens": 0},
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.input_tokens + usage.output_tokens,
    }


def _custom_input(arguments: str) -> str:
    """The `input` string of a freeform call; arguments that are not {"input": str} pass as they are."""
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments
    if isinstance(value, dict) and isinstance(value.get("input"), str):
        return value["input"]
    return arguments


def _custom_names(turn: Turn) -> frozenset[str]:
    return frozenset(t.name for t in turn.request.tools if t.custom)


class _Items:
    """Item ids derived from the response id, so streamed and final ids agree."""

    def __init__(self, turn: Turn):
        self.base = turn.id[len(ID_PREFIX) :]
        self.count = 0

    def next(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}_{self.base}_{self.count}"


def _reasoning_item(item_id: str, text: str, signature: str | None, status: str) -> dict[str, Any]:
    summary = [{"type": "summary_text", "text": text}] if text else []
    return {
        "type": "reasoning",
        "id": item_id,
        "summary": summary,
        "encrypted_content": signature,
        "status": status,
    }


def _message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    content = (
        [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
        if status != "in_progress"
        else []
    )
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def _call_item(
    item_id: str, upstream_id: str, name: str, arguments: str, custom: bool, status: str
) -> dict[str, Any]:
    call_id = to_responses_id(upstream_id)
    if custom:
        return {
            "type": "custom_tool_call",
            "id": item_id,
            "call_id": call_id,
            "name": name,
            "input": arguments,
            "status": status,
        }
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def envelope(
    turn: Turn, status: str, output: list[dict[str, Any]], usage: ir.Usage | None, stop: str | None = None
) -> dict[str, Any]:
    body = turn.body
    reason = INCOMPLETE.get(stop or "")
    return {
        "id": turn.id,
        "object": "response",
        "created_at": turn.created,
        "status": status,
        "error": None,
        "incomplete_details": {"reason": reason} if reason and status == "incomplete" else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": turn.request.model,
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "temperature": body.get("temperature"),
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools", []),
        "top_p": body.get("top_p"),
        "store": False,
        "metadata": body.get("metadata") or {},
        "usage": usage_json(usage) if usage is not None else None,
    }


def _status(stop: str) -> str:
    return "incomplete" if stop in INCOMPLETE else "completed"


def render(response: ir.CanonicalResponse, turn: Turn) -> dict[str, Any]:
    items = _Items(turn)
    custom = _custom_names(turn)
    output = []
    show = turn.show_reasoning
    for part in response.parts:
        if isinstance(part, ir.ReasoningPart):
            if show:
                output.append(_reasoning_item(items.next("rs"), part.text, part.signature, "completed"))
        elif isinstance(part, ir.TextPart):
            output.append(_message_item(items.next("msg"), part.text, "completed"))
        elif isinstance(part, ir.ToolCallPart):
            is_custom = part.name in custom
            arguments = _custom_input(part.arguments) if is_custom else part.arguments
            prefix = "ctc" if is_custom else "fc"
            output.append(
                _call_item(items.next(prefix), part.id, part.name, arguments, is_custom, "completed")
            )
    return envelope(turn, _status(response.stop_reason), output, response.usage, response.stop_reason)


class Stream:
    """Canonical events -> Responses SSE: created, in_progress, items, one terminal event."""

    keepalive = b": keep-alive\n\n"

    def __init__(self, turn: Turn):
        self._turn = turn
        self._items = _Items(turn)
        self._custom = _custom_names(turn)
        self._seq = 0
        self._output: list[dict[str, Any]] = []  # finished items, in announcement order
        self._open: str | None = None  # "reasoning" | "message" | "call"
        self._id = ""
        self._text: list[str] = []
        self._call: ir.ToolCallStart | None = None
        self._show = turn.show_reasoning

    def _frame(self, kind: str, data: dict[str, Any]) -> bytes:
        frame = typed(kind, data, self._seq)
        self._seq += 1
        return frame

    def _delta(self, kind: str, extra: dict[str, Any]) -> bytes:
        return self._frame(kind, {"item_id": self._id, "output_index": len(self._output), **extra})

    def start(self) -> bytes:
        skeleton = envelope(self._turn, "in_progress", [], None)
        return self._frame("response.created", {"response": skeleton}) + self._frame(
            "response.in_progress", {"response": skeleton}
        )

    def _added(self, kind: str, item: dict[str, Any]) -> bytes:
        self._open = kind
        self._id = item["id"]
        self._text = []
        return self._frame("response.output_item.added", {"output_index": len(self._output), "item": item})

    def _done(self, item: dict[str, Any]) -> bytes:
        out = self._frame("response.output_item.done", {"output_index": len(self._output), "item": item})
        self._output.append(item)
        self._open = None
        return out

    def _close(self, signature: str | None = None) -> bytes:
        if self._open == "message":
            text = "".join(self._text)
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            return (
                self._delta("response.output_text.done", {"content_index": 0, "text": text, "logprobs": []})
                + self._delta("response.content_part.done", {"content_index": 0, "part": part})
                + self._done(_message_item(self._id, text, "completed"))
            )
        if self._open == "reasoning":
            text = "".join(self._text)
            part = {"type": "summary_text", "text": text}
            return (
                self._delta("response.reasoning_summary_text.done", {"summary_index": 0, "text": text})
                + self._delta("response.reasoning_summary_part.done", {"summary_index": 0, "part": part})
                + self._done(_reasoning_item(self._id, text, signature, "completed"))
            )
        return b""

    def feed(self, event: ir.Event) -> bytes:
        if isinstance(event, ir.TextDelta):
            out = b""
            if self._open != "message":
                out = self._close() + self._added(
                    "message", _message_item(self._items.next("msg"), "", "in_progress")
                )
                part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                out += self._delta("response.content_part.added", {"content_index": 0, "part": part})
            self._text.append(event.text)
            return out + self._delta(
                "response.output_text.delta", {"content_index": 0, "delta": event.text, "logprobs": []}
            )
        if isinstance(event, ir.ReasoningDelta):
            if not self._show:
                return b""
            out = b""
            if self._open != "reasoning":
                item = _reasoning_item(self._items.next("rs"), "", None, "in_progress")
                out = self._close() + self._added("reasoning", item)
                part = {"type": "summary_text", "text": ""}
                out += self._delta(
                    "response.reasoning_summary_part.added", {"summary_index": 0, "part": part}
                )
            self._text.append(event.text)
            return out + self._delta(
                "response.reasoning_summary_text.delta", {"summary_index": 0, "delta": event.text}
            )
        if isinstance(event, ir.ReasoningEnd):
            return self._close(event.signature) if self._open == "reasoning" else b""
        if isinstance(event, ir.ToolCallStart):
            out = self._close()
            self._call = event
            if event.name in self._custom:
                return out  # a freeform input is announced whole at the end of the call
            item = _call_item(self._items.next("fc"), event.id, event.name, "", False, "in_progress")
            return out + self._added("call", item)
        if isinstance(event, ir.ToolCallDelta):
            if self._open != "call":
                return b""
            return self._delta("response.function_call_arguments.delta", {"delta": event.text})
        if isinstance(event, ir.ToolCallEnd):
            if event.name in self._custom:
                text = _custom_input(event.arguments)
                item_id = self._items.next("ctc")
                out = self._added("call", _call_item(item_id, event.id, event.name, "", True, "in_progress"))
                out += self._delta("response.custom_tool_call_input.delta", {"delta": text})
                out += self._delta("response.custom_tool_call_input.done", {"input": text})
                return out + self._done(_call_item(item_id, event.id, event.name, text, True, "completed"))
            out = self._delta(
                "response.function_call_arguments.done", {"name": event.name, "arguments": event.arguments}
            )
            return out + self._done(
                _call_item(self._id, event.id, event.name, event.arguments, False, "completed")
            )
        if isinstance(event, ir.Finish):
            status = _status(event.stop_reason)
            final = envelope(self._turn, status, self._output, event.usage, event.stop_reason)
            kind = "response.completed" if status == "completed" else "response.incomplete"
            return self._close() + self._frame(kind, {"response": final})
        return b""

    def error(self, err: ProxyError) -> bytes:
        failed = envelope(self._turn, "failed", self._output, None)
        failed["error"] = {"code": err.code or "server_error", "message": err.message}
        body = openai_error(err)["error"]
        return self._frame(
            "error", {"code": body["code"], "message": body["message"], "param": body["param"]}
        ) + self._frame("response.failed", {"response": failed})
