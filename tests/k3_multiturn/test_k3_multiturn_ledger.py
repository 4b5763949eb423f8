"""The ledger's bounds reach it from the configuration, and hidden reasoning still comes back."""

from __future__ import annotations

import httpx
from conversation import ARGUMENTS, CHAT_TOOL, QUESTION, REASONING, RESULT, first_turn, second_turn, stats

from k3.testing.fake_upstream import Reply, ToolCall


def test_a_full_ledger_evicts_and_an_evicted_turn_falls_back_to_its_signature(engine, proxy):
    base = proxy(ledger_max_entries=1)
    older = first_turn(engine, base)
    newer = first_turn(engine, base)
    assert stats(base)["entries"] == 1 and stats(base)["evictions"] == 1
    restored = second_turn(engine, base, older)
    assert restored["reasoning_content"] == REASONING  # carried inside the signature
    assert restored["tool_calls"][0]["function"]["arguments"] != ARGUMENTS  # the bytes were evicted
    assert second_turn(engine, base, newer)["tool_calls"][0]["function"]["arguments"] == ARGUMENTS


def test_hidden_reasoning_never_reaches_a_chat_client_yet_comes_back_to_the_engine(engine, proxy):
    base = proxy(show_reasoning=False)
    engine.push(
        Reply(
            content="Looking.", reasoning=REASONING, tool_calls=[ToolCall("read_file", ARGUMENTS, id="c1")]
        ),
        Reply(content="Done."),
    )
    body = {"model": "gpt-4o", "tools": [CHAT_TOOL], "messages": [{"role": "user", "content": QUESTION}]}
    message = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=20).json()["choices"][0]["message"]
    assert "reasoning_content" not in message
    body["messages"] += [message, {"role": "tool", "tool_call_id": "c1", "content": RESULT}]
    assert httpx.post(f"{base}/v1/chat/completions", json=body, timeout=20).status_code == 200
    assert engine.requests[-1]["messages"][1]["reasoning_content"] == REASONING


def test_identical_stripped_turns_each_get_their_own_reasoning_back(engine, proxy):
    """An agent that repeats a turn word for word (same text, same call) and strips reasoning:
    the position in the history tells the two ledger entries apart."""
    base = proxy(show_reasoning=False)
    first, second = "First look: read the file.", "Second look: the file may have changed."
    for reasoning, call_id in ((first, "c1"), (second, "c2")):
        engine.push(
            Reply(
                content="Looking.",
                reasoning=reasoning,
                tool_calls=[ToolCall("read_file", ARGUMENTS, id=call_id)],
            )
        )
    engine.push(Reply(content="Done."))
    body = {"model": "gpt-4o", "tools": [CHAT_TOOL], "messages": [{"role": "user", "content": QUESTION}]}
    for _ in range(2):
        reply = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=20).json()["choices"][0][
            "message"
        ]
        assert "reasoning_content" not in reply
        call_id = reply["tool_calls"][0]["id"]
        body["messages"] += [reply, {"role": "tool", "tool_call_id": call_id, "content": RESULT}]
    assert httpx.post(f"{base}/v1/chat/completions", json=body, timeout=20).status_code == 200
    sent = [m for m in engine.requests[-1]["messages"] if m["role"] == "assistant"]
    assert [m.get("reasoning_content") for m in sent] == [first, second]
    assert all(m["tool_calls"][0]["function"]["arguments"] == ARGUMENTS for m in sent)
