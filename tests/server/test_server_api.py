"""The OpenAI-compatible API over a real socket, judged by the official openai SDK where it applies."""

from __future__ import annotations

import httpx
import openai
import pytest

from engine.model import SamplingParams, generate
from engine.server.text import OutputText

MODEL = "kimi-linear"


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=30) as c:
        yield c


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=30) as c:
        yield c


def _user(text):
    return [{"role": "user", "content": text}]


def test_models_and_health(client, http):
    assert [m.id for m in client.models.list().data] == [MODEL]
    health = http.get("/health").json()
    assert health["status"] == "ok" and health["synthetic_weights"] is True
    assert health["scheduler"]["max_active"] == 2 and health["memory"]["weights_gib"] > 0


def test_completion_is_the_models_own_greedy_output(server, client, http):
    messages = _user("Hello there")
    reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0)
    ids = http.post("/tokenize", json={"messages": messages}).json()["tokens"]
    engine = server.context.engine
    expected_ids = generate(engine.model, ids, SamplingParams(max_tokens=8)).token_ids
    text = OutputText(engine.tokenizer, [])
    expected = "".join(text.add(t).content for t in expected_ids) + text.finish().content
    assert reply.choices[0].message.content == expected
    assert reply.choices[0].finish_reason == "length"
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (len(ids), 8)
    assert reply.model == MODEL and reply.id.startswith("chatcmpl-")


def test_streaming_agrees_with_the_full_response(client):
    messages = _user("Stream this")
    full = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0)
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12


def test_thinking_becomes_reasoning_content(client):
    reply = client.chat.completions.create(model=MODEL, messages=_user("think about it"), temperature=0)
    message = reply.choices[0].message
    assert message.content == "The answer." and message.model_extra["reasoning_content"] == "plan it"
    assert reply.choices[0].finish_reason == "stop"
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=_user("think about it"), temperature=0, stream=True
        )
    )
    deltas = [c.choices[0].delta for c in chunks]
    assert "".join(d.model_extra.get("reasoning_content") or "" for d in deltas) == "plan it"
    assert "".join(d.content or "" for d in deltas) == "The answer."


def test_stop_strings_end_the_output_before_them(client):
    reply = client.chat.completions.create(
        model=MODEL, messages=_user("say stop"), stop=["STOP"], temperature=0
    )
    assert reply.choices[0].message.content == "alpha " and reply.choices[0].finish_reason == "stop"
    streamed = client.chat.completions.create(
        model=MODEL, messages=_user("say stop"), stop="STOP", temperature=0, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == "alpha "


def test_seeded_sampling_is_reproducible(client):
    def sample(seed):
        r = client.chat.completions.create(
            model=MODEL, messages=_user("Tell me"), max_tokens=16, temperature=1.0, seed=seed
        )
        return r.choices[0].message.content

    assert sample(7) == sample(7) != sample(8)


def test_a_repeated_conversation_is_served_from_the_prefix_cache(client):
    messages = _user("A long system-like preamble " * 10)
    first = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, temperature=0)
    again = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, temperature=0)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens
    assert again.choices[0].message.content == first.choices[0].message.content


def test_tokenize_counts_the_templated_prompt(server, http):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    counted = http.post("/tokenize", json={"model": MODEL, "messages": messages}).json()
    context = server.context
    text = context.template.render(messages)
    assert counted["tokens"] == context.engine.tokenizer.encode(text)
    assert counted["count"] == len(counted["tokens"]) and counted["max_model_len"] == 2048
    plain = http.post("/tokenize", json={"prompt": "abc"}).json()
    assert plain["tokens"] == context.engine.tokenizer.encode("abc") and plain["count"] < 3  # merged
    assert http.post("/tokenize", json={"nothing": 1}).status_code == 400


BAD_BODIES = [
    ({}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({"messages": _user("x"), "temperature": -1}, "temperature"),
    ({"messages": _user("x"), "top_p": 0}, "top_p"),
    ({"messages": _user("x"), "max_tokens": 0}, "max_tokens"),
    ({"messages": _user("x"), "max_tokens": True}, "max_tokens"),
    ({"messages": _user("x"), "n": 2}, "n"),
    ({"messages": _user("x"), "stop": [""]}, "stop"),
    ({"messages": _user("x"), "stream": "yes"}, "stream"),
    ({"messages": _user("x"), "logprobs": True}, "logprobs"),
    ({"messages": _user("x"), "frequency_penalty": 0.5}, "frequency_penalty"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, None),
    ({"messages": _user("x"), "tools": [{"type": "function"}]}, "tools[0]"),
    ({"messages": _user("x"), "top_k": -2}, "top_k"),
    ({"messages": _user("x"), "top_k": 1.5}, "top_k"),
    ({"messages": _user("x"), "min_p": 1.5}, "min_p"),
    ({"messages": _user("x"), "model": 7}, "model"),
    ([1, 2], None),
]


@pytest.mark.parametrize(("body", "param"), BAD_BODIES)
def test_bad_input_is_a_400_in_openai_shape(http, body, param):
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    if param:
        assert error["param"] == param


def test_other_client_errors_are_json_too(http):
    r = http.post("/v1/chat/completions", content=b"{not json")
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    assert http.get("/v1/chat/completions").status_code == 405
    missing = http.get("/v1/nothing")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"


def test_a_prompt_over_the_max_context_is_refused(client):
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=_user("x" * 3000))
    assert refused.value.code == "context_length_exceeded" and "max context is 2048" in refused.value.message


def test_top_k_1_samples_the_greedy_token_whatever_the_temperature(client):
    messages = _user("Pick one")
    greedy = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0)
    for seed in (1, 2, 3):
        topk = client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=10, temperature=1.5, seed=seed, extra_body={"top_k": 1}
        )
        assert topk.choices[0].message.content == greedy.choices[0].message.content


def test_min_p_1_keeps_only_the_most_likely_token(client):
    messages = _user("Pick another")
    greedy = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0)
    reply = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=10, temperature=2, seed=5, extra_body={"min_p": 1.0}
    )
    assert reply.choices[0].message.content == greedy.choices[0].message.content


def test_a_model_this_engine_does_not_serve_is_a_404_in_openai_shape(client):
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="gpt-4o", messages=_user("x"), max_tokens=2)
    assert missing.value.code == "model_not_found" and "`gpt-4o` does not exist" in missing.value.message


def test_metrics_count_requests_tokens_and_latencies(client, http):
    def value(text: str, name: str) -> float:
        return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))

    before = http.get("/metrics").text
    client.chat.completions.create(model=MODEL, messages=_user("Count me"), max_tokens=5, temperature=0)
    after = http.get("/metrics")
    assert after.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = after.text
    assert value(text, "kimi_generation_tokens_total") - value(before, "kimi_generation_tokens_total") == 5
    assert (
        value(text, "kimi_time_to_first_token_seconds_count")
        == value(before, "kimi_time_to_first_token_seconds_count") + 1
    )
    assert value(text, "kimi_inter_token_latency_seconds_count") >= 4  # five tokens: four gaps
    assert 'kimi_requests_total{route="/v1/chat/completions",status="200"}' in text
    assert "kimi_requests_waiting 0" in text


def test_version_names_the_engine_and_the_model(http):
    body = http.get("/version").json()
    assert body["name"] == "kimi-engine" and body["model"] == MODEL and body["version"]
