"""The README quick start with Claude Code: `kimi-engine serve` (synthetic tiny: the same tokenizer and
layout as the trained tiny, without minutes of training) behind `k3 serve --tool-parser kimi`, and Claude
Code's captured first request (tests/k3/fixtures/client_requests.jsonl, built from shared/reference) sent
unchanged — its path, headers and body — to k3, streaming as Claude Code does.

The engine's defaults are the quick start's (no --max-context). Its reply is scripted (TEST HOOK,
engine/server/scripted.py) so the turn ends in a few tokens instead of Claude Code's max_tokens of random
text; the prompt still goes through k3's translation, the template, the BPE tokenizer and a real prefill.
"""

from __future__ import annotations

import json
import re
import sysconfig
from pathlib import Path

import httpx
import pytest

from tests.server.server_support import CliProcess, engine_and_k3

CAPTURES = Path(__file__).parents[1] / "k3" / "fixtures" / "client_requests.jsonl"
REPLY = "Hi! How can I help?"
# Headers httpx sets itself from the body and the connection.
_TRANSPORT_HEADERS = {"host", "content-length", "connection", "accept-encoding", "transfer-encoding"}


def claude_code_first_request() -> dict:
    rows = [json.loads(line) for line in CAPTURES.read_text().splitlines()]
    return next(
        r for r in rows if r["client"] == "claude" and r["scenario"] == "text" and r["method"] == "POST"
    )


def full_size(body: dict) -> dict:
    """The request at its real size: each text the capture trimmed (`<elided: N chars ...>`, a tool
    description cut at `...[truncated: N chars total]`) filled back to N chars of English prose (Python's
    own documentation topics, which every machine has), so the prompt is as long as Claude Code's."""
    prose = (Path(sysconfig.get_paths()["stdlib"]) / "pydoc_data" / "topics.py").read_text()[5000:]
    offset = 0

    def filler(n: int) -> str:
        nonlocal offset
        offset = (offset + n) % (len(prose) - 200_000)
        return prose[offset : offset + n]

    def grow(value):
        if isinstance(value, dict):
            return {k: grow(v) for k, v in value.items()}
        if isinstance(value, list):
            return [grow(v) for v in value]
        if isinstance(value, str):
            if m := re.fullmatch(r"<elided: (\d+) chars[^>]*>", value):
                return filler(int(m[1]))
            if m := re.search(r" \.\.\.\[truncated: (\d+) chars total\]$", value):
                head = value[: m.start()]
                return head + filler(max(0, int(m[1]) - len(head)))
        return value

    return grow(body)


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
    script = [("", REPLY)]  # every request: a short reply
    k3_args = ("--model", "kimi-linear", "--tool-parser", "kimi")
    with engine_and_k3(script, tmp_path_factory.mktemp("script"), *k3_args) as running:
        yield running


def _sse_events(text: str) -> list[tuple[str, dict]]:
    events = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        events.append((fields["event"], json.loads(fields["data"])))
    return events


def test_claude_code_first_request_streams_through_the_quick_start(quickstart):
    captured = claude_code_first_request()
    _assert_streams(quickstart, captured, captured["body"])


@pytest.mark.slow
def test_claude_code_first_request_at_full_size(quickstart):
    """The same request with its trimmed texts grown back (~60 KB): it fits the default context and
    prefills on the CPU (tens of thousands of tokens on the tiny model; minutes on a busy 2-core machine)."""
    captured = claude_code_first_request()
    body = full_size(captured["body"])
    assert len(json.dumps(body)) > 5 * len(json.dumps(captured["body"]))
    _assert_streams(quickstart, captured, body)
    engine = quickstart[2]
    progress = [line for line in engine.output if "prefill " in line and " tok/s" in line]
    assert progress and "(100%)" in progress[-1], "".join(engine.output[-20:])  # the engine log shows it move
    print("".join(progress))


def _assert_streams(quickstart, captured: dict, request_body: dict) -> None:
    _, k3_url, _ = quickstart
    headers = {k: v for k, v in captured["headers"] if k.lower() not in _TRANSPORT_HEADERS}
    body = json.dumps(request_body).encode()
    with httpx.Client(timeout=1200) as client:
        response = client.post(k3_url + captured["path"], content=body, headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    events = _sse_events(response.text)
    names = [name for name, _ in events if name != "ping"]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert names.count("content_block_start") == names.count("content_block_stop") >= 1
    text = "".join(
        d["delta"].get("text", "") for n, d in events if n == "content_block_delta" and "delta" in d
    )
    assert text == REPLY
    delta = next(d for n, d in events if n == "message_delta")
    assert delta["delta"]["stop_reason"] == "end_turn"
    usage = delta["usage"]  # the engine's own count, known at the end of the turn
    prompt_tokens = usage["input_tokens"] + usage.get("cache_read_input_tokens", 0)
    # the BPE at work: a fraction of the request's bytes (byte-level tokens were more than one per byte)
    assert 0 < prompt_tokens < 0.5 * len(body), (prompt_tokens, len(body))


def test_doctor_shows_the_working_commands(quickstart):
    """`k3 doctor` against the quick start's engine: the context fits Claude Code, the start command has
    the tool parser the engine needs, and Claude Code's setup is printed."""
    engine_url, _, _ = quickstart
    doctor = CliProcess(
        "k3", "doctor", "--upstream", engine_url + "/v1", "--model", "kimi-linear", "--no-generate"
    )
    assert doctor.proc.wait(60) == 0, "".join(doctor.output)
    doctor.stop()
    out = "".join(doctor.output)
    assert "max context 65536 tokens" in out and "WARN" not in out
    assert "export ANTHROPIC_BASE_URL=http://127.0.0.1:8080" in out
    assert "--tool-parser kimi" in out
