"""Kimi K2 tool-call ids: the model-native `functions.NAME:IDX` never reaches a client (opencode
once got `functions.bash:0` as its call id); the engine gets its own id back in the history."""

from __future__ import annotations

import json

import pytest

from k3.testing.fake_upstream import Reply, ToolCall
from k3.tools.ids import from_chat_id, to_chat_id

K2_ID = "functions.bash:0"
ARGS = '{"command": "ls"}'
CHAT_TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]


def _chat_stream_message(text: str) -> dict:
    """The assistant message a Chat client assembles from the SSE frames."""
    calls: dict[int, dict] = {}
    content = ""
    for line in text.splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        for choice in json.loads(line[6:]).get("choices", []):
            delta = choice.get("delta", {})
            content += delta.get("content") or ""
            for piece in delta.get("tool_calls") or []:
                call = calls.setdefault(
                    piece["index"], {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                )
                call["id"] = piece.get("id") or call["id"]
                call["function"]["name"] += piece.get("function", {}).get("name", "")
                call["function"]["arguments"] += piece.get("function", {}).get("arguments", "")
    return {"role": "assistant", "content": content, "tool_calls": [calls[i] for i in sorted(calls)]}


@pytest.mark.parametrize("stream", [False, True])
async def test_chat_clients_see_a_proxy_id_and_the_engine_gets_its_k2_id_back(make_client, fake, stream):
    client = make_client(tool_parser="kimi")
    fake.push(
        Reply(content="Listing.", tool_calls=[ToolCall("bash", ARGS)], tool_format="kimi"),
        Reply(content="Done."),
    )
    body = {
        "model": "m",
        "stream": stream,
        "tools": CHAT_TOOLS,
        "messages": [{"role": "user", "content": "ls"}],
    }
    response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    message = _chat_stream_message(response.text) if stream else response.json()["choices"][0]["message"]
    call_id = message["tool_calls"][0]["id"]
    assert "functions." not in call_id and ":" not in call_id and call_id.startswith("call_")
    body["messages"] += [
        {"role": "assistant", "content": message["content"], "tool_calls": message["tool_calls"]},
        {"role": "tool", "tool_call_id": call_id, "content": "a.txt"},
    ]
    assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
    history = fake.requests[-1]["messages"]
    assert history[1]["tool_calls"][0]["id"] == K2_ID
    assert history[2] == {"role": "tool", "tool_call_id": K2_ID, "content": "a.txt"}


async def test_anthropic_clients_see_a_proxy_id_and_the_engine_gets_its_k2_id_back(make_client, fake):
    client = make_client(tool_parser="kimi")
    fake.push(
        Reply(content="Listing.", tool_calls=[ToolCall("bash", ARGS)], tool_format="kimi"),
        Reply(content="Done."),
    )
    tools = [{"name": "bash", "input_schema": {"type": "object"}}]
    body = {
        "model": "claude",
        "max_tokens": 64,
        "tools": tools,
        "messages": [{"role": "user", "content": "ls"}],
    }
    content = (await client.post("/v1/messages", json=body)).json()["content"]
    use = next(b for b in content if b["type"] == "tool_use")
    assert "functions." not in use["id"] and use["id"].startswith("toolu_")
    body["messages"] += [
        {"role": "assistant", "content": content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": "a.txt"}]},
    ]
    assert (await client.post("/v1/messages", json=body)).status_code == 200
    history = fake.requests[-1]["messages"]
    assert history[1]["tool_calls"][0]["id"] == K2_ID and history[2]["tool_call_id"] == K2_ID


@pytest.mark.parametrize(
    "upstream", [K2_ID, "functions.a.b:12", "ü", "call_x", "chatcmpl-tool-1", "call_k3e_x"]
)
def test_chat_ids_are_plain_when_plain_and_reversible_always(upstream):
    client = to_chat_id(upstream)
    assert from_chat_id(client) == upstream
    assert (client == upstream) == all(c.isalnum() and c.isascii() or c in "_-" for c in upstream)


def test_ids_a_chat_client_invents_pass_through():
    for invented in ("call_k3e_!!", "call_k3e_Y2FsbF94", "abc", ""):  # the second decodes to a plain id
        assert from_chat_id(invented) == invented
