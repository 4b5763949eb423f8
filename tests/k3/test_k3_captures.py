"""Every request captured from a real client, replayed through k3 in front of the fake engine.

For each: the upstream request must validate as OpenAI Chat Completions create params, and the
answer must parse with the SDK of the client's dialect (for streams: every event validated and
folded by the SDK's own accumulator).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from k3_helpers import anthropic_stream, chat_stream, responses_stream
from openai.types.chat import completion_create_params
from pydantic import TypeAdapter

from k3.app import create_app
from k3.config import Config
from k3.testing.fake_upstream import FakeUpstream, Reply, ToolCall

FIXTURES = [
    json.loads(line) for line in (Path(__file__).parent / "fixtures" / "client_requests.jsonl").open()
]
DIALECT_OF = {"anthropic_messages": "anthropic", "openai_chat": "chat", "openai_responses": "responses"}
CHAT_STREAM = TypeAdapter(completion_create_params.CompletionCreateParamsStreaming)
CHAT_JSON = TypeAdapter(completion_create_params.CompletionCreateParamsNonStreaming)
HOP_BY_HOP = {"content-length", "host", "connection", "accept-encoding", "transfer-encoding"}


def _force(value: Any) -> Any:
    """Materialise pydantic's lazily validated iterables (it validates Iterable[...] on iteration)."""
    if isinstance(value, dict):
        return {k: _force(v) for k, v in value.items()}
    if isinstance(value, str | bytes | int | float | bool) or value is None:
        return value
    return [_force(v) for v in value]


def _tool_names(body: dict[str, Any]) -> list[tuple[str, bool]]:
    names = []
    for tool in body.get("tools") or []:
        function = tool.get("function", tool)
        if tool.get("type") in (None, "function", "custom") and function.get("name"):
            names.append((function["name"], tool.get("type") == "custom"))
    return names


def _reply(request: dict[str, Any]) -> Reply:
    label = request["captured_reply"]
    if label.startswith("error/"):
        return Reply(status=int(label.split("/")[1]), error="scripted engine failure")
    if label.endswith("/tool") or label.endswith("/custom"):
        names = _tool_names(request["body"])
        custom = [n for n, is_custom in names if is_custom]
        if label.endswith("/custom") and custom:
            call = ToolCall(
                custom[0], json.dumps({"input": "*** Begin Patch\n*** Add File: a.txt\n+hi\n*** End Patch\n"})
            )
        else:
            call = ToolCall(names[0][0], '{"command": "echo hi"}')
        return Reply(
            reasoning="The user wants a command run.", content="I'll run a command.", tool_calls=[call]
        )
    return Reply(reasoning="Easy.", content="It printed hi.")


@pytest.fixture(scope="module")
def app_and_fake():
    fake = FakeUpstream()
    return create_app(Config(upstream="http://fake/v1"), upstream_transport=httpx.ASGITransport(fake)), fake


@pytest.mark.parametrize("request_", FIXTURES, ids=lambda r: f"{r['client']}-{r['scenario']}-{r['seq']}")
async def test_captured_request_through_k3(app_and_fake, request_):
    app, fake = app_and_fake
    fake.reset()
    headers = [(k, v) for k, v in request_["headers"] if k.lower() not in HOP_BY_HOP]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://k3") as client:
        if request_["method"] == "HEAD":
            response = await client.head(request_["path"], headers=headers)
            assert response.status_code == 200  # Claude Code's probe; the capture server answered 404
            return
        reply = _reply(request_)
        fake.push(reply)
        response = await client.post(request_["path"], json=request_["body"], headers=headers)
    dialect = DIALECT_OF[request_["dialect"]]
    body = request_["body"]
    stream = bool(body.get("stream"))

    assert len(fake.requests) == 1
    upstream = fake.requests[0]
    _force((CHAT_STREAM if stream else CHAT_JSON).validate_python(upstream))
    assert upstream["model"] == "kimi-linear" and upstream["messages"]
    tool_ids = {c["id"] for m in upstream["messages"] for c in m.get("tool_calls", [])}
    assert {m["tool_call_id"] for m in upstream["messages"] if m["role"] == "tool"} <= tool_ids

    if reply.status >= 400:
        assert response.status_code == reply.status
        error = response.json()
        message = error["error"]["message"]
        assert message == "scripted engine failure"
        if dialect == "anthropic":
            anthropic.types.ErrorResponse.model_validate(error)
        return
    assert response.status_code == 200, response.text
    if dialect == "anthropic":
        message = (
            anthropic_stream(response.text)
            if stream
            else anthropic.types.Message.model_validate(response.json())
        )
        kinds = [b.type for b in message.content]
        assert "text" in kinds and message.model == body["model"]
        if reply.tool_calls:
            assert kinds[-1] == "tool_use" and message.stop_reason == "tool_use"
        thinking_off = (body.get("thinking") or {}).get("type") == "disabled"
        assert ("thinking" in kinds) is not thinking_off
    elif dialect == "chat":
        completion = (
            chat_stream(response.text)
            if stream
            else openai.types.chat.ChatCompletion.model_validate(response.json())
        )
        assert completion.choices[0].message.content == reply.content
        assert bool(completion.choices[0].message.tool_calls) == bool(reply.tool_calls)
    else:
        result = (
            responses_stream(response.text)
            if stream
            else openai.types.responses.Response.model_validate(response.json())
        )
        kinds = [o.type for o in result.output]
        assert kinds[:2] == ["reasoning", "message"]
        if reply.tool_calls:
            assert kinds[2] in ("function_call", "custom_tool_call")
            if kinds[2] == "custom_tool_call":
                assert result.output[2].input.startswith("*** Begin Patch")
