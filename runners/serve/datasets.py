"""What the serving benchmark sends: random prompts of fixed length, coding-agent traces, or a JSONL file.

- `random`: `input_len` random common English words a prompt (about one BPE token each; a different
  prompt every request, and new ones for every endpoint, dialect and level, so no prefix cache helps),
  `output_len` tokens asked for.
- `agent`: the requests real coding agents sent (Claude Code, Codex, opencode, aider: captured in
  shared/reference/clients and rebuilt into tests/k3/fixtures/client_requests.jsonl), in the dialect
  each client speaks, with their system prompts, tools and multi-turn histories in order, so the
  endpoint sees long prompts whose prefixes repeat from turn to turn. The captures elide long texts
  (`<elided: N chars …>`, `…[truncated: N chars total]`); each is restored to N characters of fixed
  filler text, the same filler for the same length, so the prompt sizes and their shared prefixes are
  the captured ones.
- `jsonl`: one object a line: `{"body": {...}}` (a request body in the endpoint's dialect),
  `{"messages": [...]}` (Chat-shaped messages) or `{"prompt": "..."}`; an optional `max_tokens`.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

from harness.hardware import REPO_ROOT
from runners.serve.dialects import body_from_messages

DATASETS = ("random", "agent", "jsonl")
TRACES = REPO_ROOT / "tests" / "k3" / "fixtures" / "client_requests.jsonl"
CAPTURED_DIALECT = {"chat": "openai_chat", "anthropic": "anthropic_messages", "responses": "openai_responses"}
ELIDED = re.compile(r"<elided: (\d+) chars[^>]*>|\.\.\.\[truncated: (\d+) chars total\]")
WORDS = ("the of and to in is that for it as with was on be by at this are from or have an they which one "
         "you had not but what all were when we there can more if out so said time about than into them "
         "only some could new other then do its like also after first well way even because any these "
         "model token cache query value layer state file code test patch shell build").split()  # fmt: skip


@dataclass(frozen=True)
class Request:
    """One request of a dataset: the body to send (before model/stream/max tokens are set) and where it
    came from."""

    body: dict
    source: str


def random_prompts(dialect: str, count: int, input_len: int, output_len: int, seed: int) -> list[Request]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        prompt = " ".join(rng.choice(WORDS) for _ in range(input_len))
        body = body_from_messages(dialect, "", [{"role": "user", "content": prompt}], output_len)
        out.append(Request(body, f"random/{i}"))
    return out


def _filler(chars: int) -> str:
    rng = random.Random(chars)  # the same length gets the same text: prefixes repeat as they did
    words, size = [], 0
    while size < chars:
        words.append(rng.choice(WORDS))
        size += len(words[-1]) + 1
    return " ".join(words)[:chars]


def _restore(value):
    if isinstance(value, str):
        return ELIDED.sub(lambda m: _filler(int(m.group(1) or m.group(2))), value)
    if isinstance(value, list):
        return [_restore(v) for v in value]
    if isinstance(value, dict):
        return {k: _restore(v) for k, v in value.items()}
    return value


def agent_traces(dialect: str, path: Path = TRACES) -> list[Request]:
    """Every captured streamed request of the coding agents that speak `dialect`, in capture order."""
    wanted = CAPTURED_DIALECT[dialect]
    out = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if (
            row["method"] != "POST"
            or row["dialect"] != wanted
            or not row["captured_reply"].startswith("sse/")
        ):
            continue
        if row["client"].startswith("sdk-"):
            continue  # the SDK smoke requests are not agent traffic
        source = f"{row['client']} {row['version']}/{row['scenario']}/{row['seq']}"
        out.append(Request(_restore(row["body"]), source))
    if not out:
        raise ValueError(f"{path} holds no streamed agent requests in the {dialect} dialect")
    return out


def jsonl_requests(dialect: str, path: Path, output_len: int) -> list[Request]:
    out = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: not JSON ({exc})") from None
        max_tokens = int(row.get("max_tokens", output_len)) if isinstance(row, dict) else output_len
        if isinstance(row, dict) and isinstance(row.get("body"), dict):
            body = row["body"]
        elif isinstance(row, dict) and isinstance(row.get("messages"), list):
            body = body_from_messages(dialect, "", row["messages"], max_tokens)
        elif isinstance(row, dict) and isinstance(row.get("prompt"), str):
            body = body_from_messages(dialect, "", [{"role": "user", "content": row["prompt"]}], max_tokens)
        else:
            raise ValueError(f'{path}:{number}: expected an object with "body", "messages" or "prompt"')
        out.append(Request(body, f"{path.name}:{number}"))
    if not out:
        raise ValueError(f"{path} holds no requests")
    return out


def load(name: str, dialect: str, *, count: int, input_len: int, output_len: int, seed: int,
         path: Path | None) -> list[Request]:  # fmt: skip
    """The requests of dataset `name` (cycled by the driver when it needs more)."""
    if name == "random":
        return random_prompts(dialect, count, input_len, output_len, seed)
    if name == "agent":
        return agent_traces(dialect, path or TRACES)
    if path is None:
        raise ValueError("the jsonl dataset needs --dataset-path FILE")
    return jsonl_requests(dialect, path, output_len)
