"""`kimi-engine serve`: start-up refusals with a clear message, and a real run over a socket."""

from __future__ import annotations

import openai
from click.testing import CliRunner

from engine.cli import main
from tests.server.server_support import CliProcess


def test_a_context_that_cannot_fit_is_refused_at_start_up():
    result = CliRunner().invoke(main, ["serve", "--synthetic", "tiny", "--memory-cap-gib", "0.01"])
    assert result.exit_code == 1
    assert "over the memory cap of 0.01 GiB" in result.output and "raise --memory-cap-gib" in result.output


def test_an_int4_artifact_is_refused_clearly(tmp_path):
    (tmp_path / "manifest.json").write_text("{}")
    result = CliRunner().invoke(main, ["serve", "--weights", str(tmp_path)])
    assert result.exit_code == 1 and "INT4 artifacts are not yet supported by the server" in result.output


def test_weights_and_synthetic_are_exclusive(tmp_path):
    result = CliRunner().invoke(main, ["serve", "--weights", str(tmp_path), "--synthetic", "tiny"])
    assert result.exit_code == 2 and "not both" in result.output


def test_serve_answers_over_a_socket_and_reports_memory():
    process = CliProcess("engine", "serve", "--synthetic", "tiny", "--port", "0", "--max-context", "4096")
    try:
        url = process.url()
        with openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=30) as client:
            reply = client.chat.completions.create(
                model="kimi-linear", messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
        assert reply.usage.completion_tokens <= 4 and reply.choices[0].finish_reason in ("stop", "length")
    finally:
        code = process.stop()
    output = "".join(process.output)
    assert code in (0, -15), output  # uvicorn re-raises SIGTERM after its graceful shutdown
    assert "Application shutdown complete" in output
    assert "SYNTHETIC WEIGHTS" in output and "memory: weights" in output and "at 4096 tokens" in output
