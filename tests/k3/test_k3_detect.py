"""Client detection: every captured client resolves to its own preset, by signal and not by weight."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k3 import presets
from k3.detect import ROUTE_DIALECT, detect

FIXTURES = [
    json.loads(line) for line in (Path(__file__).parent / "fixtures" / "client_requests.jsonl").open()
]

EXPECTED = {
    "claude": "claude-code",
    "codex": "codex",
    "opencode": "opencode",
    "opencode-anthropic": "opencode",
    "opencode-responses": "opencode",
    "aider": "aider",
    "sdk-anthropic": "anthropic",
    "sdk-anthropic-stream": "anthropic",
    "sdk-openai-chat": "openai",
    "sdk-openai-chat-stream": "openai",
    "sdk-openai-responses": "openai",
    "sdk-openai-responses-stream": "openai",
}


def headers_of(request):
    return {k.lower(): v for k, v in request["headers"]}


@pytest.mark.parametrize(
    "request_",
    [r for r in FIXTURES if r["method"] == "POST"],
    ids=lambda r: f"{r['client']}-{r['scenario']}-{r['seq']}",
)
def test_every_captured_request_resolves_to_its_client(request_):
    dialect = ROUTE_DIALECT[request_["path"].split("?")[0]]
    found = detect(dialect, headers_of(request_), request_["body"])
    assert found.preset.name == EXPECTED[request_["client"]]
    assert not found.fallback and found.reason


def test_real_codex_user_agent_is_recognised_by_rule_without_other_signals():
    found = detect(
        "responses", {"user-agent": "codex_exec/0.171.0 (Debian 12.0.0; x86_64) dumb (codex_exec; 0.171.0)"}
    )
    assert found.preset.name == "codex" and "user-agent" in found.reason
    assert detect("responses", {"originator": "codex_exec"}).preset.name == "codex"
    assert detect("responses", {"user-agent": "codex_cli_rs/0.20.0"}).preset.name == "codex"


@pytest.mark.parametrize(
    "ua", ["", "curl/8.5.0", "python-requests/2.32", "Go-http-client/1.1", "OpenAI/Python 2.20.0"]
)
def test_generic_chat_clients_get_the_openai_preset(ua):
    assert detect("chat", {"user-agent": ua}).preset.name == "openai"


def test_route_defaults_without_any_signal():
    assert detect("anthropic", {}).preset.name == "anthropic"
    assert detect("chat", {}).preset.name == "openai"
    assert detect("responses", {}).preset.name == "openai"
    assert detect(None, {}).preset.name == "openai"
    assert detect("anthropic", {}).fallback


def test_presets_only_compete_on_routes_they_speak():
    # Claude Code's headers on a Chat route do not make it claude-code.
    found = detect("chat", {"user-agent": "claude-cli/2.1.197 (external, sdk-cli)", "x-app": "cli"})
    assert found.preset.name == "openai"


def test_other_clients_by_their_own_signals():
    assert detect("chat", {"http-referer": "https://cline.bot", "x-title": "Cline"}).preset.name == "cline"
    assert detect("chat", {"user-agent": "KimiCLI/0.50"}).preset.name == "kimi-code"
    assert detect("chat", {"user-agent": "aider/0.86"}).preset.name == "aider"
    assert (
        detect("anthropic", {"user-agent": "opencode/1.18.33 ai-sdk/provider-utils/4.0.46"}).preset.name
        == "opencode"
    )


def test_header_names_are_matched_lower_cased_and_body_hints_add_weight():
    claude = next(r for r in FIXTURES if r["client"] == "claude" and r["method"] == "POST")
    with_body = detect("anthropic", headers_of(claude), claude["body"])
    without_body = detect("anthropic", headers_of(claude), None)
    assert with_body.score > without_body.score > 0


def test_forced_client_overrides_detection_and_unknown_names_fail():
    found = detect("chat", {"user-agent": "opencode/1"}, None, forced="aider")
    assert found.preset.name == "aider" and found.forced
    with pytest.raises(ValueError, match="known"):
        presets.get("nope")


def test_model_aliasing():
    claude = presets.get("claude-code")
    assert presets.upstream_model(claude, "claude-haiku-4-5", "big", "small") == "small"
    assert presets.upstream_model(claude, "claude-opus-4-8", "big", "small") == "big"
    assert presets.upstream_model(claude, "claude-haiku-4-5", "big", None) == "big"
    openai_preset = presets.get("openai")
    assert presets.upstream_model(openai_preset, "gpt-4o-mini", "big", "small") == "small"
    assert presets.upstream_model(openai_preset, "gemini-pro", "big", "small") == "big"
    assert presets.model_ids(claude, "big", "small")[:2] == ["big", "small"]


def test_every_preset_has_setup_lines_that_format():
    for preset in presets.PRESETS:
        lines = presets.setup_lines(preset, base="http://h:1", token="t", model="m", small_model=None)
        text = "\n".join(lines)
        assert "http://h:1" in text
        assert not any(f"{{{key}}}" in text for key in ("base", "token", "model", "small_model"))
    opencode = presets.setup_lines(
        presets.get("opencode"), base="http://h:1", token="t", model="m", small_model=None
    )
    config = json.loads("".join(opencode[1:-1]))
    assert config["provider"]["k3"]["options"]["baseURL"] == "http://h:1/v1" and config["model"] == "k3/m"
