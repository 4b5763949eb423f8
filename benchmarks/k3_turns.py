"""One proxied turn of each dialect, cut into the steps k3 takes, with every step's input prepared.

The client requests are the real captures replayed by the k3 tests (tests/k3/fixtures, built from
shared/reference/clients): a Claude Code turn on /v1/messages, a Codex turn on /v1/responses and an
opencode turn on /v1/chat/completions, each the turn that ends in a tool call. The engine's answer
is the scripted fake engine's stream of that turn: reasoning, a short text and one native tool call.

`prepare(dialect)` runs the whole turn once, step by step, through the same functions the app calls
(k3.app.K3.turn and K3._stream), checks the result is a real answer in the client's dialect, and
keeps each step's input so a benchmark can time one step alone. `STEPS` maps each step to the call
that performs it; their costs add up to the k3 code on a streamed turn's path (the ASGI and httpx
transport around it are measured by the `proxy` suite).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from k3 import presets
from k3.app import DIALECTS, K3
from k3.config import Config
from k3.continuity import TurnMemory
from k3.detect import Detection, detect
from k3.dialects.common import Turn, new_id
from k3.ir import CanonicalRequest, Event
from k3.sse import SSEDecoder
from k3.testing.fake_upstream import FakeUpstream, Reply, ToolCall
from k3.upstream import _ChunkReader  # the upstream stream's chunk parser, timed without its socket
from k3.upstream_request import build_payload, encode_payload

CAPTURES = Path(__file__).resolve().parents[1] / "tests" / "k3" / "fixtures" / "client_requests.jsonl"
# (client, scenario, seq) of the captured turn used for each dialect: the request that gets a tool call.
CAPTURED_TURNS = {
    "anthropic": ("claude", "tool", 3),
    "responses": ("codex", "tool", 1),
    "chat": ("opencode", "tool", 2),
}
HOP_BY_HOP = {"content-length", "host", "connection", "accept-encoding", "transfer-encoding"}
# The steps of one streamed turn, in the order k3 runs them.
STEP_NAMES = ("parse", "detect", "ingress", "payload", "decode", "translate", "encode")
CONFIG = Config(upstream="http://engine/v1")


def captured_request(dialect: str) -> dict[str, Any]:
    client, scenario, seq = CAPTURED_TURNS[dialect]
    for line in CAPTURES.open():
        request = json.loads(line)
        if (request["client"], request["scenario"], request["seq"]) == (client, scenario, seq):
            return request
    raise LookupError(f"no captured request {client}/{scenario}/{seq} in {CAPTURES}")


def sse_body(chunks: list[dict[str, Any]]) -> bytes:
    """The engine's streamed body for these chunks, as the fake engine writes it."""
    return b"".join([b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks]) + b"data: [DONE]\n\n"


@dataclass
class PreparedTurn:
    dialect: str
    capture: str  # client/scenario/seq
    k3: K3
    raw: bytes  # the client's body as it arrives
    headers: dict[str, str]  # lower-cased, as k3.connection.headers_of gives them
    body: dict[str, Any]
    found: Detection
    request: CanonicalRequest
    turn: Turn
    upstream_model: str
    payload: bytes  # what k3 posts to the engine
    upstream: bytes  # what the engine streams back
    chunks: list[dict[str, Any]]
    events: list[Event]
    output: bytes  # what the client receives

    # -- the steps, each on the previous step's output -------------------------------------------

    def parse(self) -> dict[str, Any]:
        return self.k3.parse_json(self.raw)

    def detect(self) -> Detection:
        return detect(self.dialect, self.headers, self.body, CONFIG.client)

    def ingress(self) -> CanonicalRequest:
        return DIALECTS[self.dialect].ingress(self.body, CONFIG.model)

    def build(self) -> bytes:
        memory = TurnMemory(self.k3.memory, self.headers, self.found.preset.name)
        model = presets.upstream_model(
            self.found.preset, self.request.model, CONFIG.model, CONFIG.small_model
        )
        return encode_payload(build_payload(self.request, CONFIG, model, memory), self.body)

    def decode(self) -> list[dict[str, Any]]:
        return _ChunkReader().parse(SSEDecoder().feed(self.upstream))

    def translate(self) -> list[Event]:
        memory = TurnMemory(self.k3.memory, self.headers, self.found.preset.name)
        translator = self.k3._translator(self.turn, self.payload, memory)
        events = [e for chunk in self.chunks for e in translator.feed(chunk)]
        return events + translator.finish()

    def encode(self) -> bytes:
        encoder = DIALECTS[self.dialect].Stream(self.turn)
        feed = encoder.feed
        return encoder.start() + b"".join([feed(e) for e in self.events])


STEPS: dict[str, Callable[[PreparedTurn], object]] = {
    "parse": PreparedTurn.parse,
    "detect": PreparedTurn.detect,
    "ingress": PreparedTurn.ingress,
    "payload": PreparedTurn.build,
    "decode": PreparedTurn.decode,
    "translate": PreparedTurn.translate,
    "encode": PreparedTurn.encode,
}
assert tuple(STEPS) == STEP_NAMES


def engine_reply(request: CanonicalRequest) -> Reply:
    """What the engine answers: reasoning, a sentence, and a call of the request's first tool."""
    return Reply(
        reasoning="The user wants the tests run before anything else is changed.",
        content="I'll run the test suite first.",
        tool_calls=[ToolCall(request.tools[0].name, '{"command": "pytest -q tests/k3", "timeout": 120000}')],
    )


_CLOSING = {"anthropic": b"event: message_stop", "responses": b"event: response.completed", "chat": b"[DONE]"}


def prepare(dialect: str) -> PreparedTurn:
    """Run the captured turn of `dialect` once through every step and check what the client gets."""
    captured = captured_request(dialect)
    k3 = K3(CONFIG)
    headers = {k.lower(): v for k, v in captured["headers"] if k.lower() not in HOP_BY_HOP}
    raw = orjson.dumps(captured["body"])
    body = k3.parse_json(raw)
    found = detect(dialect, headers, body, CONFIG.client)
    module = DIALECTS[dialect]
    request = module.ingress(body, CONFIG.model)
    turn = Turn(dialect, found.preset, request, body, new_id(module.ID_PREFIX), show=CONFIG.show_reasoning)
    model = presets.upstream_model(found.preset, request.model, CONFIG.model, CONFIG.small_model)
    payload = encode_payload(
        build_payload(request, CONFIG, model, TurnMemory(k3.memory, headers, found.preset.name)), body
    )
    chunks = FakeUpstream().chunks(orjson.loads(payload), engine_reply(request))
    prepared = PreparedTurn(
        dialect, "/".join(map(str, CAPTURED_TURNS[dialect])), k3, raw, headers, body, found, request, turn,
        model, payload, sse_body(chunks), chunks, [], b"",
    )  # fmt: skip
    prepared.events = prepared.translate()
    prepared.output = prepared.encode()
    if prepared.decode() != chunks:
        raise AssertionError(f"{dialect}: the upstream stream does not decode to the engine's chunks")
    if _CLOSING[dialect] not in prepared.output or request.tools[0].name.encode() not in prepared.output:
        raise AssertionError(f"{dialect}: the translated stream is not a finished tool-call turn")
    return prepared
