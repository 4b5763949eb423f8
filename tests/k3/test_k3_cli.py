"""The `k3` command line: presets, detect, doctor, serve's validation, and the docs agreeing with it."""

from __future__ import annotations

import json
import re
from pathlib import Path

from click.testing import CliRunner

from k3 import presets
from k3.cli import Duration, main

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures" / "client_requests.jsonl"


def run(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_help_lists_the_commands():
    out = run("--help").output
    for command in ("serve", "presets", "detect", "doctor"):
        assert command in out


def test_presets_table_and_verbose():
    out = run("presets").output
    assert all(p.name in out for p in presets.PRESETS)
    verbose = run("presets", "-v").output
    assert "ANTHROPIC_BASE_URL" in verbose and "wire_api" in verbose and "user-agent" in verbose


def test_detect_a_capture_file_and_hand_made_headers(tmp_path):
    requests = [json.loads(line) for line in FIXTURES.open()]
    codex = next(r for r in requests if r["client"] == "codex")
    capture = tmp_path / "codex.json"
    capture.write_text(json.dumps(codex))
    out = run("detect", str(capture)).output
    assert "-> codex" in out and "originator" in out
    out = run(
        "detect", "--path", "/v1/messages", "-H", "User-Agent: claude-cli/2.1.197 (external, sdk-cli)"
    ).output
    assert "-> claude-code" in out
    out = run("detect", "--path", "/v1/chat/completions").output
    assert "-> openai (route default)" in out
    bad = CliRunner().invoke(main, ["detect", "-H", "no-colon-here"])
    assert bad.exit_code == 2 and "Name: value" in bad.output


def test_serve_rejects_bad_options_before_binding():
    unknown = CliRunner().invoke(main, ["serve", "--client", "nope"])
    assert unknown.exit_code == 2 and "claude-code" in unknown.output
    parser = CliRunner().invoke(main, ["serve", "--tool-parser", "kimi_k9", "--port", "0"])
    assert parser.exit_code == 2 and "kimi_k3" in parser.output and "pythonic" in parser.output
    field = CliRunner().invoke(main, ["serve", "--reasoning-field", "<think>", "--port", "0"])
    assert field.exit_code == 2 and "think" in field.output and "inline" in field.output
    clash = CliRunner().invoke(
        main, ["serve", "--reasoning-field", "kimi_k3", "--tool-parser", "hermes", "--port", "0"]
    )
    assert clash.exit_code == 2 and "needs --tool-parser kimi_k3" in clash.output
    for flag, value in (("--ledger-ttl", "0"), ("--ledger-ttl", "7 weeks"), ("--ledger-max-entries", "0")):
        bad = CliRunner().invoke(main, ["serve", flag, value, "--port", "0"])
        assert bad.exit_code == 2 and flag in bad.output, (flag, value, bad.output)


def test_durations_take_units():
    duration = Duration()
    assert [duration.convert(v, None, None) for v in ("3600", "90m", "12h", "7d", "1.5h")] == [
        3600, 5400, 43200, 604800, 5400,
    ]  # fmt: skip


def test_doctor_against_a_live_engine_and_a_dead_one(live):
    fake, base_url = live
    ok = run("doctor", "--upstream", base_url, "--model", "kimi-linear")
    assert ok.exit_code == 0, ok.output
    assert "served" in ok.output and "vllm /tokenize" in ok.output and "streamed completion" in ok.output
    assert "ANTHROPIC_BASE_URL" in ok.output and "wire_api" in ok.output and "aider --model" in ok.output
    assert "opencode" in ok.output
    dead = run("doctor", "--upstream", "http://127.0.0.1:1/v1")
    assert dead.exit_code == 1 and "FAIL" in dead.output


def test_docs_mention_only_real_flags_and_presets():
    docs = (ROOT / "docs" / "K3.md").read_text()
    serve_help = run("serve", "--help").output
    for flag in set(re.findall(r"`(--[a-z-]+)", docs)):
        assert flag in serve_help or flag in run("doctor", "--help").output, flag
    for name in re.findall(r"`([a-z]+(?:-[a-z]+)?)` \(", docs):
        presets.get(name)
    for preset in presets.PRESETS:
        assert f"`{preset.name}`" in docs


def test_serve_refuses_a_ledger_or_state_dir_it_cannot_use(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    ledger = CliRunner().invoke(
        main, ["serve", "--port", "0", "--state-dir", str(tmp_path), "--ledger", str(blocker / "ledger.db")]
    )
    assert ledger.exit_code == 2 and "cannot open the reasoning ledger" in ledger.output
    state = CliRunner().invoke(main, ["serve", "--port", "0", "--state-dir", str(blocker)])
    assert state.exit_code == 2 and "--state-dir" in state.output
