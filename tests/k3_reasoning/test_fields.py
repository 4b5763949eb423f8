"""Reasoning fields: rendering for the engine, and detection from a stream."""

import pytest

from k3.reasoning import detect_reasoning_field, fingerprint, render_upstream

RECORD = {"content": "answer", "reasoning": "why", "tool_calls": []}


@pytest.mark.parametrize(
    "field, expected",
    [
        ("reasoning_content", {"role": "assistant", "content": "answer", "reasoning_content": "why"}),
        ("reasoning", {"role": "assistant", "content": "answer", "reasoning": "why"}),
        ("kimi_k3", {"role": "assistant", "content": "answer", "reasoning_content": "why"}),
        ("think", {"role": "assistant", "content": "<think>why</think>answer"}),
        ("none", {"role": "assistant", "content": "answer"}),
    ],
)
def test_render_upstream_per_field(field, expected):
    assert render_upstream(RECORD, field) == expected


def test_render_never_writes_sentinel_keys_and_omits_empty_reasoning():
    for field in ("none", "think"):
        assert field not in render_upstream(RECORD, field)
    assert render_upstream({"content": "a", "reasoning": ""}, "think") == {
        "role": "assistant",
        "content": "a",
    }


def test_render_returns_copies_of_tool_calls():
    record = {
        "content": "",
        "reasoning": "",
        "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}],
    }
    rendered = render_upstream(record, "reasoning_content")
    rendered["tool_calls"][0]["id"] = "changed"
    assert record["tool_calls"][0]["id"] == "c"


@pytest.mark.parametrize(
    "delta, field",
    [
        ({"reasoning_content": "x"}, "reasoning_content"),
        ({"reasoning": "x", "content": ""}, "reasoning"),
        ({"content": "\n<think>x"}, "think"),
        ({"content": "<|open|>think<|sep|>"}, "kimi_k3"),
        ({"content": "hello <think>"}, None),
        ({"reasoning_content": "", "content": None}, None),
        ({}, None),
    ],
)
def test_detect_reasoning_field(delta, field):
    assert detect_reasoning_field(delta) == field


def test_fingerprint_is_over_visible_output_only():
    base = {
        "content": "answer",
        "tool_calls": [{"function": {"name": "f", "arguments": '{"b": 1, "a": [1, 2]}'}}],
    }
    same = {
        "content": " answer\n",
        "reasoning_content": "anything",
        "tool_calls": [{"function": {"name": "f", "arguments": '{"a":[1,2],"b":1}'}}],
    }
    assert fingerprint(base) == fingerprint(same)
    assert fingerprint(base) != fingerprint({**base, "content": "answers"})
    assert fingerprint(base) != fingerprint(
        {**base, "tool_calls": [{"function": {"name": "g", "arguments": '{"b": 1, "a": [1, 2]}'}}]}
    )
    assert fingerprint(
        {"content": None, "tool_calls": [None, {"function": {"arguments": 5}}]}
    )  # junk never raises
