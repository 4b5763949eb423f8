"""`serve --record DIR` and `k3 replay DIR`: one cassette per turn, credentials redacted, and a
replay that matches until k3's behaviour changes."""

from __future__ import annotations

import asyncio
import gzip
import json

import httpx
import pytest
from click.testing import CliRunner

from k3.app import create_app
from k3.cassettes import load_cassettes, normalize, recording, replay
from k3.cli import main
from k3.config import Config
from k3.testing.fake_upstream import FakeUpstream, Reply, ToolCall

TOOLS = [{"name": "bash", "input_schema": {"type": "object"}}]


async def _record(directory, compress=False) -> None:
    fake = FakeUpstream()
    fake.push(
        Reply(reasoning="plan", content="Running.", tool_calls=[ToolCall("bash", '{"cmd":  "ls"}', id="c1")]),
        Reply(reasoning="plan", content="Running.", tool_calls=[ToolCall("bash", '{"cmd":  "ls"}', id="c1")]),
    )
    config = Config(upstream="http://fake/v1")
    app = recording(
        create_app(config, upstream_transport=httpx.ASGITransport(fake)), str(directory), config, compress
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://k3") as client:
        anthropic = {
            "model": "claude",
            "max_tokens": 64,
            "tools": TOOLS,
            "messages": [{"role": "user", "content": "ls"}],
        }
        secret = {"x-api-key": "sk-secret", "authorization": "Bearer sk-secret"}
        assert (await client.post("/v1/messages", json=anthropic, headers=secret)).status_code == 200
        assert (await client.post("/v1/messages", json={**anthropic, "stream": True})).status_code == 200
        chat = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        assert (await client.post("/v1/chat/completions", json=chat)).status_code == 200
        assert (await client.post("/v1/responses", json={"model": "m", "input": "hi"})).status_code == 200
        assert (await client.post("/v1/chat/completions", content=b"{not json")).status_code == 400
        assert (await client.get("/health")).status_code in (200, 503)  # not a turn: not recorded


@pytest.mark.parametrize("compress", [False, True])
async def test_every_turn_is_recorded_with_credentials_redacted_and_replays_identically(tmp_path, compress):
    await _record(tmp_path, compress)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) == 5 and all(f.endswith(".json.gz" if compress else ".json") for f in files)
    raw = b"".join(
        gzip.decompress(p.read_bytes()) if compress else p.read_bytes() for p in sorted(tmp_path.iterdir())
    )
    assert b"sk-secret" not in raw
    cassettes = load_cassettes(tmp_path)
    first = cassettes[0]
    assert first["request"]["headers"]["x-api-key"] == "<redacted>"
    assert first["upstream"]["request"]["model"] == "kimi-linear"
    assert first["upstream"]["response"]["choices"][0]["message"]["tool_calls"][0]["id"] == "c1"
    assert cassettes[1]["streamed"] and cassettes[1]["upstream"]["chunks"]
    assert cassettes[1]["client"]["sse"][0].startswith("event: message_start")
    assert cassettes[4]["client"]["status"] == 400 and cassettes[4]["request"]["raw"] == "{not json"
    for cassette in cassettes:
        assert await replay(cassette) == [], cassette["name"]


async def test_replay_reports_where_k3_now_differs(tmp_path):
    await _record(tmp_path)
    cassette = load_cassettes(tmp_path)[0]
    cassette["client"]["body"]["content"][1]["text"] = "Something else."
    cassette["upstream"]["request"]["max_tokens"] = 1
    diffs = await replay(cassette)
    assert any("content[1].text" in d for d in diffs) and any("max_tokens" in d for d in diffs)


def test_normalize_keeps_the_relations_between_ids():
    value = {"id": "a", "items": [{"call_id": "x", "created": 5}, {"tool_call_id": "x"}], "text": "a"}
    assert normalize(value) == {
        "id": "<id:1>",
        "items": [{"call_id": "<call_id:2>", "created": "<time>"}, {"tool_call_id": "<call_id:2>"}],
        "text": "a",
    }


def test_the_replay_command(tmp_path, monkeypatch):
    empty = CliRunner().invoke(main, ["replay", str(tmp_path / "none")])
    assert empty.exit_code == 1 and "no cassettes in" in empty.output
    asyncio.run(_record(tmp_path / "c"))
    monkeypatch.setenv("K3_STATE_DIR", str(tmp_path / "state"))
    result = CliRunner().invoke(main, ["replay", str(tmp_path / "c")])
    assert result.exit_code == 0, result.output
    assert "5/5 cassettes match" in result.output and result.output.count("pass ") == 5
    path = sorted((tmp_path / "c").iterdir())[0]
    cassette = json.loads(path.read_text())
    cassette["client"]["status"] = 201
    path.write_text(json.dumps(cassette))
    failed = CliRunner().invoke(main, ["replay", str(tmp_path / "c")])
    assert failed.exit_code == 1 and "FAIL" in failed.output and "4/5 cassettes match" in failed.output
