"""The serving benchmark end to end against a scripted streaming endpoint with known timings, in all
three dialects: TTFT and ITL seen over real sockets, several tokens per chunk, reasoning-first streams,
errors counted and kept out of the latencies, goodput, rate and duration levels, and valid receipts.

The endpoint answers every dialect's route with the events of a `Script`: (delay_s, kind, text) chunks,
each sent after its delay, and usage reporting `output_tokens`. It runs uvicorn in a thread on an
ephemeral loopback port.
"""

from __future__ import annotations

import asyncio
import json
import socket
import statistics
import threading
import time
from dataclasses import dataclass, field

import pytest
import uvicorn
from click.testing import CliRunner

from harness.figures import build_all
from harness.receipt import load_receipt
from runners.serve.cli import serve_command


@dataclass
class Script:
    chunks: list[tuple[float, str, str]]
    output_tokens: int | None = None
    status: int = 200
    fail_every: int = 0  # answer every Nth request (1-based) with HTTP 500
    stream_error_every: int = 0  # every Nth request breaks off with an error event after its first chunk
    served: int = field(default=0)


def _chat(kind: str, text: str) -> dict:
    delta = {"reasoning_content": text} if kind == "reasoning" else {"content": text}
    return {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
    }


def _anthropic(kind: str, text: str) -> dict:
    delta = (
        {"type": "thinking_delta", "thinking": text}
        if kind == "reasoning"
        else {"type": "text_delta", "text": text}
    )
    return {"type": "content_block_delta", "index": 0 if kind == "reasoning" else 1, "delta": delta}


def _responses(kind: str, text: str) -> dict:
    kind_name = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
    return {"type": kind_name, "delta": text}


def events(route: str, script: Script, kind: str, text: str) -> dict:
    return {"/v1/chat/completions": _chat, "/v1/messages": _anthropic, "/v1/responses": _responses}[route](
        kind, text
    )


def closing(route: str, script: Script) -> list[dict | str]:
    n = script.output_tokens
    if route == "/v1/chat/completions":
        usage = {"prompt_tokens": 7, "completion_tokens": n, "total_tokens": 7 + n} if n else None
        done = {
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
        }
        return [done, *([{"choices": [], "usage": usage}] if usage else []), "[DONE]"]
    if route == "/v1/messages":
        usage = {"output_tokens": n} if n else {}
        return [{"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": usage},
                {"type": "message_stop"}]  # fmt: skip
    usage = {"input_tokens": 7, "output_tokens": n} if n else None
    return [{"type": "response.completed", "response": {"status": "completed", "usage": usage}}]


class ScriptedEndpoint:
    def __init__(self, script: Script):
        self.script = script

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return
        path = scope["path"]
        if path == "/v1/models":
            return await self._json(send, 200, {"object": "list", "data": [{"id": "scripted-model"}]})
        while (await receive()).get("more_body"):
            pass
        script = self.script
        script.served += 1
        if script.status != 200 or (script.fail_every and script.served % script.fail_every == 0):
            return await self._json(send, 500, {"error": {"message": "scripted failure"}})
        headers = [(b"content-type", b"text/event-stream"), (b"server", b"scripted/1")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        if path == "/v1/messages":
            await self._event(send, {"type": "message_start", "message": {"usage": {"input_tokens": 7}}})
        for i, (delay, kind, text) in enumerate(script.chunks):
            await asyncio.sleep(delay)
            await self._event(send, events(path, script, kind, text))
            if i == 0 and script.stream_error_every and script.served % script.stream_error_every == 0:
                await self._event(send, {"type": "error", "error": {"message": "scripted stream error"}})
                return await send({"type": "http.response.body", "body": b""})
        for event in closing(path, script):
            await self._event(send, event)
        await send({"type": "http.response.body", "body": b""})

    @staticmethod
    async def _event(send, event) -> None:
        data = event if isinstance(event, str) else json.dumps(event)
        await send({"type": "http.response.body", "body": f"data: {data}\n\n".encode(), "more_body": True})

    @staticmethod
    async def _json(send, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"server", b"scripted/1")]})  # fmt: skip
        await send({"type": "http.response.body", "body": data})


class Running:
    """The endpoint serving in a background thread; `base` is its URL."""

    def __init__(self, script: Script):
        self.app = ScriptedEndpoint(script)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.base = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        config = uvicorn.Config(
            self.app, log_level="warning", lifespan="off", access_log=False, server_header=False
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> Running:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


SLACK = 0.08  # s: a busy 2-core machine may deliver a chunk this late (asyncio.sleep is never early)


@pytest.fixture
def scripted():
    def start(script: Script) -> Running:
        return Running(script)

    return start


def run_serve(base: str, results, *args: str) -> list[dict]:
    result = CliRunner().invoke(
        serve_command,
        ["--endpoint", base + "/v1", "--results", str(results), "--no-regenerate", "--warmup", "0", *args],
    )
    assert result.exit_code == 0, result.output + repr(result.exception)
    return [load_receipt(p) for p in sorted(results.glob("serve/*/*.json"))]


# 2 + 4 + 2 characters and 8 tokens: the middle chunk carries 4 tokens (a speculative decoder's shape).
REASONING_FIRST = [(0.15, "reasoning", "ab"), (0.1, "visible", "cdef"), (0.1, "visible", "gh")]


@pytest.mark.parametrize("dialect", ["chat", "anthropic", "responses"])
def test_timings_of_a_scripted_stream(scripted, tmp_path, dialect):
    with scripted(Script(REASONING_FIRST, output_tokens=8)) as server:
        (receipt,) = run_serve(server.base, tmp_path, "--dialect", dialect, "--requests", "3")
    s = receipt["samples"]
    assert s["ok"] == [1.0, 1.0, 1.0]
    for ttft_any, ttft in zip(s["ttft_any_ms"], s["ttft_ms"], strict=True):
        assert 150 <= ttft_any <= 150 + SLACK * 1e3
        assert 250 <= ttft <= 250 + 2 * SLACK * 1e3  # the first visible token came 100 ms after the reasoning
    assert len(s["itl_ms"]) == 3 * (8 - 2)  # per request: 4 tokens in chunk 2, 2 in chunk 3
    assert statistics.median(s["itl_ms"]) == pytest.approx(25, abs=SLACK * 1e3 / 4)  # 100 ms / 4 tokens
    assert max(s["itl_ms"]) == pytest.approx(50, abs=SLACK * 1e3)  # 100 ms / 2 tokens
    assert s["output_tokens"] == [8.0, 8.0, 8.0]
    for tpot, e2e, first in zip(s["tpot_ms"], s["e2e_ms"], s["ttft_any_ms"], strict=True):
        assert tpot == pytest.approx((e2e - first) / 7)
    assert receipt["derived"]["output_tok_s"] > 0 and receipt["derived"]["errors"] == 0
    assert "usage for 3 of 3" in receipt["config"]["output_tokens_source"]


def test_errors_are_counted_and_not_timed(scripted, tmp_path):
    script = Script([(0.01, "visible", "a"), (0.01, "visible", "b")], output_tokens=2, fail_every=2)
    with scripted(script) as server:
        (receipt,) = run_serve(server.base, tmp_path, "--requests", "4")
    assert receipt["samples"]["ok"] == [1.0, 0.0, 1.0, 0.0]
    assert receipt["derived"]["errors"] == 2 and receipt["summary"]["e2e_ms"]["n"] == 2
    assert receipt["config"]["error_messages"] == {'HTTP 500: {"error": {"message": "scripted failure"}}': 2}


def test_an_error_inside_the_stream_is_an_error(scripted, tmp_path):
    script = Script([(0.01, "visible", "a"), (0.01, "visible", "b")], output_tokens=2, stream_error_every=1)
    with scripted(script) as server:
        (receipt,) = run_serve(server.base, tmp_path, "--dialect", "anthropic", "--requests", "2")
    assert receipt["derived"]["errors"] == 2
    assert list(receipt["config"]["error_messages"]) == ["stream error: scripted stream error"]


def test_goodput_and_receipt_contents(scripted, tmp_path):
    with scripted(Script([(0.05, "visible", "a"), (0.01, "visible", "b")], output_tokens=2)) as server:
        receipts = run_serve(server.base, tmp_path, "--concurrency", "1,2", "--requests", "4", "--label", "fake",
                             "--slo", "ttft_ms=1,tpot_ms=10000", "--server-hardware", "1xNothing")  # fmt: skip
    by_c = {r["config"]["concurrency"]: r for r in receipts}
    assert sorted(by_c) == [1, 2]
    receipt = by_c[2]
    assert receipt["suite"] == "serve" and receipt["name"] == "fake.chat.c2"
    assert receipt["derived"]["goodput"] == 0  # no TTFT is under 1 ms
    assert receipt["config"]["slo"] == {"ttft_ms": 1.0, "tpot_ms": 10000.0}
    assert receipt["config"]["models"]["data"][0]["id"] == "scripted-model"  # the model was found there
    assert receipt["config"]["model"] == "scripted-model"
    assert receipt["config"]["server_headers"]["server"] == "scripted/1"
    assert receipt["config"]["server_hardware"] == "1xNothing"
    assert receipt["hardware"]["hardware_id"]  # this machine's descriptor as well
    for key in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
        assert receipt["summary"][key]["n"] >= 1
    for key in ("output_tok_s", "goodput", "tok_s_per_user", "ttft_ms_p99"):
        assert key in receipt["derived"]
    # The figures draw from these receipts, and are left out where there are none.
    figures = build_all(tmp_path)
    assert [p["concurrency"] for p in figures["serve_latency"]["series"][0]["points"]] == [1, 2]
    assert figures["serve_pareto"]["series"][0]["label"] == "fake · chat"
    empty = build_all(tmp_path / "nothing")
    assert "serve_latency" not in empty and "serve_pareto" not in empty


def test_rate_and_duration_levels(scripted, tmp_path):
    with scripted(Script([(0.01, "visible", "a")], output_tokens=1)) as server:
        (rated,) = run_serve(
            server.base, tmp_path / "r", "--rate", "50", "--requests", "5", "--burstiness", "0.5"
        )
        (timed,) = run_serve(server.base, tmp_path / "d", "--concurrency", "2", "--duration", "0.5")
    assert (
        rated["name"].endswith(".r50") and rated["config"]["rate"] == 50 and len(rated["samples"]["ok"]) == 5
    )
    assert timed["config"]["duration_s"] == 0.5 and len(timed["samples"]["ok"]) >= 2


def test_bad_options_get_clear_errors(tmp_path):
    runner = CliRunner()
    result = runner.invoke(serve_command, ["--endpoint", "ftp://x", "--results", str(tmp_path)])
    assert result.exit_code == 2 and "http(s) URL" in result.output
    result = runner.invoke(serve_command, ["--endpoint", "http://x", "--slo", "ttft=3"])
    assert result.exit_code == 2 and "--slo" in result.output
    result = runner.invoke(serve_command, ["--results", str(tmp_path)])
    assert result.exit_code == 2 and "--endpoint" in result.output


def test_side_by_side_takes_the_short_defaults_unless_told(monkeypatch, tmp_path):
    from runners.serve import side_by_side

    seen = {}

    def fake(run, bench, **kwargs):
        seen.update(run=run, bench=bench, **kwargs)
        return []

    monkeypatch.setattr(side_by_side, "side_by_side", fake)
    args = ["--side-by-side", "--results", str(tmp_path), "--no-regenerate", "--output-len", "16"]
    result = CliRunner().invoke(serve_command, args)
    assert result.exit_code == 0, result.output
    assert [level.concurrency for level in seen["bench"]["levels"]] == [1, 2]
    assert seen["run"]["requests"] == 8 and seen["run"]["input_len"] == 64
    assert seen["run"]["output_len"] == 16  # given, so kept
    assert seen["preset"] == "small" and seen["threads"] is None
