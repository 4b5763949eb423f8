"""Two-turn tool conversations driven by the official SDKs, the way agents keep their history.

Turn 1: the user asks, the engine reasons and calls `read_file`. Turn 2: the client sends the
history back (what its SDK returned, echoed as agents do) plus the tool result. Each driver
returns what the client saw in turn 1; the test then reads the engine's second request.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import openai

from k3.testing.fake_upstream import FakeUpstream, Reply, ToolCall
from k3.tools.ids import from_anthropic_id, from_chat_id, from_responses_id

REASONING = "The user wants a file.\n  I'll read src/ä.py → then answer."
# Spacing no JSON serialiser produces: a re-serialised argument string shows at once.
ARGUMENTS = '{"path":  "src/ä.py" ,"limit":2}'
QUESTION = "What is in src/ä.py?"
RESULT = "print('hi')"
PARAMETERS = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}},
    "required": ["path"],
}
CHAT_TOOL = {"type": "function", "function": {"name": "read_file", "parameters": PARAMETERS}}


@dataclass
class Seen:
    """What the client got in turn 1."""

    reasoning: str  # reasoning shown to the client ("" when none)
    signature: str | None  # thinking signature / encrypted_content
    call_id: str  # the client's tool-call id
    upstream_call_id: str  # the same id mapped back to the engine's
    arguments: dict[str, Any]  # the tool input as the client parsed it


def anthropic_conversation(base: str, stream: bool, api_key: str = "sk-test") -> Seen:
    client = anthropic.Anthropic(base_url=base, api_key=api_key, max_retries=0, timeout=20)
    tools = [{"name": "read_file", "description": "Read a file", "input_schema": PARAMETERS}]
    history: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    request = {
        "model": "claude-k3-local",
        "max_tokens": 1024,
        "tools": tools,
        "thinking": {"type": "enabled", "budget_tokens": 512},
    }
    message = _sdk_turn(client.messages, stream, {**request, "messages": history}, "get_final_message")
    thinking = [b for b in message.content if b.type == "thinking"]
    call = next(b for b in message.content if b.type == "tool_use")
    history.append(
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]}
    )
    history.append(
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": RESULT}]}
    )
    final = _sdk_turn(client.messages, stream, {**request, "messages": history}, "get_final_message")
    assert final.content[0].text == "Done."
    return Seen(
        "".join(b.thinking for b in thinking),
        thinking[0].signature if thinking else None,
        call.id,
        from_anthropic_id(call.id),
        call.input,
    )


def _sdk_turn(api: Any, stream: bool, request: dict[str, Any], final: str) -> Any:
    """One turn through an SDK resource (client.messages, client.responses): `create`, or `stream` and
    the stream's final object (`final` names its getter)."""
    if not stream:
        return api.create(**request)
    with api.stream(**request) as events:
        return getattr(events, final)()


def responses_conversation(base: str, stream: bool, api_key: str = "sk-test") -> Seen:
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=api_key, max_retries=0, timeout=20)
    tools = [{"type": "function", "name": "read_file", "parameters": PARAMETERS, "strict": False}]
    history: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    request = {"model": "gpt-5", "tools": tools, "store": False, "include": ["reasoning.encrypted_content"]}
    response = _sdk_turn(client.responses, stream, {**request, "input": history}, "get_final_response")
    reasoning = [i for i in response.output if i.type == "reasoning"]
    call = next(i for i in response.output if i.type == "function_call")
    history += [item.model_dump(exclude_none=True) for item in response.output]
    history.append({"type": "function_call_output", "call_id": call.call_id, "output": RESULT})
    final = _sdk_turn(client.responses, stream, {**request, "input": history}, "get_final_response")
    assert final.output_text == "Done."
    return Seen(
        "".join(s.text for i in reasoning for s in i.summary),
        reasoning[0].encrypted_content if reasoning else None,
        call.call_id,
        from_responses_id(call.call_id),
        json.loads(call.arguments),
    )


def chat_conversation(base: str, stream: bool, api_key: str = "sk-test") -> Seen:
    """Non-streaming, the client echoes the whole message (with reasoning_content, as opencode
    does); streaming, it keeps only content and tool calls (as clients that strip reasoning do)."""
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=api_key, max_retries=0, timeout=20)
    history: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    request = {"model": "gpt-4o", "tools": [CHAT_TOOL]}
    if stream:
        assistant, reasoning = _chat_stream(client, {**request, "messages": history})
    else:
        message = client.chat.completions.create(**request, messages=history).choices[0].message
        assistant = message.model_dump(exclude_none=True)
        reasoning = assistant.get("reasoning_content", "")
    call = assistant["tool_calls"][0]
    history.append(assistant)
    history.append({"role": "tool", "tool_call_id": call["id"], "content": RESULT})
    final = client.chat.completions.create(**request, messages=history)
    assert final.choices[0].message.content == "Done."
    return Seen(
        reasoning, None, call["id"], from_chat_id(call["id"]), json.loads(call["function"]["arguments"])
    )


def _chat_stream(client: openai.OpenAI, request: dict[str, Any]) -> tuple[dict[str, Any], str]:
    content, reasoning = [], []
    calls: dict[int, dict[str, Any]] = {}
    for chunk in client.chat.completions.create(**request, stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content.append(delta.content or "")
        reasoning.append((delta.model_extra or {}).get("reasoning_content") or "")
        for piece in delta.tool_calls or []:
            call = calls.setdefault(
                piece.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
            )
            call["id"] = piece.id or call["id"]
            if piece.function is not None:
                call["function"]["name"] += piece.function.name or ""
                call["function"]["arguments"] += piece.function.arguments or ""
    assistant = {
        "role": "assistant",
        "content": "".join(content),
        "tool_calls": [calls[i] for i in sorted(calls)],
    }
    return assistant, "".join(reasoning)


CONVERSATIONS = {
    "anthropic": anthropic_conversation,
    "responses": responses_conversation,
    "chat": chat_conversation,
}


# -- raw Anthropic turns, for tests that tamper with what the client sends back ---------------------

TOOLS = [
    {"name": "read_file", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}
]


def post(base: str, messages: list, api_key: str = "sk-test", headers: dict | None = None) -> httpx.Response:
    body = {"model": "claude-k3-local", "max_tokens": 256, "tools": TOOLS, "messages": messages}
    return httpx.post(
        f"{base}/v1/messages", json=body, headers={"x-api-key": api_key, **(headers or {})}, timeout=20
    )


def first_turn(
    engine: FakeUpstream, base: str, api_key: str = "sk-test", headers: dict | None = None
) -> list[dict]:
    engine.push(
        Reply(content="Let me look.", reasoning=REASONING, tool_calls=[ToolCall("read_file", ARGUMENTS)])
    )
    response = post(base, [{"role": "user", "content": QUESTION}], api_key, headers)
    assert response.status_code == 200, response.text
    return response.json()["content"]


def second_turn(
    engine: FakeUpstream,
    base: str,
    content: list[dict],
    api_key: str = "sk-test",
    headers: dict | None = None,
) -> dict:
    """Send the assistant turn back; returns the engine's form of it."""
    call_id = next(b["id"] for b in content if b["type"] == "tool_use")
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id, "content": RESULT}]}
    engine.push(Reply(content="Done."))
    messages = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": content}, result]
    response = post(base, messages, api_key, headers)
    assert response.status_code == 200, response.text
    return engine.requests[-1]["messages"][1]


def stats(base: str) -> dict:
    return httpx.get(f"{base}/k3/stats", timeout=10).json()["ledger"]
