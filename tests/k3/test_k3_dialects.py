"""Each dialect, both directions: ingress to the IR and the upstream payload, egress judged by the SDKs."""

from __future__ import annotations

import anthropic
import openai
import pytest
from k3_helpers import anthropic_stream, chat_stream, responses_stream, sse_frames

from k3 import ir, presets
from k3.config import Config
from k3.dialects import DIALECTS, Dialect
from k3.dialects import anthropic as anthropic_dialect
from k3.dialects import chat as chat_dialect
from k3.dialects import responses as responses_dialect
from k3.dialects.common import Turn
from k3.errors import ProxyError
from k3.upstream_request import TOOL_ERROR_PREFIX, build_payload

CONFIG = Config()


def payload(module, body, config=CONFIG):
    return build_payload(module.ingress(body, config.model), config, "engine-model")


def turn(module, body, preset="openai"):
    request = module.ingress(body, "default-model")
    return Turn(
        module.__name__.rsplit(".", 1)[1], presets.get(preset), request, body, module.ID_PREFIX + "abc123"
    )


def events_for(call_args='{"cmd": "ls"}', stop="tool_calls"):
    return [
        ir.ReasoningDelta("plan "),
        ir.ReasoningDelta("it"),
        ir.ReasoningEnd("plan it", None),
        ir.TextDelta("Running "),
        ir.TextDelta("ls."),
        ir.ToolCallStart(0, "call_1", "bash"),
        ir.ToolCallDelta(0, call_args[:5]),
        ir.ToolCallDelta(0, call_args[5:]),
        ir.ToolCallEnd(0, "call_1", "bash", call_args),
        ir.Finish(stop, ir.Usage(100, 20, 40, 5)),
    ]


RESPONSE = ir.CanonicalResponse(
    [
        ir.ReasoningPart("plan it"),
        ir.TextPart("Running ls."),
        ir.ToolCallPart("call_1", "bash", '{"cmd": "ls"}'),
    ],
    "tool_calls",
    ir.Usage(100, 20, 40, 5),
)

# ---------------------------------------------------------------------------------------------
# Anthropic


def test_anthropic_ingress_system_tools_results_and_images():
    body = {
        "model": "claude-sonnet-4-6",
        "max_tokens": 64,
        "system": [
            {"type": "text", "text": "sys one", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "sys two"},
        ],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "system", "content": "mid-conversation system"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "sig"},  # not ours: dropped
                    {"type": "text", "text": "ok"},
                    {"type": "tool_use", "id": "call_9", "name": "bash", "input": {"cmd": "ls"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "call_9",
                        "is_error": True,
                        "content": [
                            {"type": "text", "text": "no such file"},
                            {
                                "type": "image",
                                "source": {"type": "base64", "media_type": "image/png", "data": "QUJD"},
                            },
                        ],
                    },
                    {"type": "text", "text": "what now?"},
                    {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}},
                ],
            },
        ],
        "tools": [
            {"name": "bash", "description": "run", "input_schema": {"type": "object"}},
            {"type": "web_search_20250305", "name": "web_search"},
        ],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "stop_sequences": ["</end>"],
        "thinking": {"type": "enabled", "budget_tokens": 5000},
        "top_k": 20,
    }
    out = payload(anthropic_dialect, body)
    assert out["model"] == "engine-model"
    assert out["messages"] == [
        {"role": "system", "content": "sys one\n\nsys two"},
        {"role": "user", "content": "a\nb"},
        {"role": "system", "content": "mid-conversation system"},
        {
            "role": "assistant",
            "content": "ok",
            "tool_calls": [
                {
                    "id": "call_9",
                    "type": "function",
                    "function": {"name": "bash", "arguments": '{"cmd":"ls"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_9", "content": TOOL_ERROR_PREFIX + "no such file"},
        {
            "role": "user",
            "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,QUJD"}}],
        },
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what now?"},
                {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
            ],
        },
    ]
    assert out["tools"] == [
        {
            "type": "function",
            "function": {"name": "bash", "description": "run", "parameters": {"type": "object"}},
        }
    ]
    assert out["tool_choice"] == "required" and out["parallel_tool_calls"] is False
    assert out["stop"] == ["</end>"] and out["max_tokens"] == 64 and out["top_k"] == 20
    assert out["reasoning_effort"] == "medium"


@pytest.mark.parametrize(
    ("choice", "expected"),
    [({"type": "auto"}, "auto"), ({"type": "any"}, "required"), ({"type": "none"}, "none"),
     ({"type": "tool", "name": "f"}, {"type": "function", "function": {"name": "f"}})],
)  # fmt: skip
def test_anthropic_tool_choice(choice, expected):
    body = {"messages": [], "tools": [{"name": "f", "input_schema": {}}], "tool_choice": choice}
    assert payload(anthropic_dialect, body)["tool_choice"] == expected


@pytest.mark.parametrize(
    ("budget", "effort"),
    [(4096, "low"), (4097, "medium"), (16384, "medium"), (16385, "high"), (32000, "high")],
)
def test_anthropic_thinking_budget_maps_to_effort(budget, effort):
    body = {"messages": [], "thinking": {"type": "enabled", "budget_tokens": budget}}
    assert anthropic_dialect.ingress(body, "m").reasoning_effort == effort


def test_anthropic_bad_shapes_name_the_field():
    cases = [
        ({"messages": "x"}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": 5}}]}]},
         "messages[0].content[0].source.data"),
        ({"messages": [], "max_tokens": "ten"}, "max_tokens"),
        ({"messages": [], "tools": [{"input_schema": {}}]}, "tools[0].name"),
    ]  # fmt: skip
    for body, field in cases:
        with pytest.raises(ProxyError) as err:
            anthropic_dialect.ingress(body, "m")
        assert err.value.status == 400 and field in err.value.message


def test_anthropic_json_egress_is_a_valid_message():
    t = turn(anthropic_dialect, {"model": "claude-x", "messages": [], "max_tokens": 5}, "claude-code")
    body = anthropic_dialect.render(RESPONSE, t)
    message = anthropic.types.Message.model_validate(body)
    assert [b.type for b in message.content] == ["thinking", "text", "tool_use"]
    # Engine ids reach Anthropic clients as toolu_ ids and map back exactly.
    assert message.content[2].input == {"cmd": "ls"} and message.content[2].id == "toolu_k3_call_1"
    assert message.stop_reason == "tool_use" and message.model == "claude-x"
    assert (
        message.usage.input_tokens,
        message.usage.cache_read_input_tokens,
        message.usage.output_tokens,
    ) == (60, 40, 20)


def test_anthropic_thinking_disabled_hides_reasoning():
    body = {"messages": [], "thinking": {"type": "disabled"}}
    t = turn(anthropic_dialect, body, "claude-code")
    assert [b["type"] for b in anthropic_dialect.render(RESPONSE, t)["content"]] == ["text", "tool_use"]
    stream = anthropic_dialect.Stream(t)
    text = (stream.start() + b"".join(stream.feed(e) for e in events_for())).decode()
    assert "thinking" not in text
    assert [b.type for b in anthropic_stream(text).content] == ["text", "tool_use"]


@pytest.mark.parametrize(
    ("stop", "expected"),
    [
        ("stop", "end_turn"),
        ("length", "max_tokens"),
        ("tool_calls", "tool_use"),
        ("content_filter", "refusal"),
    ],
)
def test_stop_reason_mapping_is_consistent_across_dialects(stop, expected):
    response = ir.CanonicalResponse([ir.TextPart("x")], stop, ir.Usage())
    a = anthropic_dialect.render(response, turn(anthropic_dialect, {"messages": []}))
    c = chat_dialect.render(response, turn(chat_dialect, {"messages": []}))
    r = responses_dialect.render(response, turn(responses_dialect, {"input": "x"}))
    assert a["stop_reason"] == expected
    assert c["choices"][0]["finish_reason"] == stop
    incomplete = {"length": "max_output_tokens", "content_filter": "content_filter"}.get(stop)
    assert r["status"] == ("incomplete" if incomplete else "completed")
    assert (r["incomplete_details"] or {}).get("reason") == incomplete


def test_anthropic_stream_event_order_and_sdk_accumulation():
    t = turn(anthropic_dialect, {"model": "claude-x", "messages": []}, "claude-code")
    stream = anthropic_dialect.Stream(t)
    events = events_for()
    events[2] = ir.ReasoningEnd("plan it", "sig-1")
    text = (stream.start() + b"".join(stream.feed(e) for e in events)).decode()
    names = [name for name, _ in sse_frames(text)]
    assert names == [
        "message_start", "ping",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "message_delta", "message_stop",
    ]  # fmt: skip
    message = anthropic_stream(text)
    assert message.content[0].thinking == "plan it" and message.content[0].signature == "sig-1"
    assert message.content[1].text == "Running ls."
    assert message.content[2].input == {"cmd": "ls"}
    assert message.stop_reason == "tool_use" and message.usage.output_tokens == 20


def test_anthropic_stop_sequence_reported():
    t = turn(anthropic_dialect, {"messages": [], "stop_sequences": ["</x>"]})
    response = ir.CanonicalResponse([ir.TextPart("a")], "stop", ir.Usage(), "</x>")
    body = anthropic_dialect.render(response, t)
    assert (body["stop_reason"], body["stop_sequence"]) == ("stop_sequence", "</x>")


# ---------------------------------------------------------------------------------------------
# Chat


def test_chat_ingress_keeps_arguments_byte_exact_and_forwards_engine_keys():
    raw_args = '{ "path" :  "a.py"}'
    body = {
        "model": "gpt-4o",
        "messages": [
            {"role": "developer", "content": [{"type": "text", "text": "be brief"}]},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look"},
                    {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,AA=="}},
                ],
            },
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "need file",
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "read", "arguments": raw_args}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "print(1)"}]},
        ],
        "max_tokens": 10,
        "max_completion_tokens": 20,
        "stop": "END",
        "seed": 7,
        "n": 1,
        "user": "u",
        "response_format": {"type": "json_object"},
        "stream_options": {"include_usage": False},
    }
    out = payload(chat_dialect, body)
    assert out["messages"][0] == {"role": "system", "content": "be brief"}
    assert out["messages"][1]["content"][1] == {
        "type": "image_url",
        "image_url": {"url": "data:image/jpeg;base64,AA=="},
    }
    assert out["messages"][2]["tool_calls"][0]["function"]["arguments"] == raw_args
    assert out["messages"][2]["reasoning_content"] == "need file" and out["messages"][2]["content"] == ""
    assert out["messages"][3] == {"role": "tool", "tool_call_id": "c1", "content": "print(1)"}
    assert out["max_tokens"] == 20 and out["stop"] == ["END"] and out["seed"] == 7
    assert "n" not in out and "user" not in out and out["response_format"] == {"type": "json_object"}


def test_reasoning_field_none_reasoning_and_think():
    body = {"messages": [{"role": "assistant", "content": "x", "reasoning_content": "r"}]}
    assert (
        "reasoning_content" not in payload(chat_dialect, body, Config(reasoning_field="none"))["messages"][0]
    )
    assert payload(chat_dialect, body, Config(reasoning_field="reasoning"))["messages"][0]["reasoning"] == "r"
    inline = payload(chat_dialect, body, Config(reasoning_field="think"))["messages"][0]
    assert inline["content"] == "<think>r</think>x" and "reasoning_content" not in inline
    k3_channel = payload(chat_dialect, body, Config(reasoning_field="kimi_k3"))["messages"][0]
    assert k3_channel["reasoning_content"] == "r"


def test_inline_think_in_a_client_echo_is_split_from_the_visible_text():
    body = {"messages": [{"role": "assistant", "content": "<think>r</think>x"}]}
    message = payload(chat_dialect, body, Config())["messages"][0]
    assert (message["content"], message["reasoning_content"]) == ("x", "r")


def test_config_rejects_unknown_parsers_and_fields():
    with pytest.raises(ValueError, match="unknown --tool-parser"):
        Config(tool_parser="kimi_k9")
    with pytest.raises(ValueError, match="unknown --reasoning-field"):
        Config(reasoning_field="in line")
    assert Config(reasoning_field="inline").reasoning_field == "think"  # the reference k3's name
    assert (
        Config(tool_parser="kimi_k2").tool_parser == "kimi"
        and Config(tool_parser="none").tool_parser == "passthrough"
    )
    with pytest.raises(ValueError, match="needs --tool-parser kimi_k3"):
        Config(reasoning_field="kimi_k3", tool_parser="json")
    assert Config(reasoning_field="kimi_k3").parser_for("passthrough") == "kimi_k3"
    assert Config(tool_parser="hermes").parser_for("passthrough") == "hermes"
    assert Config().parser_for("kimi") == "kimi"


def test_chat_json_egress_is_a_valid_completion():
    body = chat_dialect.render(RESPONSE, turn(chat_dialect, {"model": "gpt-x", "messages": []}))
    completion = openai.types.chat.ChatCompletion.model_validate(body)
    message = completion.choices[0].message
    assert message.content == "Running ls." and message.tool_calls[0].function.arguments == '{"cmd": "ls"}'
    assert body["choices"][0]["message"]["reasoning_content"] == "plan it"
    assert completion.choices[0].finish_reason == "tool_calls" and completion.usage.total_tokens == 120


@pytest.mark.parametrize("include_usage", [None, False, True])
def test_chat_stream_frames_and_usage_opt_in(include_usage):
    body = {"model": "gpt-x", "messages": [], "stream": True}
    if include_usage is not None:
        body["stream_options"] = {"include_usage": include_usage}
    stream = chat_dialect.Stream(turn(chat_dialect, body))
    text = (stream.start() + b"".join(stream.feed(e) for e in events_for())).decode()
    frames = sse_frames(text)
    assert frames[0][1]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    usage_chunks = [f for f in frames if isinstance(f[1], dict) and f[1].get("usage")]
    assert len(usage_chunks) == (1 if include_usage else 0)
    completion = chat_stream(text)
    message = completion.choices[0].message
    assert message.content == "Running ls." and message.tool_calls[0].function.arguments == '{"cmd": "ls"}'
    assert completion.choices[0].finish_reason == "tool_calls"
    reasoning = "".join(
        f[1]["choices"][0]["delta"].get("reasoning_content", "") for f in frames[:-1] if f[1].get("choices")
    )
    assert reasoning == "plan it"


# ---------------------------------------------------------------------------------------------
# Responses


def test_responses_ingress_merges_assistant_siblings_and_translates_tool_choice():
    body = {
        "model": "gpt-5",
        "instructions": "be careful",
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "dev"}]},
            {"role": "user", "content": "hi"},
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [{"type": "summary_text", "text": "think"}],
                "encrypted_content": "enc",  # not one of ours: the reasoning is not forwarded
            },
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "calling"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"a" : 1}'},
            {"type": "function_call_output", "call_id": "c1", "output": "done"},
            {
                "type": "custom_tool_call",
                "call_id": "c2",
                "name": "apply_patch",
                "input": "*** Begin Patch\n",
            },
            {"type": "custom_tool_call_output", "call_id": "c2", "output": "ok"},
            {"type": "web_search_call", "id": "ws"},
        ],
        "tools": [
            {"type": "function", "name": "f", "parameters": {"type": "object"}},
            {
                "type": "custom",
                "name": "apply_patch",
                "description": "patch",
                "format": {"type": "grammar", "syntax": "lark", "definition": "start: x"},
            },
            {"type": "web_search"},
        ],
        "tool_choice": {"type": "function", "name": "f"},
        "reasoning": {"effort": "high"},
        "max_output_tokens": 99,
        "store": False,
        "prompt_cache_key": "k",
        "text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"}}},
    }
    out = payload(responses_dialect, body)
    assert out["messages"][:3] == [
        {"role": "system", "content": "be careful\n\ndev"},
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "calling",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a" : 1}'}}
            ],
        },
    ]
    assert out["messages"][3] == {"role": "tool", "tool_call_id": "c1", "content": "done"}
    assert out["messages"][4]["tool_calls"][0]["function"] == {
        "name": "apply_patch",
        "arguments": '{"input":"*** Begin Patch\\n"}',
    }
    assert [t["function"]["name"] for t in out["tools"]] == ["f", "apply_patch"]
    assert "lark grammar" in out["tools"][1]["function"]["parameters"]["properties"]["input"]["description"]
    assert out["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert out["reasoning_effort"] == "high" and out["max_tokens"] == 99
    assert out["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "s", "schema": {"type": "object"}},
    }
    assert "prompt_cache_key" not in out and "store" not in out


@pytest.mark.parametrize(
    ("choice", "expected"),
    [("auto", "auto"), ("required", "required"), ({"type": "allowed_tools", "mode": "required", "tools": []}, "required"),
     ({"type": "custom", "name": "p"}, {"type": "function", "function": {"name": "p"}}), ({"type": "web_search"}, "auto")],
)  # fmt: skip
def test_responses_tool_choice_shapes(choice, expected):
    body = {"input": "x", "tools": [{"type": "function", "name": "p"}], "tool_choice": choice}
    assert payload(responses_dialect, body)["tool_choice"] == expected


def test_responses_json_egress_is_a_valid_response():
    body = {"model": "gpt-5", "input": "x", "tools": [{"type": "function", "name": "bash", "parameters": {}}]}
    rendered = responses_dialect.render(RESPONSE, turn(responses_dialect, body, "codex"))
    response = openai.types.responses.Response.model_validate(rendered)
    assert [o.type for o in response.output] == ["reasoning", "message", "function_call"]
    assert response.output_text == "Running ls."
    assert response.output[2].call_id == "call_1" and response.output[2].arguments == '{"cmd": "ls"}'
    assert response.tools[0].name == "bash" and response.status == "completed"


def test_responses_stream_sequence_and_sdk_accumulation():
    t = turn(responses_dialect, {"model": "gpt-5", "input": "x", "stream": True}, "codex")
    stream = responses_dialect.Stream(t)
    text = (stream.start() + b"".join(stream.feed(e) for e in events_for())).decode()
    names = [n for n, _ in sse_frames(text)]
    assert names[:2] == ["response.created", "response.in_progress"] and names[-1] == "response.completed"
    assert names.count("response.output_item.added") == names.count("response.output_item.done") == 3
    assert "response.reasoning_summary_part.added" in names and "response.content_part.done" in names
    final = responses_stream(text)
    assert [o.type for o in final.output] == ["reasoning", "message", "function_call"]
    assert final.output[2].arguments == '{"cmd": "ls"}' and final.usage.output_tokens == 20
    assert final == responses_dialect_render_equivalent(t)


def responses_dialect_render_equivalent(t):
    return openai.types.responses.Response.model_validate(responses_dialect.render(RESPONSE, t))


def test_responses_length_gives_incomplete_event():
    t = turn(responses_dialect, {"input": "x", "stream": True})
    stream = responses_dialect.Stream(t)
    text = (
        stream.start() + stream.feed(ir.TextDelta("cut")) + stream.feed(ir.Finish("length", ir.Usage()))
    ).decode()
    assert sse_frames(text)[-1][0] == "response.incomplete"
    assert responses_stream(text).incomplete_details.reason == "max_output_tokens"


def test_responses_custom_tool_call_round_trips_as_custom_item():
    body = {"input": "x", "stream": True, "tools": [{"type": "custom", "name": "apply_patch"}]}
    t = turn(responses_dialect, body, "codex")
    args = '{"input": "*** Begin Patch\\n*** End Patch\\n"}'
    events = [
        ir.ToolCallStart(0, "c9", "apply_patch"),
        ir.ToolCallDelta(0, args),
        ir.ToolCallEnd(0, "c9", "apply_patch", args),
        ir.Finish("tool_calls", ir.Usage()),
    ]
    stream = responses_dialect.Stream(t)
    text = (stream.start() + b"".join(stream.feed(e) for e in events)).decode()
    assert "response.custom_tool_call_input.done" in [n for n, _ in sse_frames(text)]
    item = responses_stream(text).output[0]
    assert (
        item.type == "custom_tool_call"
        and item.input == "*** Begin Patch\n*** End Patch\n"
        and item.call_id == "call_k3_c9"  # the engine's "c9", in the Responses style
    )
    rendered = responses_dialect.render(
        ir.CanonicalResponse([ir.ToolCallPart("c9", "apply_patch", args)], "tool_calls", ir.Usage()), t
    )
    assert rendered["output"][0]["input"] == "*** Begin Patch\n*** End Patch\n"


@pytest.mark.parametrize("name", sorted(DIALECTS))
def test_each_dialect_module_implements_the_protocol(name):
    assert isinstance(DIALECTS[name], Dialect)
    assert callable(DIALECTS[name].Stream)
