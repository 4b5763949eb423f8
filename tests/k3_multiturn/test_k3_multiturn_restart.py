"""A persistent ledger survives a restart of the `k3 serve` process: the turn recorded before it
is restored after it, by signature id (Anthropic) and by fingerprint (a Chat client that strips
reasoning). Only the ledger holds the raw argument bytes, so these checks need it."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from conversation import ARGUMENTS, CHAT_TOOL, QUESTION, REASONING, RESULT, first_turn, second_turn

from common.listen import free_port
from k3.testing.fake_upstream import Reply, ToolCall
from runners.processes import stop

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def k3_serve(*args: str) -> Iterator[str]:
    port = free_port()
    command = [sys.executable, "-m", "k3", "serve", "--port", str(port), "--log-level", "warning", *args]
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(400):
            if process.poll() is not None:
                raise AssertionError(f"k3 serve exited: {process.stderr.read()}")
            try:
                if httpx.get(f"{base}/", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.05)
        else:
            raise AssertionError("k3 serve did not start within 20 s")
        yield base
    finally:
        stop(process)


def chat(base: str, messages: list) -> httpx.Response:
    body = {"model": "gpt-4o", "tools": [CHAT_TOOL], "messages": messages}
    return httpx.post(
        f"{base}/v1/chat/completions", json=body, headers={"authorization": "Bearer sk-test"}, timeout=20
    )


def test_a_restarted_proxy_restores_turns_from_its_ledger(engine, engine_server, tmp_path):
    flags = (
        "--upstream",
        engine_server[1],
        "--ledger",
        str(tmp_path / "ledger.db"),
        "--state-dir",
        str(tmp_path),
    )
    question = [{"role": "user", "content": QUESTION}]
    with k3_serve(*flags) as base:
        anthropic_turn = first_turn(engine, base)
        engine.push(
            Reply(
                content="Looking.",
                reasoning=REASONING,
                tool_calls=[ToolCall("read_file", ARGUMENTS, id="c7")],
            )
        )
        message = chat(base, question).json()["choices"][0]["message"]
    assert (tmp_path / "k3-signing.key").stat().st_mode & 0o077 == 0

    with k3_serve(*flags) as base:
        upstream = second_turn(engine, base, anthropic_turn)
        assert upstream["reasoning_content"] == REASONING
        assert upstream["tool_calls"][0]["function"]["arguments"] == ARGUMENTS
        stripped = {"role": "assistant", "content": message["content"], "tool_calls": message["tool_calls"]}
        stripped["tool_calls"][0]["function"]["arguments"] = (
            '{"path": "src/ä.py", "limit": 2}'  # re-serialised
        )
        engine.push(Reply(content="Done."))
        tool = {"role": "tool", "tool_call_id": "c7", "content": RESULT}
        assert chat(base, [*question, stripped, tool]).status_code == 200
        restored = engine.requests[-1]["messages"][1]
        assert restored["reasoning_content"] == REASONING
        assert restored["tool_calls"][0] == {
            "id": "c7",
            "type": "function",
            "function": {"name": "read_file", "arguments": ARGUMENTS},
        }
        ledger = httpx.get(f"{base}/k3/stats", timeout=10).json()["ledger"]
        assert ledger["hits"] == 1 and ledger["fingerprint_hits"] == 1 and ledger["entries"] == 2
