"""`k3 doctor` reads the engine's max context from GET /models and warns when Claude Code's first request
(system prompt and 25 tools) may not fit."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from k3.cli import CLAUDE_CODE_CONTEXT, _doctor
from k3.config import Config


def _engine(max_model_len: int | None) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models"):
            entry = {"id": "kimi-linear", "object": "model"}
            if max_model_len is not None:
                entry["max_model_len"] = max_model_len
            return httpx.Response(200, json={"object": "list", "data": [entry]})
        return httpx.Response(404, json={"error": {"message": "no"}})

    return httpx.MockTransport(handle)


@pytest.mark.parametrize(
    ("max_model_len", "expected"),
    [
        (CLAUDE_CODE_CONTEXT, f"  ok    max context {CLAUDE_CODE_CONTEXT} tokens\n"),
        (32768, f"  WARN  max context 32768 tokens: Claude Code's first request (25 tools) may not fit; "
                f"restart the engine with --max-context {CLAUDE_CODE_CONTEXT}\n"),
        (None, None),
    ],
)  # fmt: skip
def test_doctor_reports_the_engine_context(capsys, max_model_len, expected):
    config = Config(upstream="http://engine.test/v1", model="kimi-linear")
    asyncio.run(_doctor(config, False, _engine(max_model_len)))
    out = capsys.readouterr().out
    if expected is None:
        assert "max context" not in out
    else:
        assert expected in out
