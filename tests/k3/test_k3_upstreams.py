"""The docs/UPSTREAMS.md recipe: which `--tool-parser` / `--reasoning-field` k3 needs in front of vLLM or
SGLang serving Kimi-Linear or Kimi K3, with and without the servers' own kimi_k2 / kimi_k3 parsers.

The scripted engine answers in each server's documented shapes (parsed: `reasoning` or
`reasoning_content` beside native `tool_calls` with `functions.NAME:IDX` ids; raw: the model's own text);
a Claude Code style (Anthropic) and a Codex style (Responses) client go through k3, streaming and not,
for two turns: the client must see the reasoning and a clean tool call, and the engine must get its own
reasoning and call id back on the next turn.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from k3_helpers import anthropic_stream, responses_stream

from k3.testing.fake_upstream import Reply, ToolCall

ARGS = '{"command": "ls"}'
THOUGHT = "The user wants a listing; run ls."
ENGINE_ID = "functions.bash:0"  # the id vLLM's and SGLang's kimi_k2 / kimi_k3 tool parsers return


@dataclass(frozen=True)
class Upstream:
    """One way a server answers, and the k3 flags the recipe gives for it."""

    name: str
    reasoning_key: str  # how the scripted engine sends reasoning (fake_upstream.Reply.reasoning_key)
    tool_format: str  # "native" tool_calls, or the model's own text
    tool_parser: str  # the recipe's k3 --tool-parser
    reasoning_field: str  # the recipe's k3 --reasoning-field
    engine_id: str | None  # the call id the engine gives, when it gives one


RECIPES = [
    # vLLM >= 0.11 --tool-call-parser kimi_k2|kimi_k3 --reasoning-parser kimi_k2|kimi_k3
    Upstream("vllm-parsed", "reasoning", "native", "passthrough", "reasoning", ENGINE_ID),
    # SGLang (and vLLM <= 0.10) with the same parsers: the older field name
    Upstream("sglang-parsed", "reasoning_content", "native", "passthrough", "reasoning_content", ENGINE_ID),
    # either server without parsers, Kimi-Linear / K2 family: <think> and K2 tool tokens in the text
    Upstream("raw-kimi-linear", "think", "kimi", "kimi", "think", ENGINE_ID),
    # either server without parsers, Kimi K3: the XTML think channel and tool section in the text
    Upstream("raw-kimi-k3", "kimi_k3", "kimi_k3", "kimi_k3", "kimi_k3", None),
]


def _reply(upstream: Upstream) -> Reply:
    return Reply(
        content="Listing.",
        reasoning=THOUGHT,
        reasoning_key=upstream.reasoning_key,
        tool_calls=[
            ToolCall("bash", ARGS, id=upstream.engine_id if upstream.tool_format == "native" else None)
        ],
        tool_format=upstream.tool_format,
    )


def _engine_turn(upstream: Upstream, message: dict) -> tuple[str, str]:
    """(reasoning, tool call id) of the assistant turn the engine got back, read the recipe's way."""
    if upstream.reasoning_field == "think":
        content = message["content"] if isinstance(message["content"], str) else message["content"][0]["text"]
        assert content.startswith("<think>")
        reasoning = content[len("<think>") : content.index("</think>")]
    else:  # the K3 template renders reasoning_content into its think channel
        key = "reasoning_content" if upstream.reasoning_field == "kimi_k3" else upstream.reasoning_field
        reasoning = message[key]
    return reasoning, message["tool_calls"][0]["id"]


async def _anthropic(client, stream: bool) -> tuple[str, str, dict]:
    tools = [{"name": "bash", "input_schema": {"type": "object"}}]
    body = {"model": "claude", "max_tokens": 256, "stream": stream, "tools": tools,
            "messages": [{"role": "user", "content": "ls"}]}  # fmt: skip
    response = await client.post("/v1/messages", json=body)
    assert response.status_code == 200, response.text
    message = anthropic_stream(response.text).model_dump() if stream else response.json()
    thinking = next(b for b in message["content"] if b["type"] == "thinking")
    use = next(b for b in message["content"] if b["type"] == "tool_use")
    assert use["name"] == "bash" and use["input"] == json.loads(ARGS)
    assert use["id"].startswith("toolu_") and "functions." not in use["id"]
    assert not any("<|" in (b.get("text") or "") for b in message["content"])  # no control token leaks
    content = [b for b in message["content"] if b["type"] in ("thinking", "text", "tool_use")]
    body["messages"] += [
        {"role": "assistant", "content": content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": "a.txt"}]},
    ]
    body["stream"] = False
    assert (await client.post("/v1/messages", json=body)).status_code == 200
    return thinking["thinking"], use["id"], body


async def _responses(client, stream: bool) -> tuple[str, str, dict]:
    tools = [{"type": "function", "name": "bash", "parameters": {"type": "object"}}]
    body = {"model": "gpt-5-codex", "stream": stream, "tools": tools, "input": "ls"}
    response = await client.post("/v1/responses", json=body)
    assert response.status_code == 200, response.text
    result = responses_stream(response.text).model_dump() if stream else response.json()
    reasoning = next(o for o in result["output"] if o["type"] == "reasoning")
    call = next(o for o in result["output"] if o["type"] == "function_call")
    assert call["name"] == "bash" and json.loads(call["arguments"]) == json.loads(ARGS)
    assert call["call_id"].startswith("call_") and "functions." not in call["call_id"]
    text = "".join(
        p.get("text", "") for o in result["output"] if o["type"] == "message" for p in o["content"]
    )
    assert "<|" not in text
    body["input"] = [
        {"role": "user", "content": "ls"},
        *result["output"],
        {"type": "function_call_output", "call_id": call["call_id"], "output": "a.txt"},
    ]
    body["stream"] = False
    assert (await client.post("/v1/responses", json=body)).status_code == 200
    summary = "".join(s["text"] for s in reasoning["summary"])
    return summary, call["call_id"], body


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("dialect", [_anthropic, _responses], ids=["anthropic", "responses"])
@pytest.mark.parametrize("upstream", RECIPES, ids=[u.name for u in RECIPES])
async def test_the_recipe_gives_clean_reasoning_and_calls_and_round_trips_them(
    make_client, fake, upstream, dialect, stream
):
    client = make_client(tool_parser=upstream.tool_parser, reasoning_field=upstream.reasoning_field)
    fake.push(_reply(upstream), Reply(content="Done."))
    shown, client_id, _ = await dialect(client, stream)
    assert shown == THOUGHT
    assert fake.requests[0]["messages"][-1]["content"] == "ls"
    history = fake.requests[-1]["messages"]
    assistant = next(m for m in history if m["role"] == "assistant")
    reasoning, engine_id = _engine_turn(upstream, assistant)
    assert reasoning == THOUGHT
    assert assistant["tool_calls"][0]["function"] == {"name": "bash", "arguments": ARGS}  # byte for byte
    if upstream.engine_id:  # the client saw a clean id of k3's, the engine gets its own back
        assert engine_id == upstream.engine_id != client_id
    tool = next(m for m in history if m["role"] == "tool")
    assert tool["tool_call_id"] == engine_id


async def test_auto_reads_either_parsed_field(make_client, fake):
    """`--reasoning-field auto` is the safe choice when it is not known which field the server uses."""
    client = make_client(reasoning_field="auto")
    for key in ("reasoning", "reasoning_content"):
        fake.push(Reply(content="Listing.", reasoning=THOUGHT, reasoning_key=key,
                        tool_calls=[ToolCall("bash", ARGS, id=ENGINE_ID)]), Reply(content="Done."))  # fmt: skip
        shown, _, _ = await _anthropic(client, stream=True)
        assert shown == THOUGHT
        assert fake.requests[-1]["messages"][1][key] == THOUGHT


async def test_without_the_recipe_raw_k3_text_reaches_the_client_as_text(make_client, fake):
    """The failure the recipe prevents: a server without parsers, k3 left at passthrough."""
    client = make_client(tool_parser="passthrough")
    fake.push(_reply(RECIPES[3]))
    body = {"model": "claude", "max_tokens": 256, "messages": [{"role": "user", "content": "ls"}],
            "tools": [{"name": "bash", "input_schema": {"type": "object"}}]}  # fmt: skip
    message = (await client.post("/v1/messages", json=body)).json()
    assert not [b for b in message["content"] if b["type"] == "tool_use"]
    assert "<|open|>tools" in "".join(b.get("text", "") for b in message["content"])
