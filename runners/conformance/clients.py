"""Each real client: how a user points it at k3, how the suite runs it headless, how to read its output.

A client's `setup()` is the single source for both the conformance runs and the copy-paste setup in
docs/CLIENTS.md: environment variables, config files (paths under `~` are in the client's HOME) and the
headless command line, for a given k3 base URL and token.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from harness.hardware import REPO_ROOT
from runners.conformance.install import PINS, Installed

ENGINE_MODEL = "kimi-linear"
SDK_AGENT = "runners/conformance/sdk_agent.py"  # relative to the repository root


@dataclass(frozen=True)
class Setup:
    env: dict[str, str]
    files: dict[str, str] = field(default_factory=dict)  # "~/..." (HOME) or a path relative to the work dir
    command: list[str] = field(default_factory=list)  # argv[0]: the program name


@dataclass(frozen=True)
class Outcome:
    text: str  # what the agent finally said
    error: str  # the client's own error message, when it reported one


@dataclass(frozen=True)
class Request:
    """What one run asks of the client."""

    prompt: str
    stream: bool = True
    tools: bool = True  # offer tools (the SDK agent; the real agents always do)
    files: tuple[str, ...] = ()  # files the prompt is about (aider adds them to the chat)


def _json_lines(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


class Client(ABC):
    name: str
    title: str
    dialect: str  # anthropic | responses | chat: the k3 route it speaks
    pin: str  # the install pin (install.PINS)
    always_streams: bool = True
    always_sends_tools: bool = (
        False  # agents send their tools with every turn; a request without is a side call
    )
    error_status: int = 500  # the engine failure to script: 400 where the client retries 5xx on its own
    docs_note: str = ""
    # The client's own shell tool and arguments that run `cat marker.txt` (None: it has no tools).
    # The double space is deliberate: k3 must hand the engine's argument bytes back unchanged.
    shell_call: tuple[str, str] | None = ("shell", '{"command":  "cat marker.txt"}')

    @abstractmethod
    def setup(self, base: str, token: str, request: Request) -> Setup:
        """Environment, config files and command line that point this client at k3."""

    @abstractmethod
    def outcome(self, stdout: str, stderr: str, returncode: int) -> Outcome:
        """The final answer or the client's own error message, read from its output."""

    def argv(self, setup: Setup, installed: Installed) -> list[str]:
        """The command line with its program resolved to the pinned install."""
        return [str(installed.program(self.pin)), *setup.command[1:]]


class ClaudeCode(Client):
    name, title, dialect, pin = "claude-code", "Claude Code", "anthropic", "claude-code"
    always_sends_tools = True
    shell_call = ("Bash", '{"command":  "cat marker.txt", "description": "Print the marker"}')
    docs_note = (
        "Claude Code refuses `--dangerously-skip-permissions` as root; `--allowedTools` grants the one "
        "tool a headless run needs. Any model name works: k3 serves every name with its engine model."
    )

    def setup(self, base: str, token: str, request: Request) -> Setup:
        env = {
            "ANTHROPIC_BASE_URL": base,
            "ANTHROPIC_AUTH_TOKEN": token,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "CLAUDE_CODE_MAX_RETRIES": "0",
        }
        command = ["claude", "-p", request.prompt, "--output-format", "json", "--allowedTools", "Bash(cat *)"]
        return Setup(env, {}, command)

    def outcome(self, stdout: str, stderr: str, returncode: int) -> Outcome:
        results = [r for r in _json_lines(stdout) if r.get("type") == "result"]
        if not results:
            return Outcome("", (stderr or stdout).strip()[-2000:] or f"no result (exit {returncode})")
        result = results[-1]
        text = str(result.get("result") or "")
        return Outcome("", text) if result.get("is_error") else Outcome(text, "")


CODEX_CONFIG = """\
model = "gpt-5.5"
model_provider = "k3"

[model_providers.k3]
name = "k3"
base_url = "{base}/v1"
wire_api = "responses"
env_key = "K3_API_KEY"
request_max_retries = 0
stream_max_retries = 0
"""


class Codex(Client):
    name, title, dialect, pin = "codex", "Codex", "responses", "codex"
    error_status = 400  # for a 5xx Codex shows its own "high demand" notice, not the engine's message
    always_sends_tools = True
    shell_call = ("exec_command", '{"cmd":  "cat marker.txt"}')
    docs_note = (
        'Codex 0.171 speaks only the Responses API (`wire_api = "responses"`). A model name Codex knows '
        "(`gpt-5.5`) gives it its full tool set, `apply_patch` included; k3 serves every name with its "
        "engine model. The provider table must be in the user-level `~/.codex/config.toml`."
    )

    def setup(self, base: str, token: str, request: Request) -> Setup:
        command = [
            "codex",
            "exec",
            "--json",
            "--skip-git-repo-check",
            "--sandbox",
            "workspace-write",
            request.prompt,
        ]
        return Setup({"K3_API_KEY": token}, {"~/.codex/config.toml": CODEX_CONFIG.format(base=base)}, command)

    def outcome(self, stdout: str, stderr: str, returncode: int) -> Outcome:
        events = _json_lines(stdout)
        text = [
            e["item"].get("text", "")
            for e in events
            if e.get("type") == "item.completed" and e.get("item", {}).get("type") == "agent_message"
        ]
        errors = [e.get("message", "") for e in events if e.get("type") == "error"]
        errors += [e.get("error", {}).get("message", "") for e in events if e.get("type") == "turn.failed"]
        if errors or returncode != 0:
            return Outcome("\n".join(text), "\n".join(errors) or stderr.strip()[-2000:])
        return Outcome("\n".join(text), "")


OPENCODE_PROVIDERS = {
    "chat": "@ai-sdk/openai-compatible",
    "responses": "@ai-sdk/openai",
    "anthropic": "@ai-sdk/anthropic",
}


class OpenCode(Client):
    pin = "opencode"
    always_sends_tools = True
    shell_call = ("bash", '{"command":  "cat marker.txt", "description": "Print the marker"}')
    error_status = 400  # opencode retries 5xx until its own timeout

    def __init__(self, dialect: str):
        self.dialect = dialect
        self.name = f"opencode-{dialect}"
        self.title = f"opencode ({OPENCODE_PROVIDERS[dialect]})"
        self.docs_note = (
            f"The `{OPENCODE_PROVIDERS[dialect]}` provider package ships inside opencode; "
            "`--pure` skips external plugins."
        )

    def setup(self, base: str, token: str, request: Request) -> Setup:
        config = {
            "$schema": "https://opencode.ai/config.json",
            "provider": {
                "k3": {
                    "npm": OPENCODE_PROVIDERS[self.dialect],
                    "name": "k3",
                    "options": {"baseURL": f"{base}/v1", "apiKey": token},
                    "models": {ENGINE_MODEL: {"name": ENGINE_MODEL}},
                }
            },
            "model": f"k3/{ENGINE_MODEL}",
            "permission": {"bash": "allow"},
        }
        files = {"~/.config/opencode/opencode.json": json.dumps(config, indent=2) + "\n"}
        command = ["opencode", "run", "--format", "json", "--pure", "--dir", ".", request.prompt]
        return Setup({}, files, command)

    def outcome(self, stdout: str, stderr: str, returncode: int) -> Outcome:
        events = _json_lines(stdout)
        text = [e["part"].get("text", "") for e in events if e.get("type") == "text" and "part" in e]
        errors = []
        for e in events:
            if e.get("type") == "error":
                error = e.get("error") or {}
                errors.append(str((error.get("data") or {}).get("message") or error.get("name") or error))
        if errors or returncode != 0:
            return Outcome("\n".join(text), "\n".join(errors) or stderr.strip()[-2000:])
        return Outcome("\n".join(text), "")


AIDER_METADATA = {
    f"openai/{ENGINE_MODEL}": {
        "max_input_tokens": 131072,
        "max_output_tokens": 8192,
        "input_cost_per_token": 0,
        "output_cost_per_token": 0,
        "litellm_provider": "openai",
        "mode": "chat",
    }
}


class Aider(Client):
    name, title, dialect, pin = "aider", "aider", "chat", "aider"
    always_streams = False
    shell_call = None
    error_status = 400  # aider (litellm) retries 5xx until its own timeout
    docs_note = (
        "aider sends no tools: it edits files from the text of the answer. The model metadata file keeps "
        "it from fetching model prices from GitHub. aider exits 0 even when the API call failed."
    )

    def setup(self, base: str, token: str, request: Request) -> Setup:
        env = {"OPENAI_API_BASE": f"{base}/v1", "OPENAI_API_KEY": token}
        files = {"~/.aider.model.metadata.json": json.dumps(AIDER_METADATA, indent=2) + "\n"}
        command = [
            "aider", "--model", f"openai/{ENGINE_MODEL}", "--edit-format", "whole",
            "--stream" if request.stream else "--no-stream",
            "--yes-always", "--no-git", "--no-check-update", "--no-analytics", "--no-pretty",
            "--no-show-release-notes", "--map-tokens", "0", "--no-detect-urls",
            *request.files, "--message", request.prompt,
        ]  # fmt: skip
        return Setup(env, files, command)

    def outcome(self, stdout: str, stderr: str, returncode: int) -> Outcome:
        # aider prints litellm's exception (wrapped to the terminal width) and exits 0: the output
        # is the only verdict. The error runs from the first exception line to the end, unwrapped.
        lines = stdout.splitlines()
        first = next((i for i, line in enumerate(lines) if re.search(r"\w+(Error|Exception)\b", line)), None)
        error = " ".join(" ".join(lines[first:]).split()) if first is not None else ""
        return Outcome(stdout, error)


class SDK(Client):
    always_streams = False

    def __init__(self, name: str, title: str, dialect: str, pin: str, api: str, env: dict[str, str]):
        self.name, self.title, self.dialect, self.pin = name, title, dialect, pin
        self.api = api
        self.env = env
        self.docs_note = f"The suite's agent is [`{SDK_AGENT}`](../{SDK_AGENT}): the SDK with its defaults."

    def setup(self, base: str, token: str, request: Request) -> Setup:
        env = {k: v.format(base=base, token=token) for k, v in self.env.items()}
        command = ["python", SDK_AGENT, self.api, request.prompt]
        command += ["--stream"] * request.stream + ["--tools"] * request.tools
        return Setup(env, {}, command)

    def argv(self, setup: Setup, installed: Installed) -> list[str]:
        return [str(installed.python(PINS[self.pin].group)), str(REPO_ROOT / SDK_AGENT), *setup.command[2:]]

    def outcome(self, stdout: str, stderr: str, returncode: int) -> Outcome:
        lines = _json_lines(stdout)
        if not lines:
            return Outcome("", stderr.strip()[-2000:] or f"no output (exit {returncode})")
        return Outcome(str(lines[-1].get("text") or ""), str(lines[-1].get("error") or ""))


OPENAI_ENV = {"OPENAI_BASE_URL": "{base}/v1", "OPENAI_API_KEY": "{token}"}
ANTHROPIC_ENV = {"ANTHROPIC_BASE_URL": "{base}", "ANTHROPIC_API_KEY": "{token}"}

CLIENTS: dict[str, Client] = {
    c.name: c
    for c in (
        ClaudeCode(),
        Codex(),
        OpenCode("chat"),
        OpenCode("responses"),
        OpenCode("anthropic"),
        Aider(),
        SDK("openai-sdk-chat", "OpenAI Python SDK (Chat Completions)", "chat", "openai", "chat", OPENAI_ENV),
        SDK(
            "openai-sdk-responses",
            "OpenAI Python SDK (Responses)",
            "responses",
            "openai",
            "responses",
            OPENAI_ENV,
        ),
        SDK(
            "anthropic-sdk",
            "Anthropic Python SDK (Messages)",
            "anthropic",
            "anthropic",
            "messages",
            ANTHROPIC_ENV,
        ),
    )
}
