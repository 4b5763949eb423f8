"""`--reasoning-field`: where the engine carries reasoning, both ways.

* `reasoning_content` / `reasoning`: a message (or delta) key of that name.
* `think` (alias `inline`): inline `<think>…</think>` at the start of `content` (split with
  `k3.tools.ThinkSplitter` on the way in).
* `kimi_k3`: the XTML think channel (split by the `kimi_k3` tool parser on the way in). Sent
  back as `reasoning_content`, which the K3 chat template renders into the think channel.
* `none`: the engine shows no reasoning; none is sent back.
* any other key name (`thinking`, ...): sent back under that message key (as the reference k3
  does); reading still uses `reasoning_content` / `reasoning`, the keys engines stream.

Stored turns keep reasoning apart from the visible text, so rendering for the engine happens at
restore time, in whatever mode is configured then.
"""

from __future__ import annotations

import copy
import re

REASONING_FIELDS = ("reasoning_content", "reasoning", "think", "kimi_k3", "none")
_KEYS = {"reasoning_content": "reasoning_content", "reasoning": "reasoning", "kimi_k3": "reasoning_content"}


_KEY_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


FIELD_ALIASES = {"inline": "think"}  # the reference k3's name


def check_field(field: str) -> str:
    """The canonical name of `field` (a known mode, an alias of one, or a message key name);
    else ValueError."""
    field = FIELD_ALIASES.get(field, field)
    if field not in REASONING_FIELDS and not _KEY_NAME.fullmatch(field):
        raise ValueError(
            f"unknown reasoning field {field!r}; choose one of: {', '.join(REASONING_FIELDS)}, "
            "or name a message key (letters, digits, _)"
        )
    return field


def detect_reasoning_field(delta: dict) -> str | None:
    """Which reasoning field an upstream delta (or message) uses for reasoning, if it shows one.

    For `--reasoning-field auto`: the first non-None answer in a stream decides.
    """
    for key in ("reasoning_content", "reasoning"):
        if isinstance(delta.get(key), str) and delta[key]:
            return key
    content = delta.get("content")
    if isinstance(content, str):
        head = content.lstrip()
        if head.startswith("<think>"):
            return "think"
        if head.startswith("<|open|>think"):
            return "kimi_k3"
    return None


def echoed_reasoning(message: dict) -> str:
    """Reasoning a client sent back on its own (Chat `reasoning_content` / `reasoning`)."""
    for key in ("reasoning_content", "reasoning"):
        if isinstance(message.get(key), str) and message[key]:
            return message[key]
    return ""


def render_upstream(record: dict, field: str) -> dict:
    """The OpenAI-Chat assistant message for the engine, from a stored turn record.

    A record is `{"content": str, "reasoning": str, "tool_calls": [...]}`, optionally with
    `"segments": [["reasoning" | "text", str], ...]` when reasoning and text interleaved; the
    `think` mode replays that order exactly, key modes can only hold one reasoning string.
    """
    content, reasoning = record.get("content") or "", record.get("reasoning") or ""
    message: dict = {"role": "assistant", "content": content}
    if field == "think" and reasoning:
        segments = record.get("segments") or [["reasoning", reasoning], ["text", content]]
        message["content"] = "".join(
            f"<think>{t}</think>" if kind == "reasoning" else t for kind, t in segments
        )
    elif field != "none" and reasoning:
        message[_KEYS.get(field, field)] = reasoning
    if record.get("tool_calls"):
        message["tool_calls"] = copy.deepcopy(record["tool_calls"])
    return message
