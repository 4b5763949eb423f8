"""A persistent ledger restores reasoning after the proxy process restarts."""

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

from k3.reasoning import ReasoningMemory, load_or_create_secret, session_key
from k3.reasoning.secret import SECRET_NAME

REPO = Path(__file__).resolve().parents[2]
FIRST_PROCESS = textwrap.dedent(
    """
    import json, sys
    from k3.reasoning import ReasoningMemory, session_key
    from k3.tools import Reasoning, Text, ToolCall
    memory = ReasoningMemory.open(sys.argv[1], reasoning_field="reasoning_content")
    turn = memory.begin_turn(session_key("Bearer local", "claude-code"))
    for event in (Reasoning("private plan"), Text("Running it."), ToolCall("call_7", "Bash", '{"command":  "ls -la"}')):
        turn.add(event)
    signature = turn.sign("private plan")
    turn.commit()
    print(json.dumps({"signature": signature}))
    """
)


def test_reasoning_survives_a_process_restart(tmp_path):
    path = str(tmp_path / "k3" / "ledger.sqlite")
    done = subprocess.run(
        [sys.executable, "-c", FIRST_PROCESS, path],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    signature = json.loads(done.stdout)["signature"]

    memory = ReasoningMemory.open(path)  # a fresh process would do exactly this
    client = {
        "role": "assistant",
        "content": "Running it.",
        "tool_calls": [
            {
                "id": "call_7",
                "type": "function",
                "function": {"name": "Bash", "arguments": '{"command": "ls -la"}'},
            }
        ],
    }
    expected = {
        "role": "assistant",
        "content": "Running it.",
        "reasoning_content": "private plan",
        "tool_calls": [
            {
                "id": "call_7",
                "type": "function",
                "function": {"name": "Bash", "arguments": '{"command":  "ls -la"}'},
            }
        ],
    }
    session = session_key("Bearer local", "claude-code")
    assert memory.restore(client, signature, session) == expected  # by the signature's entry id
    assert memory.restore(client, None, session) == expected  # by fingerprint, for stripping clients
    secret = tmp_path / "k3" / SECRET_NAME
    assert stat.S_IMODE(os.stat(secret).st_mode) == 0o600


def test_secret_is_created_once_and_shared(tmp_path):
    first = load_or_create_secret(str(tmp_path / "d"))
    assert len(first) == 32 and load_or_create_secret(str(tmp_path / "d")) == first
    assert [p.name for p in (tmp_path / "d").iterdir()] == [SECRET_NAME]  # no temp files left behind


def test_in_memory_memory_with_a_secret_dir_keeps_signatures_valid_across_restarts(tmp_path):
    session = session_key("k")
    first = ReasoningMemory.open(secret_dir=str(tmp_path))
    signature = first.begin_turn(session).sign("kept in the signature")
    second = ReasoningMemory.open(secret_dir=str(tmp_path))
    restored = second.restore({"role": "assistant", "content": "x"}, signature, session)
    assert restored["reasoning_content"] == "kept in the signature"
    third = ReasoningMemory.open()  # no secret dir: a per-process secret, old signatures are ignored
    assert "reasoning_content" not in third.restore({"role": "assistant", "content": "x"}, signature, session)
