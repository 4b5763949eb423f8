"""Fingerprint of what a client can see of an assistant turn: its text and its tool calls.

Used to find the stored turn when a client strips reasoning (and signatures). Only visible
output goes in, never reasoning, so it matches in every reasoning-field mode. Whitespace is
ignored entirely and argument JSON is compared by value (clients re-serialise it), so an echo
that re-indents, re-joins text blocks or reorders keys still matches.
"""

from __future__ import annotations

import hashlib
import json


def visible_text(content: object) -> str:
    """Text of a Chat `content`: a string, a list of parts (`text` fields joined), or None."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _squash(text: str) -> str:
    return "".join(text.split())


def _arguments_key(arguments: object) -> str:
    if not isinstance(arguments, str):
        value = arguments
    else:
        try:
            value = json.loads(arguments)
        except (ValueError, RecursionError):
            return _squash(arguments)
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return _squash(str(arguments))


def fingerprint(message: dict) -> str:
    """Hex SHA-256 over the squashed visible text, then each tool call's name and arguments."""
    digest = hashlib.sha256(_squash(visible_text(message.get("content"))).encode("utf-8", "surrogatepass"))
    for call in message.get("tool_calls") or []:
        fn = nested if isinstance(call, dict) and isinstance(nested := call.get("function"), dict) else {}
        name = named if isinstance(named := fn.get("name"), str) else ""
        digest.update(b"\0" + name.encode("utf-8", "surrogatepass"))
        digest.update(b"\0" + _arguments_key(fn.get("arguments", "")).encode("utf-8", "surrogatepass"))
    return digest.hexdigest()
