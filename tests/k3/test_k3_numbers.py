"""Numbers no engine (or orjson) can carry: a 400 naming the field, never a TypeError or a 5xx.

A client may write `"max_tokens": 1e20`, which Python reads as an integer-valued float; turned
into an int it is beyond 64 bits and orjson refuses to encode it. JSON integer literals beyond
64 bits are read by orjson as floats and forwarded as such; integers beyond 64 bits can still
reach the payload from Python callers, and must end as a 400 too.
"""

from __future__ import annotations

import orjson
import pytest
from test_k3_app import ROUTES, body_for, error_of

from k3.config import Config
from k3.dialects import anthropic, chat, responses
from k3.dialects.common import INT_MAX
from k3.errors import ProxyError
from k3.upstream_request import build_payload, encode_payload

COUNT_FIELDS = [
    ("anthropic", "max_tokens"),
    ("anthropic", "top_k"),
    ("chat", "max_tokens"),
    ("chat", "max_completion_tokens"),
    ("responses", "max_output_tokens"),
]
# As the client writes them: all integral, all beyond what a signed 64-bit count holds.
HUGE = ["1e20", "1.8e19", "100000000000000000000000", str(INT_MAX + 1), "1e300"]


def _raw_body(dialect: str, field: str, literal: str, stream: bool = False) -> bytes:
    # Spliced as text: the literal must reach k3 exactly as a client could write it.
    head = orjson.dumps(body_for(dialect, stream))[:-1]
    return head + b',"' + field.encode() + b'":' + literal.encode() + b"}"


@pytest.mark.parametrize(("dialect", "field"), COUNT_FIELDS)
@pytest.mark.parametrize("literal", HUGE)
async def test_counts_beyond_64_bits_are_400_naming_the_field(client, fake, dialect, field, literal):
    response = await client.post(ROUTES[dialect], content=_raw_body(dialect, field, literal))
    assert response.status_code == 400, response.text
    _, message = error_of(dialect, response)
    assert field in message and str(INT_MAX) in message
    assert not fake.requests  # nothing reached the engine


@pytest.mark.parametrize("dialect", list(ROUTES))
async def test_streaming_turns_reject_huge_counts_before_committing(client, fake, dialect):
    field = {"anthropic": "max_tokens", "chat": "max_tokens", "responses": "max_output_tokens"}[dialect]
    response = await client.post(ROUTES[dialect], content=_raw_body(dialect, field, "1e20", stream=True))
    assert response.status_code == 400 and field in error_of(dialect, response)[1]


async def test_thinking_budget_beyond_64_bits_is_400(client):
    body = body_for("anthropic", thinking={"type": "enabled", "budget_tokens": 1e20})
    response = await client.post(ROUTES["anthropic"], json=body)
    assert response.status_code == 400 and "thinking.budget_tokens" in error_of("anthropic", response)[1]


async def test_the_largest_count_still_passes(client, fake):
    response = await client.post(ROUTES["chat"], content=_raw_body("chat", "max_tokens", str(INT_MAX)))
    assert response.status_code == 200
    assert fake.requests[-1]["max_tokens"] == INT_MAX


@pytest.mark.parametrize(
    ("literal", "forwarded"),
    [("18446744073709551615", 2**64 - 1), ("100000000000000000000000", 1e23), ("-1e30", -1e30)],
)
async def test_forwarded_keys_with_huge_numbers_reach_the_engine_as_read(client, fake, literal, forwarded):
    response = await client.post(ROUTES["chat"], content=_raw_body("chat", "seed", literal))
    assert response.status_code == 200
    assert fake.requests[-1]["seed"] == forwarded


@pytest.mark.parametrize("dialect", list(ROUTES))
async def test_a_temperature_beyond_double_range_is_400(client, dialect):
    response = await client.post(ROUTES[dialect], content=_raw_body(dialect, "temperature", "1" + "0" * 400))
    assert response.status_code == 400
    error_of(dialect, response)


async def test_count_tokens_with_a_huge_count_still_estimates(client):
    raw = _raw_body("anthropic", "max_tokens", "1e20")
    response = await client.post("/v1/messages/count_tokens", content=raw)
    assert response.status_code == 200 and response.json()["input_tokens"] >= 1


# -- bodies built in Python: integers orjson cannot encode -------------------------------------


def _encode(module, body):
    return encode_payload(build_payload(module.ingress(body, "m"), Config(), "engine"), body)


@pytest.mark.parametrize(
    ("module", "body", "where"),
    [
        (chat, {"messages": [], "seed": 2**70}, "seed"),
        (chat, {"messages": [], "logit_bias": {"5": -(2**63) - 1}}, "logit_bias.5"),
        (
            chat,
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"maximum": 2**64}}}]},
            "tools[0].function.parameters.maximum",
        ),
        (
            anthropic,
            {
                "messages": [],
                "tools": [{"name": "f", "input_schema": {"type": "object", "minimum": -(2**64)}}],
            },
            "tools[0].input_schema.minimum",  # the client's own path, not the engine payload's
        ),
        (
            responses,
            {"input": "hi", "tools": [{"type": "function", "name": "f", "parameters": {"enum": [1, 2**65]}}]},
            "tools[0].parameters.enum[1]",
        ),
    ],
)
def test_python_bodies_with_unencodable_integers_are_400_naming_the_field(module, body, where):
    with pytest.raises(ProxyError) as caught:
        _encode(module, body)
    assert caught.value.status == 400
    assert caught.value.param == where and where in caught.value.message


def test_encodable_extremes_pass_through_unchanged():
    body = {"messages": [], "seed": 2**64 - 1, "logit_bias": {"5": -(2**63)}}
    payload = orjson.loads(_encode(chat, body))
    assert payload["seed"] == 2**64 - 1 and payload["logit_bias"] == {"5": -(2**63)}
