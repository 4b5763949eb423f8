"""End to end over real sockets: the official `anthropic` SDK -> `k3 serve` -> `kimi-engine serve
--synthetic tiny`, streaming, with one tool-call round trip.

The tiny model's text is random, so the engine runs with the scripted-replies TEST HOOK
(engine/server/scripted.py): for the matching turns the sampler is forced to write a Hermes
`<tool_call>{...}</tool_call>` and then a plain answer, which k3 parses with `--tool-parser hermes`.
Everything else is real: template, tokenizer, queue, prefill and decode of the model, SSE, k3's
translation to and from Anthropic Messages.
"""

from __future__ import annotations

import pytest

from tests.server.server_support import SCRIPT, engine_and_k3

TOOLS = [
    {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
]


@pytest.fixture(scope="module")
def k3_url(tmp_path_factory):
    with engine_and_k3(SCRIPT, tmp_path_factory.mktemp("script"), "--tool-parser", "hermes") as (_, url, _):
        yield url


def test_anthropic_sdk_tool_round_trip_through_k3(k3_url):
    import anthropic

    client = anthropic.Anthropic(base_url=k3_url, api_key="local", max_retries=0, timeout=60)
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    counted = client.messages.count_tokens(model="claude-sonnet-4-5", messages=messages, tools=TOOLS)
    with client.messages.stream(
        model="claude-sonnet-4-5", max_tokens=200, tools=TOOLS, messages=messages
    ) as s:
        first = s.get_final_message()
    calls = [b for b in first.content if b.type == "tool_use"]
    assert first.stop_reason == "tool_use" and len(calls) == 1
    assert calls[0].name == "get_weather" and calls[0].input == {"city": "Paris"}
    assert first.usage.input_tokens == counted.input_tokens > 0  # k3 counted with the engine's /tokenize

    messages += [
        {"role": "assistant", "content": first.content},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": calls[0].id, "content": "sunny, 21 C"}],
        },
    ]
    with client.messages.stream(
        model="claude-sonnet-4-5", max_tokens=200, tools=TOOLS, messages=messages
    ) as s:
        text = "".join(s.text_stream)
        second = s.get_final_message()
    assert text == "It is sunny in Paris."
    assert second.stop_reason == "end_turn"
    # Anthropic counts prefix-cache hits apart: the second turn's prompt is the first one and more.
    assert second.usage.input_tokens + second.usage.cache_read_input_tokens > first.usage.input_tokens
