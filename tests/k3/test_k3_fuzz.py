"""Fuzz the ingress of every dialect: random JSON and mutated real captures.

Ingress may only accept (and then build a serialisable upstream payload) or raise ProxyError(400);
through the whole app, no request may get a 5xx or escape as an exception. Integers go beyond
64 bits on purpose: orjson cannot encode them, so they must end as a 400, never a TypeError.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from k3.app import create_app
from k3.config import Config
from k3.dialects import anthropic, chat, responses
from k3.errors import ProxyError
from k3.testing.fake_upstream import FakeUpstream
from k3.upstream_request import build_payload, encode_payload

FIXTURES = [
    json.loads(line) for line in (Path(__file__).parent / "fixtures" / "client_requests.jsonl").open()
]
DIALECT_OF = {"anthropic_messages": "anthropic", "openai_chat": "chat", "openai_responses": "responses"}
MODULES = {"anthropic": anthropic, "chat": chat, "responses": responses}
ROUTES = {"anthropic": "/v1/messages", "chat": "/v1/chat/completions", "responses": "/v1/responses"}
CAPTURED = {
    d: [r["body"] for r in FIXTURES if DIALECT_OF.get(r["dialect"]) == d and isinstance(r["body"], dict)]
    for d in MODULES
}
KEYS = {
    "anthropic": ["model", "messages", "system", "tools", "tool_choice", "max_tokens", "stream", "thinking",
                  "stop_sequences", "temperature", "top_p", "top_k", "output_config", "metadata"],
    "chat": ["model", "messages", "tools", "tool_choice", "max_tokens", "max_completion_tokens", "stream",
             "stream_options", "stop", "temperature", "reasoning_effort", "response_format", "functions", "n"],
    "responses": ["model", "input", "instructions", "tools", "tool_choice", "max_output_tokens", "stream",
                  "reasoning", "text", "parallel_tool_calls", "store", "include"],
}  # fmt: skip
WORDS = ["user", "assistant", "system", "developer", "tool", "text", "image", "tool_use", "tool_result", "thinking",
         "message", "function_call", "function_call_output", "reasoning", "input_text", "output_text", "function",
         "custom", "auto", "any", "none", "required", "base64", "url", "image_url", "input_image", "disabled"]  # fmt: skip

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.integers()
    | st.sampled_from([2**64 - 1, 2**64, -(2**63) - 1, 10**30, 1.8e19, 1e20, 1e300, -1e20])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.sampled_from(WORDS)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(["type", "role", "content", "text", "id", "name", "source", "input", "arguments"])
            | st.text(max_size=6),
            inner,
            max_size=5,
        )
    ),
    max_leaves=25,
)


def bodies(dialect: str):
    return st.dictionaries(st.sampled_from(KEYS[dialect]) | st.text(max_size=8), json_values, max_size=8)


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            out += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value[:6]):
            out += _paths(item, (*prefix, i))
    return out


@st.composite
def mutated_captures(draw, dialect: str):
    body = copy.deepcopy(draw(st.sampled_from(CAPTURED[dialect])))
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(body) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = body
        for key in path[:-1]:
            parent = parent[key]
        if draw(st.booleans()) and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(json_values)
    return body


def check_ingress(dialect: str, body: dict[str, Any]) -> None:
    try:
        request = MODULES[dialect].ingress(body, "m")
    except ProxyError as err:
        assert err.status == 400 and err.message
        return
    try:
        orjson.loads(encode_payload(build_payload(request, Config(), "engine"), body))
    except ProxyError as err:
        assert err.status == 400 and err.param and err.param in err.message


def _raw_json(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("dialect", list(MODULES))
@pytest.mark.parametrize("strategy", [bodies, mutated_captures], ids=["random_json", "mutated_captures"])
def test_ingress_only_accepts_or_raises_400(dialect, strategy):
    @FUZZ
    @given(strategy(dialect))
    def run(body):
        check_ingress(dialect, body)

    run()


@pytest.mark.parametrize("dialect", list(MODULES))
async def test_the_app_never_answers_5xx_to_fuzzed_bodies(dialect):
    fake = FakeUpstream()
    app = create_app(Config(upstream="http://fake/v1"), upstream_transport=httpx.ASGITransport(fake))
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://k3")
    seen: list[bytes] = []

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    # stdlib json writes integers of any size, as a client could; orjson reads the big ones as floats.
    @given(st.one_of(bodies(dialect), mutated_captures(dialect)).map(_raw_json) | st.binary(max_size=40))
    def collect(raw):
        seen.append(raw)

    collect()  # hypothesis drives a sync function; the requests run below on this test's loop
    try:
        for raw in seen:
            for path in (
                (ROUTES[dialect], "/v1/messages/count_tokens")
                if dialect == "anthropic"
                else (ROUTES[dialect],)
            ):
                response = await client.post(path, content=raw)
                assert response.status_code < 500, (raw[:300], response.text[:300])
                if path.endswith("count_tokens") and response.status_code == 200:
                    assert response.json()["input_tokens"] >= 1
    finally:
        await client.aclose()
