"""The reference k3's documented command line works here: its quickstart starts and serves, and
every flag and value it documents is accepted (shared/reference/k3-behaviour.md section 8)."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from k3_helpers import start_k3, stop_k3

from k3.app import create_app
from k3.cli import main, serve, shell_line
from k3.config import Config
from k3.testing.fake_upstream import Reply

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = [
    "serve",
    "--upstream",
    "http://127.0.0.1:8000/v1",
    "--model",
    "kimi-linear",
    "--reasoning-field",
    "inline",
]


def _config_of(args: list[str]) -> dict:
    """The parsed `serve` options for `args` (nothing is bound or started)."""
    return serve.make_context("serve", list(args)).params


def test_the_quickstart_command_line_parses_to_inline_think():
    params = _config_of(QUICKSTART[1:])
    assert (
        Config(upstream=params["upstream"], reasoning_field=params["reasoning_field"]).reasoning_field
        == "think"
    )


@pytest.mark.parametrize(
    "args",
    [
        ["--client", "claude-code", "-c", "codex", "--host", "127.0.0.1", "-p", "8080", "--port", "9"],
        ["--upstream-api-key", "k", "--model", "m", "--small-model", "s", "--api-key", "t"],
        *(["--reasoning-field", v] for v in ("reasoning_content", "inline", "none", "reasoning", "thinking")),
        *(
            ["--tool-parser", p]
            for p in ("hermes", "json", "kimi", "kimi_k2", "kimi_k3", "none", "passthrough", "pythonic")
        ),
        ["--mock", "--cors-origin", "http://a", "--cors-origin", "http://b"],
        ["--strict-routes"],
        ["--no-strict-routes"],
        ["--public-url", "https://k3.example"],
        *(["--shell", s] for s in ("posix", "powershell", "cmd")),
        *(["--log-level", lvl] for lvl in ("trace", "debug", "info", "warning", "error", "critical")),
        ["--access-log"],
        ["--record", "cassettes", "--record-compress"],
    ],
)
def test_every_documented_serve_flag_and_value_is_accepted(args):
    params = _config_of(args)
    field, parser = params["reasoning_field"], params["tool_parser"]
    Config(reasoning_field=field, tool_parser=parser if field != "kimi_k3" else None)  # values valid too


def test_version_and_no_arguments():
    assert re.fullmatch(r"k3 \S+\n", CliRunner().invoke(main, ["version"]).output)
    assert "serve" in CliRunner().invoke(main, []).output


def test_doctor_with_the_mock_engine_passes():
    result = CliRunner().invoke(main, ["doctor", "--mock"])
    assert result.exit_code == 0, result.output
    assert "streamed completion" in result.output


def test_setup_lines_in_each_shell():
    assert shell_line("export A=b", "posix") == "export A=b"
    assert shell_line("export A=b", "powershell") == '$env:A = "b"'
    assert shell_line("export A=b", "cmd") == "set A=b"
    assert shell_line("# note", "cmd") == "REM note"
    assert shell_line("claude", "cmd") == "claude"


def _serve(args: list[str], tmp_path: Path):
    return start_k3(args, {"K3_STATE_DIR": str(tmp_path / "state")})


def test_the_quickstart_starts_and_serves_claude_code_with_inline_think(live, tmp_path):
    """The README's command line, with the engine's address and a free port swapped in."""
    fake, base_url = live
    args = [*QUICKSTART, "--port", "0"]
    args[args.index("http://127.0.0.1:8000/v1")] = base_url
    process, base = _serve(args, tmp_path)
    try:
        fake.push(Reply(reasoning="thought", reasoning_key="think", content="Hello."))
        body = {
            "model": "claude-sonnet-4-5",
            "max_tokens": 64,
            "messages": [{"role": "user", "content": "hi"}],
        }
        headers = {"x-api-key": "local", "anthropic-version": "2023-06-01", "user-agent": "claude-cli/2.1.0"}
        reply = httpx.post(f"{base}/v1/messages", json=body, headers=headers, timeout=20).json()
        assert [b["type"] for b in reply["content"]] == ["thinking", "text"], reply
        assert reply["content"][0]["thinking"] == "thought" and reply["content"][1]["text"] == "Hello."
        assert fake.requests[-1]["model"] == "kimi-linear"
        assert httpx.get(f"{base}/health", timeout=20).status_code == 200
    finally:
        output = stop_k3(process)
    assert "POST /v1/messages" not in output  # no access log unless asked for
    assert "reasoning field think" in output


def test_access_log_gives_one_line_per_request(live, tmp_path):
    _, base_url = live
    process, base = _serve(["serve", "--upstream", base_url, "--port", "0", "--access-log"], tmp_path)
    try:
        assert httpx.get(f"{base}/health", timeout=20).status_code == 200
    finally:
        output = stop_k3(process)
    assert "GET /health 200" in output


async def test_per_request_lines_are_debug_not_info(make_client, fake, caplog):
    client = make_client()
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    with caplog.at_level(logging.INFO, logger="k3"):
        assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
    assert not [r for r in caplog.records if r.name == "k3"]
    with caplog.at_level(logging.DEBUG, logger="k3"):
        assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
    assert any(
        "/v1/chat/completions -> " in r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG
    )


async def test_strict_routes_404_the_dialects_a_pinned_client_does_not_speak(make_client):
    client = make_client(client="claude-code", strict_routes=True)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    refused = await client.post("/v1/chat/completions", json=body)
    assert refused.status_code == 404
    error = refused.json()
    assert error["type"] == "error"  # in the pinned client's (Anthropic) dialect
    assert error["error"]["message"] == (
        "/v1/chat/completions is not served under --client claude-code with --strict-routes"
    )
    assert (await client.post("/v1/responses", json={"input": "hi"})).status_code == 404
    assert (await client.post("/v1/messages", json={**body, "max_tokens": 8})).status_code == 200
    loose = make_client(client="claude-code")
    assert (await loose.post("/v1/chat/completions", json=body)).status_code == 200


async def test_cors_only_for_the_listed_origins(fake):
    app = create_app(
        Config(upstream="http://fake/v1", cors_origins=("http://ok.example",)),
        upstream_transport=httpx.ASGITransport(fake),
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://k3") as client:
        preflight = await client.options(
            "/v1/chat/completions",
            headers={"origin": "http://ok.example", "access-control-request-method": "POST"},
        )
        assert preflight.headers["access-control-allow-origin"] == "http://ok.example"
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        allowed = await client.post(
            "/v1/chat/completions", json=body, headers={"origin": "http://ok.example"}
        )
        assert (
            allowed.status_code == 200
            and allowed.headers["access-control-allow-origin"] == "http://ok.example"
        )
        other = await client.post(
            "/v1/chat/completions", json=body, headers={"origin": "http://evil.example"}
        )
        assert "access-control-allow-origin" not in other.headers
        assert json.loads(other.text)["choices"]


def test_custom_reasoning_key_is_sent_back_under_that_name():
    from k3.reasoning import render_upstream

    message = render_upstream({"content": "x", "reasoning": "r", "tool_calls": []}, "thinking")
    assert message == {"role": "assistant", "content": "x", "thinking": "r"}
