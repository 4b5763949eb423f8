"""Client presets: who the caller is, how to recognise it, how to set it up.

The dialect of a request always comes from its route; a preset adds what is specific to one
client program: detection rules, the model names it is offered on `/v1/models`, the pattern of
its small/fast model names, the copy-paste setup printed by `k3 serve` and `k3 doctor`, and
its defaults for what `--tool-parser` and `--show-reasoning/--hide-reasoning` override.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

DIALECTS = ("anthropic", "chat", "responses")


@dataclass(frozen=True, slots=True)
class Rule:
    """One detection signal. `kind` is `ua` (user-agent), `header` or `body`."""

    kind: str
    weight: int
    label: str
    header: str = ""  # for `header` rules: the lower-cased header name
    pattern: re.Pattern[str] | None = None  # for `ua`/`header`: must match (search); None = present
    body: Callable[[dict[str, Any]], bool] | None = None  # for `body` rules

    def matches(self, headers: dict[str, str], body: dict[str, Any] | None) -> bool:
        if self.kind == "body":
            return body is not None and self.body is not None and self.body(body)
        value = headers.get("user-agent" if self.kind == "ua" else self.header)
        if value is None:
            return False
        return self.pattern is None or self.pattern.search(value) is not None


def ua(pattern: str, weight: int) -> Rule:
    return Rule("ua", weight, f"user-agent ~ /{pattern}/", pattern=re.compile(pattern, re.I))


def header(name: str, weight: int, pattern: str | None = None) -> Rule:
    label = f"header {name}" + (f" ~ /{pattern}/" if pattern else "")
    return Rule("header", weight, label, header=name, pattern=re.compile(pattern, re.I) if pattern else None)


def body_hint(label: str, weight: int, predicate: Callable[[dict[str, Any]], bool]) -> Rule:
    return Rule("body", weight, f"body {label}", body=predicate)


@dataclass(frozen=True, slots=True)
class Preset:
    name: str
    title: str
    dialects: tuple[str, ...]  # the routes this client speaks; detection only considers these
    rules: tuple[Rule, ...]
    setup: tuple[str, ...]  # paste block lines, formatted with {base} {token} {model} {small_model}
    advertise: tuple[str, ...] = ()  # extra model ids listed on /v1/models
    small_models: re.Pattern[str] | None = None  # client model names routed to --small-model
    notes: str = ""
    status: str = "provisional"  # "captured": checked against real captured traffic
    # The engine's text is parsed for tool calls with this (k3.tools); the engine usually parses
    # its own (native `tool_calls`, always handled), so every preset starts from passthrough.
    tool_parser: str = "passthrough"
    # Reasoning reaches the client in its dialect's own form (thinking blocks with a signature,
    # reasoning items with encrypted_content, Chat reasoning_content) unless this is False; hidden
    # reasoning is still recorded and restored on the next turn.
    show_reasoning: bool = True


def _system_starts(prefix: str) -> Callable[[dict[str, Any]], bool]:
    def check(body: dict[str, Any]) -> bool:
        system = body.get("system")
        if isinstance(system, list) and system and isinstance(system[0], dict):
            text = system[0].get("text")
            return isinstance(text, str) and text.startswith(prefix)
        return False

    return check


def _codex_metadata(body: dict[str, Any]) -> bool:
    meta = body.get("client_metadata")
    return isinstance(meta, dict) and any(isinstance(k, str) and k.startswith("x-codex") for k in meta)


_SMALL_CLAUDE = re.compile(r"haiku", re.I)
_SMALL_OPENAI = re.compile(r"(^|[-_.])(mini|nano)([-_.]|$)", re.I)
_SMALL_ANY = re.compile(r"haiku|(^|[-_.])(mini|nano|flash|small)([-_.]|$)", re.I)

PRESETS: tuple[Preset, ...] = (
    Preset(
        name="claude-code",
        title="Claude Code (Anthropic Messages)",
        dialects=("anthropic",),
        rules=(
            ua(r"^claude-cli/", 50),
            header("x-claude-code-session-id", 30),
            header("anthropic-beta", 30, r"claude-code-"),
            header("x-app", 20, r"^cli$"),
            body_hint(
                "system starts with the billing header", 10, _system_starts("x-anthropic-billing-header")
            ),
        ),
        advertise=("claude-sonnet-4-5", "claude-opus-4-1", "claude-haiku-4-5"),
        small_models=_SMALL_CLAUDE,
        setup=(
            "export ANTHROPIC_BASE_URL={base}",
            "export ANTHROPIC_AUTH_TOKEN={token}",
            "claude",
        ),
        notes="Probes HEAD / first, always streams POST /v1/messages?beta=true; haiku-class "
        "background calls go to --small-model when set.",
        status="captured",
    ),
    Preset(
        name="codex",
        title="OpenAI Codex CLI (OpenAI Responses)",
        dialects=("responses",),
        rules=(
            ua(r"^codex(_exec|_cli_rs|[-_ ]cli)?/", 50),
            header("originator", 50, r"^codex"),
            header("x-codex-window-id", 20),
            body_hint("client_metadata has x-codex keys", 20, _codex_metadata),
        ),
        advertise=("gpt-5-codex",),
        small_models=_SMALL_OPENAI,
        setup=(
            "# ~/.codex/config.toml (the user-level file; a project .codex/config.toml cannot add providers)",
            'model = "{model}"',
            'model_provider = "k3"',
            "[model_providers.k3]",
            'name = "k3"',
            'base_url = "{base}/v1"',
            'wire_api = "responses"',
            'env_key = "K3_API_KEY"',
            "# then, in the shell:",
            "export K3_API_KEY={token}",
            "codex",
        ),
        notes="Speaks only Responses, always streams, resends the whole history each turn "
        "(store:false); its freeform apply_patch tool is served as a function with one `input` string.",
        status="captured",
    ),
    Preset(
        name="opencode",
        title="opencode (Chat, Anthropic or Responses provider)",
        dialects=("chat", "anthropic", "responses"),
        rules=(ua(r"^opencode/", 50),),
        small_models=_SMALL_ANY,
        setup=(
            "# opencode.json (project) or ~/.config/opencode/opencode.json",
            '{{"$schema": "https://opencode.ai/config.json", "model": "k3/{model}",',
            ' "provider": {{"k3": {{"npm": "@ai-sdk/openai-compatible", "name": "k3",',
            '   "options": {{"baseURL": "{base}/v1", "apiKey": "{token}"}},',
            '   "models": {{"{model}": {{"name": "{model} via k3"}}}}}}}}}}',
            "opencode",
        ),
        notes="Sends a title request and the agent request, both streaming with include_usage; "
        "replays reasoning_content on assistant turns.",
        status="captured",
    ),
    Preset(
        name="aider",
        title="aider (OpenAI Chat through LiteLLM)",
        dialects=("chat",),
        rules=(
            ua(r"aider", 50),
            header("x-stainless-raw-response", 40, r"^true$"),
        ),
        small_models=_SMALL_OPENAI,
        setup=(
            "export OPENAI_API_BASE={base}/v1",
            "export OPENAI_API_KEY={token}",
            "aider --model openai/{model}",
        ),
        notes="aider's user-agent is the OpenAI SDK's; LiteLLM's raw-response header gives it away, "
        "so other LiteLLM-based clients are served as aider too (harmless: same Chat behaviour).",
        status="captured",
    ),
    Preset(
        name="cline",
        title="Cline (OpenAI Compatible provider)",
        dialects=("chat",),
        rules=(
            ua(r"cline", 50),
            header("http-referer", 50, r"cline\.bot"),
            header("x-title", 50, r"^cline"),
        ),
        setup=(
            "# Cline settings: API Provider = OpenAI Compatible",
            "#   Base URL = {base}/v1   API Key = {token}   Model ID = {model}",
        ),
    ),
    Preset(
        name="kimi-code",
        title="Kimi Code CLI (OpenAI Chat)",
        dialects=("chat",),
        rules=(ua(r"kimi[_-]?(code|cli)", 50), header("x-msh-client", 30)),
        advertise=("kimi-k2-thinking",),
        setup=("# point the CLI's OpenAI-compatible provider at {base}/v1 with key {token}, model {model}",),
    ),
    Preset(
        name="anthropic",
        title="Anthropic SDK or any other Anthropic Messages client",
        dialects=("anthropic",),
        rules=(ua(r"^anthropic/", 20), header("anthropic-version", 5)),
        small_models=_SMALL_CLAUDE,
        setup=(
            "export ANTHROPIC_BASE_URL={base}",
            "export ANTHROPIC_API_KEY={token}",
        ),
        notes="Default for /v1/messages when no client signal is present.",
        status="captured",
    ),
    Preset(
        name="openai",
        title="OpenAI SDK or any other Chat/Responses client",
        dialects=("chat", "responses"),
        rules=(ua(r"^(async)?openai/", 20), header("x-stainless-lang", 5)),
        small_models=_SMALL_OPENAI,
        setup=(
            "export OPENAI_BASE_URL={base}/v1",
            "export OPENAI_API_KEY={token}",
        ),
        notes="Default for /v1/chat/completions and /v1/responses when no client signal is present.",
        status="captured",
    ),
)

BY_NAME: dict[str, Preset] = {p.name: p for p in PRESETS}
DEFAULT_FOR_DIALECT = {
    "anthropic": BY_NAME["anthropic"],
    "chat": BY_NAME["openai"],
    "responses": BY_NAME["openai"],
}


def get(name: str) -> Preset:
    try:
        return BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown client preset {name!r}; known: {', '.join(BY_NAME)}") from None


def setup_lines(preset: Preset, *, base: str, token: str, model: str, small_model: str | None) -> list[str]:
    values = {"base": base, "token": token, "model": model, "small_model": small_model or model}
    return [line.format(**values) for line in preset.setup]


def upstream_model(preset: Preset, client_model: str, model: str, small_model: str | None) -> str:
    """Model aliasing: every client model name maps to --model, small/fast ones to --small-model."""
    if small_model and preset.small_models is not None and preset.small_models.search(client_model):
        return small_model
    return model


def model_ids(preset: Preset, model: str, small_model: str | None) -> list[str]:
    ids = [model] + ([small_model] if small_model else []) + list(preset.advertise)
    return list(dict.fromkeys(ids))
