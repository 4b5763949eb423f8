"""`--log-format json` on both servers: every log record one JSON object per line, the finished-request
lines with their status, latency and token counts, and never a prompt or a key."""

from __future__ import annotations

import json
import logging
import re

import httpx
import pytest

from common.logs import JsonFormatter, configure_logging
from tests.server.server_support import CliProcess

SECRET_PROMPT = "a secret prompt"
TEXT_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (DEBUG|INFO|WARNING|ERROR) ")


def _record(**extra) -> logging.LogRecord:
    record = logging.LogRecord("engine.server", logging.INFO, __file__, 1, "POST %s %d", ("/x", 200), None)
    record.__dict__.update(extra)
    return record


def test_a_json_record_has_the_request_fields_and_nothing_else_from_extra():
    line = JsonFormatter().format(_record(status=200, latency_ms=1.5, prompt_tokens=3, prompt="leak"))
    out = json.loads(line)
    assert out["level"] == "info" and out["logger"] == "engine.server" and out["msg"] == "POST /x 200"
    assert out["ts"].endswith("+00:00") and "T" in out["ts"]
    assert (out["status"], out["latency_ms"], out["prompt_tokens"]) == (200, 1.5, 3)
    assert "prompt" not in out and "\n" not in line


def test_configure_logging_refuses_an_unknown_format():
    with pytest.raises(ValueError, match="text, json"):
        configure_logging("INFO", "xml")


def _json_lines(output: list[str]) -> list[dict]:
    assert not any(TEXT_LOG_LINE.match(line) for line in output), "".join(output)
    records = [json.loads(line) for line in output if line.startswith("{")]
    assert records, "".join(output)
    return records


def _chat(url: str, path: str, headers: dict | None = None) -> int:
    body = {"model": "kimi-linear", "messages": [{"role": "user", "content": SECRET_PROMPT}], "max_tokens": 2}
    return httpx.post(url + path, json=body, headers=headers, timeout=60).status_code


def test_k3_serve_logs_json_lines():
    process = CliProcess(
        "k3", "serve", "--mock", "--port", "0", "--access-log", "--log-format", "json", "--api-key", "sesame"
    )
    try:
        url = process.url()
        assert _chat(url, "/v1/chat/completions", {"authorization": "Bearer sesame"}) == 200
        assert httpx.get(url + "/health", timeout=30).status_code in (200, 503)
    finally:
        process.stop()
    records = _json_lines(process.output)
    turn = next(r for r in records if r.get("path") == "/v1/chat/completions")
    assert turn["status"] == 200 and turn["latency_ms"] > 0 and turn["logger"] == "k3.access"
    assert turn["dialect"] == "chat" and isinstance(turn["completion_tokens"], int)
    assert any(r.get("path") == "/health" for r in records)
    assert any(r["logger"].startswith("uvicorn") for r in records)  # uvicorn's own lines are JSON too
    assert SECRET_PROMPT not in "".join(process.output) and "sesame" not in "".join(process.output)


def test_kimi_engine_serve_logs_json_lines():
    process = CliProcess(
        *("engine", "serve", "--synthetic", "tiny", "--port", "0"),
        *("--max-context", "1024", "--log-format", "json"),
    )
    try:
        url = process.url()
        assert _chat(url, "/v1/chat/completions") == 200
    finally:
        process.stop()
    records = _json_lines(process.output)
    done = next(r for r in records if r.get("path") == "/v1/chat/completions")
    assert done["status"] == 200 and done["latency_ms"] > 0 and done["logger"] == "engine.server"
    assert done["completion_tokens"] == 2 and done["prompt_tokens"] > 0
    assert SECRET_PROMPT not in "".join(process.output)
