"""The checks can fail: each defect k3 could introduce is named, with the request it is in."""

import copy
import json
from pathlib import Path

import pytest

from runners.conformance.clients import CLIENTS, Outcome
from runners.conformance.scenarios import (
    ERROR,
    FIELDS,
    FORMATS,
    PLAIN,
    TOOLS,
    Evidence,
    Words,
    check_replayed_turn,
    select,
)
from runners.conformance.tap import Hit
from runners.conformance.upstream import Exchange

WORDS = Words("abc123")
SDK = CLIENTS["openai-sdk-chat"]


def second_request(reply, result=WORDS.marker, content="Reading the marker."):
    call = reply.tool_calls[0]
    assistant = {
        "role": "assistant",
        "content": content,
        "reasoning_content": reply.reasoning,
        "tool_calls": [
            {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
        ],
    }
    messages = [
        {"role": "user", "content": "go"},
        assistant,
        {"role": "tool", "tool_call_id": call.id, "content": result},
    ]
    return Exchange("agent", "POST", "/v1/chat/completions", {}, {"messages": messages}, turn=1)


def first_reply(scenario=TOOLS, client=SDK):
    return scenario.replies(client, WORDS)[0]


def test_a_faithful_second_request_passes():
    assert check_replayed_turn(second_request(first_reply()), first_reply(), WORDS.marker) is None


def edit(exchange, change):
    changed = copy.deepcopy(exchange)
    change(changed.body["messages"])
    return changed


@pytest.mark.parametrize(
    "change, words",
    [
        (
            lambda m: m[1]["tool_calls"][0]["function"].update(arguments='{"command":"cat marker.txt"}'),
            "engine's bytes",
        ),
        (lambda m: m[1]["tool_calls"][0].update(id="call_other"), "not the engine's 'call_k3conformance0'"),
        (lambda m: m[1].pop("reasoning_content"), "reasoning_content is null"),
        (lambda m: m[2].update(tool_call_id="call_other"), "tool result for 'call_other'"),
        (lambda m: m[2].update(content="nothing"), "lacks 'marker-abc123'"),
        (lambda m: m.pop(2), "no tool message after messages[1]"),
        (lambda m: m.pop(1), "no assistant message calling 'shell'"),
    ],
)
def test_each_defect_is_named(change, words):
    problem = check_replayed_turn(edit(second_request(first_reply()), change), first_reply(), WORDS.marker)
    assert problem is not None and words in problem and problem.startswith("engine request #2")


def test_reasoning_fields_are_checked_where_the_engine_reads_them():
    by_name = {s.name: s for s in FIELDS}
    think = first_reply(by_name["reasoning_field.think"])
    plain = second_request(think)
    assert "does not start with the engine's <think>" in check_replayed_turn(plain, think, WORDS.marker)
    inline = second_request(think, content=f"<think>{think.reasoning}</think>Reading the marker.")
    assert check_replayed_turn(inline, think, WORDS.marker) is None
    keyed = first_reply(by_name["reasoning_field.reasoning"])
    assert "reasoning is null" in check_replayed_turn(second_request(keyed), keyed, WORDS.marker)


def test_pythonic_calls_are_compared_by_value_and_k2_ids_by_identity():
    by_name = {s.name: s for s in FORMATS}
    pythonic = first_reply(by_name["tool_format.pythonic"])
    exchange = edit(
        second_request(pythonic),
        lambda m: m[1]["tool_calls"][0]["function"].update(
            arguments=json.dumps({"command": "cat marker.txt"})
        ),
    )
    exchange.body["messages"][1]["tool_calls"][0]["id"] = "minted"
    exchange.body["messages"][2]["tool_call_id"] = "minted"
    assert check_replayed_turn(exchange, pythonic, WORDS.marker) is None
    k2 = first_reply(by_name["tool_format.kimi"])
    wrong = second_request(k2)  # carries the native id, not K2's functions.shell:0
    assert "functions.shell:0" in check_replayed_turn(wrong, k2, WORDS.marker)


def evidence(**kw):
    base = dict(
        outcome=Outcome("", ""),
        returncode=0,
        seconds=1.0,
        timeout=60.0,
        exchanges=[],
        hits=[],
        work=Path("."),
    )
    return Evidence(**(base | kw))


def agent(turn, stream=True):
    return Exchange(
        "agent", "POST", "/v1/chat/completions", {}, {"stream": stream, "messages": []}, turn=turn
    )


def sse_hit(path="/v1/chat/completions", status=200, frames=6):
    return Hit("POST", path, status, "text/event-stream", ["data"] * frames)


def test_common_checks_name_timeouts_failed_side_calls_and_extra_requests():
    claude = CLIENTS["claude-code"]
    timed_out = evidence(returncode=None, hits=[Hit("HEAD", "/", 200)])
    assert "did not finish within 60 s; its last request: HEAD / -> 200" in PLAIN.check(
        claude, WORDS, timed_out
    )
    side = Hit("POST", "/v1/messages/count_tokens?beta=true", 404, "application/json", error_body="no route")
    assert "k3 answered the client's POST /v1/messages/count_tokens?beta=true -> 404" in PLAIN.check(
        claude, WORDS, evidence(hits=[side], exchanges=[agent(0)])
    )
    extra = evidence(exchanges=[agent(0), agent(None)], hits=[sse_hit()])
    assert "made 2 agent requests; the script has 1" in PLAIN.check(claude, WORDS, extra)
    short = evidence(exchanges=[agent(0)], outcome=Outcome("", "boom"))
    assert "made 1 of 2 agent requests and stopped; it said: boom" in TOOLS.check(claude, WORDS, short)


def test_plain_and_error_verdicts():
    claude = CLIENTS["claude-code"]
    good = evidence(exchanges=[agent(0)], hits=[sse_hit("/v1/messages")], outcome=Outcome(WORDS.answer, ""))
    assert PLAIN.check(claude, WORDS, good) is None
    unstreamed = evidence(
        exchanges=[agent(0, stream=False)], hits=[sse_hit("/v1/messages")], outcome=good.outcome
    )
    assert "stream=False" in PLAIN.check(claude, WORDS, unstreamed)
    few = evidence(exchanges=[agent(0)], hits=[sse_hit("/v1/messages", frames=2)], outcome=good.outcome)
    assert "in 2 frames" in PLAIN.check(claude, WORDS, few)
    failing = [sse_hit("/v1/messages", status=500)]
    shown = evidence(
        exchanges=[agent(0)], hits=failing, outcome=Outcome("", f"API Error: 500 {WORDS.failure}")
    )
    assert ERROR.check(claude, WORDS, shown) is None
    hidden = evidence(exchanges=[agent(0)], hits=failing, outcome=Outcome("", "something went wrong"))
    assert "did not show the engine's error" in ERROR.check(claude, WORDS, hidden)


def test_outcomes_are_read_from_each_clients_output():
    claude = CLIENTS["claude-code"].outcome(
        '{"type":"result","is_error":true,"result":"API Error: 400 x"}', "", 1
    )
    assert claude == Outcome("", "API Error: 400 x")
    codex = CLIENTS["codex"].outcome(
        '{"type":"item.completed","item":{"type":"agent_message","text":"hi"}}\n'
        '{"type":"turn.failed","error":{"message":"bad"}}\n',
        "",
        1,
    )
    assert codex == Outcome("hi", "bad")
    opencode = CLIENTS["opencode-chat"].outcome(
        '{"type":"text","part":{"text":"hello"}}\n{"type":"error","error":{"name":"APIError","data":{"message":"m"}}}',
        "",
        0,
    )
    assert opencode == Outcome("hello", "m")
    wrapped = "Aider v0.86.2\n\nlitellm.BadRequestError: OpenAIException - k3 scripted\nfailure abc\n"
    assert (
        CLIENTS["aider"].outcome(wrapped, "", 0).error
        == "litellm.BadRequestError: OpenAIException - k3 scripted failure abc"
    )
    assert CLIENTS["anthropic-sdk"].outcome('{"error": "APIStatusError: x"}\n', "", 1) == Outcome(
        "", "APIStatusError: x"
    )


def test_selection_by_client_and_family():
    keys = [c.key for c in select(["openai-sdk-chat"], ["tool_format"])]
    assert keys == [
        f"openai-sdk-chat.tool_format.{f}" for f in ("kimi_k3", "kimi", "hermes", "json", "pythonic")
    ]
    with pytest.raises(ValueError, match="unknown client"):
        select(["nobody"])
    with pytest.raises(ValueError, match="no case matches"):
        select(["aider"], ["apply_patch"])
