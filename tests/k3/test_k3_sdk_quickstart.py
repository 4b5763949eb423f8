"""The docs/K3.md quickstart as a subprocess over a real socket, judged by the official SDKs.

`python -m k3 serve ...` (the documented command, pointed at a fake engine on an ephemeral port)
serves the `anthropic` and `openai` Python SDKs: messages, chat.completions and responses,
streaming and not, one tool-use round trip each.
"""

from __future__ import annotations

import os
import re
import selectors
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from k3.testing.fake_upstream import FakeUpstream, Reply, ToolCall, serve_in_thread
from runners.processes import stop

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "sk-local"


def quickstart_command() -> list[str]:
    text = (ROOT / "docs" / "K3.md").read_text()
    block = text.split("<!-- quickstart -->", 1)[1]
    line = next(ln for ln in block.splitlines() if ln.startswith("k3 serve"))
    return shlex.split(line)[1:]


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[FakeUpstream, str]]:
    fake = FakeUpstream()
    with (
        serve_in_thread(fake) as upstream,
        tempfile.TemporaryFile() as log,
        tempfile.TemporaryDirectory() as state,
    ):
        args = quickstart_command()
        args[args.index("--upstream") + 1] = upstream
        command = [
            sys.executable,
            "-m",
            "k3",
            *args,
            "--port",
            "0",
            "--api-key",
            TOKEN,
            "--log-level",
            "warning",
        ]
        # The signing secret goes to $XDG_STATE_HOME/k3: a temporary one, not the user's.
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "XDG_STATE_HOME": state}
        proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=log, env=env)
        try:
            base = _wait_for_banner(proc)
            _wait_until_serving(base)
            yield fake, base
        finally:
            stop(proc)
            log.seek(0)
            tail = log.read()[-2000:].decode(errors="replace")
            assert "Traceback" not in tail, tail


def _wait_for_banner(proc: subprocess.Popen) -> str:
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if not selector.select(timeout=deadline - time.monotonic()):
            break
        line = proc.stdout.readline().decode()
        if not line:
            break
        match = re.match(r"k3 listening on (http://\S+)", line)
        if match:
            return match.group(1)
    raise RuntimeError(f"k3 serve did not print its address (exit code {proc.poll()})")


def _wait_until_serving(base: str) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if httpx.get(base + "/", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.05)
    raise RuntimeError("k3 serve did not answer")


@pytest.fixture
def fake(served) -> FakeUpstream:
    served[0].reset()
    return served[0]


@pytest.fixture
def claude(served) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=served[1], api_key=TOKEN, max_retries=0, timeout=20)


@pytest.fixture
def gpt(served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served[1] + "/v1", api_key=TOKEN, max_retries=0, timeout=20)


TOOL_CALL = Reply(
    reasoning="Run it.",
    content="I'll run a command.",
    tool_calls=[ToolCall("bash", '{"command": "echo hi"}', "call_q1")],
)
ANSWER = Reply(content="It printed hi.")
ANTHROPIC_TOOLS = [
    {
        "name": "bash",
        "description": "run",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
    }
]
CHAT_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]
RESPONSES_TOOLS = [
    {
        "type": "function",
        "name": "bash",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
    }
]
PROMPT = "Run the shell command `echo hi` and tell me what it printed."


def _assert_tool_result_reached_engine(fake: FakeUpstream) -> None:
    messages = fake.requests[-1]["messages"]
    assert messages[-2]["tool_calls"][0]["id"] == "call_q1"
    assert messages[-1] == {"role": "tool", "tool_call_id": "call_q1", "content": "hi"}


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_sdk_messages_tool_round_trip(claude, fake, stream):
    fake.push(TOOL_CALL, ANSWER)
    messages = [{"role": "user", "content": PROMPT}]
    kwargs = {"model": "claude-sonnet-4-6", "max_tokens": 256, "tools": ANTHROPIC_TOOLS}
    if stream:
        with claude.messages.stream(messages=messages, **kwargs) as s:
            first = s.get_final_message()
    else:
        first = claude.messages.create(messages=messages, **kwargs)
    assert [b.type for b in first.content] == [
        "thinking",
        "text",
        "tool_use",
    ] and first.stop_reason == "tool_use"
    use = first.content[2]
    assert use.input == {"command": "echo hi"}
    messages += [
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "hi"}]},
    ]
    if stream:
        with claude.messages.stream(messages=messages, **kwargs) as s:
            second = s.get_final_message()
    else:
        second = claude.messages.create(messages=messages, **kwargs)
    assert second.content[-1].text == "It printed hi." and second.stop_reason == "end_turn"
    assert second.usage.output_tokens >= 1
    _assert_tool_result_reached_engine(fake)


@pytest.mark.parametrize("stream", [False, True])
def test_openai_sdk_chat_tool_round_trip(gpt, fake, stream):
    fake.push(TOOL_CALL, ANSWER)
    messages = [{"role": "user", "content": PROMPT}]
    kwargs = {"model": "gpt-4o", "tools": CHAT_TOOLS}
    if stream:
        with gpt.chat.completions.stream(messages=messages, **kwargs) as s:
            first = s.get_final_completion()
    else:
        first = gpt.chat.completions.create(messages=messages, **kwargs)
    choice = first.choices[0]
    assert (
        choice.finish_reason == "tool_calls"
        and choice.message.tool_calls[0].function.arguments == '{"command": "echo hi"}'
    )
    call = choice.message.tool_calls[0]
    messages += [
        {
            "role": "assistant",
            "content": choice.message.content,
            "tool_calls": [call.model_dump(exclude_none=True)],
        },
        {"role": "tool", "tool_call_id": call.id, "content": "hi"},
    ]
    if stream:
        with gpt.chat.completions.stream(messages=messages, **kwargs) as s:
            second = s.get_final_completion()
    else:
        second = gpt.chat.completions.create(messages=messages, **kwargs)
    assert second.choices[0].message.content == "It printed hi."
    _assert_tool_result_reached_engine(fake)


@pytest.mark.parametrize("stream", [False, True])
def test_openai_sdk_responses_tool_round_trip(gpt, fake, stream):
    fake.push(TOOL_CALL, ANSWER)
    items: list = [{"role": "user", "content": PROMPT}]
    kwargs = {"model": "gpt-5", "instructions": "You are a test assistant.", "tools": RESPONSES_TOOLS}
    if stream:
        with gpt.responses.stream(input=items, **kwargs) as s:
            first = s.get_final_response()
    else:
        first = gpt.responses.create(input=items, **kwargs)
    assert [o.type for o in first.output] == ["reasoning", "message", "function_call"]
    call = first.output[2]
    assert call.arguments == '{"command": "echo hi"}' and first.output_text == "I'll run a command."
    items += [o.model_dump(exclude_none=True, exclude={"parsed_arguments"}) for o in first.output]
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": "hi"})
    if stream:
        with gpt.responses.stream(input=items, **kwargs) as s:
            second = s.get_final_response()
    else:
        second = gpt.responses.create(input=items, **kwargs)
    assert second.output_text == "It printed hi." and second.status == "completed"
    _assert_tool_result_reached_engine(fake)
    assert fake.requests[-1]["messages"][0] == {"role": "system", "content": "You are a test assistant."}


def test_sdk_side_routes(claude, gpt, fake):
    count = claude.messages.count_tokens(
        model="claude-sonnet-4-6", messages=[{"role": "user", "content": PROMPT}]
    )
    assert count.input_tokens >= 1 and fake.tokenize_requests
    assert gpt.models.list().data[0].id == "kimi-linear"


def test_sdks_raise_their_own_errors(claude, gpt, fake):
    fake.push(Reply(status=400, error="prompt is too long"), Reply(status=400, error="prompt is too long"))
    with pytest.raises(anthropic.BadRequestError, match="prompt is too long"):
        claude.messages.create(
            model="claude-sonnet-4-6", max_tokens=8, messages=[{"role": "user", "content": "x"}]
        )
    with pytest.raises(openai.BadRequestError, match="prompt is too long"):
        gpt.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=str(claude.base_url), api_key="wrong", max_retries=0).messages.create(
            model="claude-sonnet-4-6", max_tokens=8, messages=[{"role": "user", "content": "x"}]
        )
    fake.push(Reply(content="never finishes", chunk_chars=2, error_after=3))
    with pytest.raises(anthropic.APIError):
        with claude.messages.stream(
            model="claude-sonnet-4-6", max_tokens=8, messages=[{"role": "user", "content": "x"}]
        ) as s:
            s.get_final_message()
