"""The scenarios: what the engine is scripted to say, what the client is asked, and what must follow.

Every check returns the first problem it finds as one sentence naming the request or event that was
wrong, or None. Checks that hold for every run come first: the client finished in time, k3 answered
every request the client made (model lists, token counts, probes, titles) without an error, and the
client made no agent request beyond the script.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from k3.testing.fake_upstream import Reply, ToolCall
from runners.conformance.clients import CLIENTS, Client, Outcome, Request
from runners.conformance.tap import Hit
from runners.conformance.upstream import Exchange

TURN_ROUTES = ("/v1/messages", "/v1/chat/completions", "/v1/responses")
MARKER_FILE = "marker.txt"
PATCH_FILE = "k3-patch.txt"
EDIT_FILE = "greeting.txt"
CALL_ID = "call_k3conformance0"  # the engine's own id for its tool call


@dataclass
class Evidence:
    """What one client run left behind."""

    outcome: Outcome
    returncode: int | None  # None: killed at the time limit
    seconds: float
    timeout: float
    exchanges: list[Exchange]  # what the engine received
    hits: list[Hit]  # what the client sent to k3, and how k3 answered
    work: Path

    def agent(self) -> list[Exchange]:
        return [e for e in self.exchanges if e.kind == "agent"]


def _is_turn(hit: Hit) -> bool:
    path = hit.path.split("?")[0]
    return path in TURN_ROUTES


def _show(value: Any, limit: int = 300) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


@dataclass(frozen=True)
class Words:
    """The run's unique strings: nothing stale or hard-coded can pass for them."""

    nonce: str

    @property
    def answer(self) -> str:
        return f"k3 conformance answer {self.nonce}"

    @property
    def marker(self) -> str:
        return f"marker-{self.nonce}"

    @property
    def reasoning(self) -> str:
        return f"Reasoning {self.nonce}: read the marker file first."

    @property
    def failure(self) -> str:
        return f"k3 conformance scripted engine failure {self.nonce}"


@dataclass(frozen=True)
class Scenario(ABC):
    name: str
    summary: str  # one line for the docs
    k3_options: tuple[str, ...] = ()
    stream: bool | None = None  # None: the client's own default (always streams, or not)
    tool_format: str = "native"
    reasoning_field: str = "reasoning_content"

    # -- what the run is ---------------------------------------------------------------------

    def request(self, client: Client, words: Words) -> Request:
        return Request(f"Run `cat {MARKER_FILE}` and tell me what it printed.", self.streams(client))

    def streams(self, client: Client) -> bool:
        return client.always_streams if self.stream is None else self.stream

    def prepare(self, work: Path, words: Words) -> None:
        (work / MARKER_FILE).write_text(words.marker + "\n")

    @abstractmethod
    def replies(self, client: Client, words: Words) -> list[Reply]:
        """The engine's turns, in order."""

    # -- what must follow --------------------------------------------------------------------

    def check(self, client: Client, words: Words, ev: Evidence) -> str | None:
        return self.check_common(client, words, ev) or self.check_own(client, words, ev)

    def expected_agent_requests(self) -> int:
        return 1

    def error_expected(self) -> bool:
        return False

    def check_common(self, client: Client, words: Words, ev: Evidence) -> str | None:
        if ev.returncode is None:
            last = ev.hits[-1].line() if ev.hits else "no request reached k3"
            return f"the client did not finish within {ev.timeout:.0f} s; its last request: {last}"
        for hit in ev.hits:
            if hit.status >= 400 and not (self.error_expected() and _is_turn(hit)):
                return f"k3 answered the client's {hit.line()}"
            if hit.status == 0:
                return f"k3 never answered the client's {hit.method} {hit.path}"
        agent = ev.agent()
        extra = [e for e in agent if e.turn is None]
        if extra:
            return (
                f"the client made {len(agent)} agent requests; the script has "
                f"{self.expected_agent_requests()} (the extra one ends with {_show(_last_message(extra[0]))})"
            )
        if len(agent) < self.expected_agent_requests():
            said = ev.outcome.error or ev.outcome.text
            return (
                f"the client made {len(agent)} of {self.expected_agent_requests()} agent requests "
                f"and stopped; it said: {_show(said)}"
            )
        return None

    def check_own(self, client: Client, words: Words, ev: Evidence) -> str | None:
        return None

    def check_answer(self, words: Words, ev: Evidence) -> str | None:
        if ev.outcome.error:
            return f"the client reported an error: {_show(ev.outcome.error)}"
        if words.answer not in ev.outcome.text:
            return f"the client's answer lacks the engine's text {words.answer!r}; it said {_show(ev.outcome.text)}"
        return None

    def check_streaming(self, client: Client, ev: Evidence) -> str | None:
        streams = self.streams(client)
        for n, exchange in enumerate(ev.agent(), 1):
            body = exchange.body if isinstance(exchange.body, dict) else {}
            if bool(body.get("stream")) != streams:
                return f"engine request #{n} has stream={body.get('stream')!r}; the client asked for stream={streams}"
        for hit in ev.hits:
            if not _is_turn(hit) or hit.status >= 400:
                continue
            sse = hit.content_type.startswith("text/event-stream")
            if sse != streams:
                return f"k3 answered {hit.method} {hit.path} with {hit.content_type!r}; the client asked for stream={streams}"
            if streams and len(hit.events) < 4:
                return f"k3 streamed {hit.method} {hit.path} in {len(hit.events)} frames: {hit.events}"
        return None


def _last_message(exchange: Exchange) -> Any:
    messages = exchange.body.get("messages") if isinstance(exchange.body, dict) else None
    return messages[-1] if messages else exchange.body


class Plain(Scenario):
    def request(self, client: Client, words: Words) -> Request:
        return Request("Say hello.", self.streams(client), tools=False)

    def replies(self, client: Client, words: Words) -> list[Reply]:
        return [Reply(content=words.answer, reasoning=words.reasoning)]

    def check_own(self, client: Client, words: Words, ev: Evidence) -> str | None:
        return self.check_answer(words, ev) or self.check_streaming(client, ev)


class EngineError(Scenario):
    def request(self, client: Client, words: Words) -> Request:
        return Request("Say hello.", self.streams(client), tools=False)

    def replies(self, client: Client, words: Words) -> list[Reply]:
        return [Reply(error=words.failure, status=client.error_status)]

    def error_expected(self) -> bool:
        return True

    def check_own(self, client: Client, words: Words, ev: Evidence) -> str | None:
        if words.failure not in ev.outcome.error:
            said = ev.outcome.error or ev.outcome.text
            return (
                f"the client did not show the engine's error {words.failure!r} as its own error; "
                f"it said: {_show(said)}"
            )
        return None


class ToolRoundTrip(Scenario):
    """The engine calls the client's shell tool; the client runs it and sends the result back."""

    def first_call(self, client: Client, words: Words) -> ToolCall:
        if client.shell_call is None:
            raise ValueError(f"{client.name} has no shell tool")
        return ToolCall(*client.shell_call, id=CALL_ID)

    def replies(self, client: Client, words: Words) -> list[Reply]:
        first = Reply(
            content="" if self.tool_format in ("json", "pythonic") else "Reading the marker.",
            reasoning=words.reasoning,
            tool_calls=[self.first_call(client, words)],
            tool_format=self.tool_format,
            reasoning_key=self.reasoning_field,
        )
        return [first, Reply(content=words.answer)]

    def expected_agent_requests(self) -> int:
        return 2

    def expected_result(self, words: Words) -> str:
        return words.marker

    def check_own(self, client: Client, words: Words, ev: Evidence) -> str | None:
        return (
            check_replayed_turn(ev.agent()[1], self.replies(client, words)[0], self.expected_result(words))
            or self.check_answer(words, ev)
            or self.check_streaming(client, ev)
        )


def check_replayed_turn(exchange: Exchange, sent: Reply, result: str) -> str | None:
    """The engine's second request must hold its first turn as it wrote it, then the tool result."""
    messages = exchange.body.get("messages") if isinstance(exchange.body, dict) else None
    where = "engine request #2"
    if not isinstance(messages, list):
        return f"{where} has no messages list"
    call = sent.tool_calls[0]
    found = None
    for i, message in enumerate(messages):
        if isinstance(message, dict) and message.get("role") == "assistant":
            for tool_call in message.get("tool_calls") or []:
                if (tool_call.get("function") or {}).get("name") == call.name:
                    found = i, message, tool_call
    if found is None:
        roles = [m.get("role") for m in messages if isinstance(m, dict)]
        return f"{where} has no assistant message calling {call.name!r} (roles: {roles})"
    i, message, tool_call = found
    at = f"{where} messages[{i}]"
    arguments = tool_call["function"].get("arguments")
    if sent.tool_format == "pythonic":  # the engine wrote Python, not JSON: only the values are its own
        if not isinstance(arguments, str) or json.loads(arguments) != json.loads(call.arguments):
            return f"{at}: tool call arguments {_show(arguments)} do not carry the values {call.arguments}"
    elif arguments != call.arguments:
        return f"{at}: tool call arguments {arguments!r} are not the engine's bytes {call.arguments!r}"
    expected_id = sent.expected_call_id(0)
    if expected_id is not None and tool_call.get("id") != expected_id:
        return f"{at}: tool call id {tool_call.get('id')!r} is not the engine's {expected_id!r}"
    problem = _check_reasoning(message, sent)
    if problem:
        return f"{at}: {problem}"
    for j, later in enumerate(messages[i + 1 :], i + 1):
        if isinstance(later, dict) and later.get("role") == "tool":
            if later.get("tool_call_id") != tool_call.get("id"):
                return (
                    f"{where} messages[{j}]: tool result for {later.get('tool_call_id')!r}, "
                    f"but the call's id is {tool_call.get('id')!r}"
                )
            if result not in json.dumps(later.get("content"), ensure_ascii=False):
                return f"{where} messages[{j}]: tool result {_show(later.get('content'))} lacks {result!r}"
            return None
    return f"{where} has no tool message after messages[{i}]"


def _check_reasoning(message: dict, sent: Reply) -> str | None:
    want = sent.reasoning
    if sent.reasoning_key == "think":
        content = message.get("content")
        if not (isinstance(content, str) and content.startswith(f"<think>{want}</think>")):
            return f"content {_show(content)} does not start with the engine's <think>{want}</think>"
        return None
    key = "reasoning" if sent.reasoning_key == "reasoning" else "reasoning_content"
    if message.get(key) != want:
        return f"{key} is {_show(message.get(key))}, not the engine's reasoning {want!r} (keys: {sorted(message)})"
    return None


APPLY_PATCH = "*** Begin Patch\n*** Add File: {file}\n+patched {nonce}\n*** End Patch\n"


class ApplyPatch(ToolRoundTrip):
    """Codex's freeform `apply_patch` tool: reaches the engine as a function with one `input` string."""

    def first_call(self, client: Client, words: Words) -> ToolCall:
        patch = APPLY_PATCH.format(file=PATCH_FILE, nonce=words.nonce)
        return ToolCall("apply_patch", json.dumps({"input": patch}), id=CALL_ID)

    def expected_result(self, words: Words) -> str:
        return PATCH_FILE

    def request(self, client: Client, words: Words) -> Request:
        return Request(f"Add the file {PATCH_FILE}.", self.streams(client))

    def check_own(self, client: Client, words: Words, ev: Evidence) -> str | None:
        path = ev.work / PATCH_FILE
        wanted = f"patched {words.nonce}\n"
        if not path.is_file() or path.read_text() != wanted:
            have = path.read_text() if path.is_file() else "no such file"
            return f"apply_patch did not create {PATCH_FILE} with {wanted!r} ({have!r})"
        return super().check_own(client, words, ev)


class Edit(Scenario):
    """aider edits a file from the text of the answer (its whole-file edit format)."""

    def request(self, client: Client, words: Words) -> Request:
        return Request(
            f"Add the nonce to {EDIT_FILE}.", self.streams(client), tools=False, files=(EDIT_FILE,)
        )

    def prepare(self, work: Path, words: Words) -> None:
        (work / EDIT_FILE).write_text("hello\n")

    def replies(self, client: Client, words: Words) -> list[Reply]:
        return [Reply(content=f"{EDIT_FILE}\n```\nhello {words.nonce}\n```\n")]

    def check_own(self, client: Client, words: Words, ev: Evidence) -> str | None:
        text = (ev.work / EDIT_FILE).read_text()
        if text != f"hello {words.nonce}\n":
            return f"{EDIT_FILE} holds {text!r} after the edit, not {f'hello {words.nonce}'!r}"
        if ev.outcome.error:
            return f"the client reported an error: {_show(ev.outcome.error)}"
        return None


@dataclass(frozen=True)
class Case:
    client: Client
    scenario: Scenario

    @property
    def key(self) -> str:
        return f"{self.client.name}.{self.scenario.name}"


PLAIN = Plain("plain", "a plain answer (streamed where the client streams)")
STREAM = Plain("stream", "a streamed answer", stream=True)
TOOLS = ToolRoundTrip("tool_round_trip", "the client runs its own shell tool and sends the result back")
ERROR = EngineError(
    "error",
    "an engine error (HTTP 500; 400 for clients that retry 5xx on their own) shown as the client's own error",
)
PATCH = ApplyPatch("apply_patch", "Codex's freeform apply_patch tool creates a file")
EDIT = Edit("edit", "aider edits a file from the answer's text")

# The engine's text formats and reasoning fields, streamed (the harder path for the parsers),
# through the quickest real client.
FORMATS = [
    ToolRoundTrip(
        f"tool_format.{fmt}",
        f"a tool call written as {fmt} text (k3 --tool-parser {fmt})",
        ("--tool-parser", fmt),
        stream=True,
        tool_format=fmt,
    )
    for fmt in ("kimi_k3", "kimi", "hermes", "json", "pythonic")
]
FIELDS = [
    ToolRoundTrip(
        f"reasoning_field.{name}",
        f"reasoning carried as {name} (k3 --reasoning-field {name})",
        ("--reasoning-field", name) + (("--tool-parser", "kimi_k3") if name == "kimi_k3" else ()),
        stream=True,
        tool_format="kimi_k3" if name == "kimi_k3" else "native",
        reasoning_field=name,
    )
    for name in ("reasoning", "think", "kimi_k3")
]

MATRIX: dict[str, list[Scenario]] = {
    "claude-code": [PLAIN, TOOLS, ERROR],
    "codex": [PLAIN, TOOLS, PATCH, ERROR],
    "opencode-chat": [PLAIN, TOOLS, ERROR],
    "opencode-responses": [PLAIN, TOOLS, ERROR],
    "opencode-anthropic": [PLAIN, TOOLS, ERROR],
    "aider": [PLAIN, STREAM, EDIT, ERROR],
    "openai-sdk-chat": [PLAIN, STREAM, TOOLS, ERROR, *FORMATS, *FIELDS],
    "openai-sdk-responses": [PLAIN, STREAM, TOOLS, ERROR],
    "anthropic-sdk": [PLAIN, STREAM, TOOLS, ERROR],
}

CASES: list[Case] = [Case(CLIENTS[name], s) for name, scenarios in MATRIX.items() for s in scenarios]


def select(clients: list[str] | None = None, scenarios: list[str] | None = None) -> list[Case]:
    """Cases whose client and scenario names match (a scenario name also matches its family: `tool_format`)."""
    unknown = set(clients or []) - set(MATRIX)
    if unknown:
        raise ValueError(f"unknown client(s) {sorted(unknown)}; known: {', '.join(MATRIX)}")
    chosen = [
        c
        for c in CASES
        if (not clients or c.client.name in clients)
        and (
            not scenarios
            or any(c.scenario.name == s or c.scenario.name.startswith(s + ".") for s in scenarios)
        )
    ]
    if not chosen:
        raise ValueError(f"no case matches clients={clients} scenarios={scenarios}")
    return chosen


@dataclass
class Result:
    case: Case
    passed: bool
    seconds: float
    problem: str | None = None
    details: list[str] = field(default_factory=list)  # evidence lines for the report
    traffic: list[str] = field(default_factory=list)  # every request the client made to k3, with k3's status
    engine: list[str] = field(default_factory=list)  # the kind of every request k3 made to the engine
    timed_out: bool = False  # the client was still running at the driver's timeout

    def headline(self) -> str:
        c = self.case
        verdict = "pass" if self.passed else f"FAIL: {self.problem}"
        return f"{c.key} [{c.client.dialect}] {verdict}"
