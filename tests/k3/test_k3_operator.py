"""What k3 tells its operator: /metrics, /version, one access line per finished request, which
variable holds its own key, and the start command `k3 doctor` prints for the engine it probed."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
from click.testing import CliRunner
from k3_helpers import start_k3, stop_k3

from k3.cli import main
from k3.testing.fake_upstream import FakeUpstream, Reply, serve_in_thread

ROOT = Path(__file__).resolve().parents[2]
CHAT = {"model": "m", "messages": [{"role": "user", "content": "a secret prompt"}]}


def _value(text: str, sample: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(sample + " "))


async def test_metrics_count_finished_turns_by_status_and_version_names_k3(client, fake):
    fake.push(Reply(content="ok"), Reply(status=429, error="busy"))
    assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
    assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 429
    assert (await client.post("/v1/chat/completions", json={"messages": 3})).status_code == 400
    metrics = await client.get("/metrics")
    assert metrics.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = metrics.text
    for status in (200, 429, 400):
        assert _value(text, f'k3_turns_total{{status="{status}"}}') == 1, text
    assert _value(text, "k3_turn_seconds_count") == 3 and _value(text, "k3_turn_seconds_sum") > 0
    assert _value(text, 'k3_turns_by_dialect_total{dialect="chat"}') == 2
    version = (await client.get("/version")).json()
    assert version["name"] == "k3" and version["version"]


async def test_the_access_log_has_one_line_per_finished_request_and_never_the_prompt(client, fake, caplog):
    fake.push(Reply(content="hello there"))
    with caplog.at_level(logging.INFO, logger="k3.access"):
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
        assert (await client.get("/health")).status_code in (200, 503)
    lines = [r.getMessage() for r in caplog.records if r.name == "k3.access"]
    assert len(lines) == 2, lines
    assert (
        lines[0].startswith("POST /v1/chat/completions 200 ") and " in=" in lines[0] and " out=" in lines[0]
    )
    assert lines[1].startswith("GET /health ")
    assert not any("secret" in line for line in lines)


def _serve(env: dict[str, str], upstream: str):
    return start_k3(["serve", "--upstream", upstream, "--port", "0"], env)


def test_k3s_own_key_is_not_the_variable_codex_sends_its_key_from(live, tmp_path):
    _, upstream = live
    state = {"K3_STATE_DIR": str(tmp_path / "state")}
    codex_shell = {**state, "K3_API_KEY": "local", "K3_SERVE_API_KEY": ""}
    process, base = _serve(codex_shell, upstream)
    try:
        assert httpx.post(f"{base}/v1/chat/completions", json=CHAT, timeout=20).status_code == 200
    finally:
        output = stop_k3(process)
    assert "auth: off" in output
    process, base = _serve({**state, "K3_SERVE_API_KEY": "sekrit"}, upstream)
    try:
        refused = httpx.post(f"{base}/v1/chat/completions", json=CHAT, timeout=20)
        allowed = httpx.post(
            f"{base}/v1/chat/completions", json=CHAT, headers={"authorization": "Bearer sekrit"}, timeout=20
        )
    finally:
        output = stop_k3(process)
    assert refused.status_code == 401 and allowed.status_code == 200
    assert "auth: on" in output and "sekrit" not in output


def test_doctor_prints_the_tool_parser_the_probed_engine_needs():
    for name, expected in (("kimi-engine", "--tool-parser kimi"), (None, None)):
        with serve_in_thread(FakeUpstream(name=name)) as upstream:
            result = CliRunner().invoke(main, ["doctor", "--upstream", upstream, "--no-generate"])
        start = [line for line in result.output.splitlines() if line.startswith("start k3:")][0]
        if expected:
            assert expected in start and "GET /version: kimi-engine" in result.output
        else:
            assert "--tool-parser" not in start
