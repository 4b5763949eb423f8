"""Turning what a model wrote into a tool call's JSON argument string.

Where the model wrote JSON, the argument string is the model's own bytes (a raw span of its
output), never a re-serialisation.
"""

from __future__ import annotations

import json
import re
from typing import Any

_DECODER = json.JSONDecoder()
_WS = re.compile(r"[ \t\n\r]*")
# Deeply nested input makes the json module recurse; treat that like any other bad JSON.
JSON_ERRORS = (ValueError, RecursionError)


def is_json(text: str) -> bool:
    try:
        json.loads(text)
    except JSON_ERRORS:
        return False
    return True


def coerce_raw(text: str) -> str:
    """Arguments written as raw text: JSON is kept verbatim (outer whitespace trimmed).

    Empty means no arguments (`{}`); anything else is wrapped as `{"value": text}` so clients
    that parse arguments still get an object.
    """
    body = text.strip()
    if not body:
        return "{}"
    if is_json(body):
        return body
    return json.dumps({"value": body}, ensure_ascii=False)


def coerce_member(value: Any, raw: str) -> str:
    """Arguments given as a JSON member (`"arguments": …`): the raw span for JSON values, and a
    JSON-encoded string's contents treated like raw text."""
    if value is None:
        return "{}"
    if isinstance(value, str):
        return coerce_raw(value)
    return raw


def skip_ws(text: str, pos: int = 0) -> int:
    """The position after the JSON white space that starts at `pos`."""
    match = _WS.match(text, pos)
    assert match is not None  # the pattern matches the empty string
    return match.end()


def parse_members(text: str, pos: int) -> tuple[dict[str, tuple[Any, str]], int]:
    """Parse the JSON object starting at `text[pos]`, keeping each member's raw text.

    Returns ({key: (value, raw span)}, end). Raises ValueError on anything that is not an object.
    """
    if text[pos : pos + 1] != "{":
        raise ValueError("expected an object")
    members: dict[str, tuple[Any, str]] = {}
    pos = skip_ws(text, pos + 1)
    if text[pos : pos + 1] == "}":
        return members, pos + 1
    while True:
        if text[pos : pos + 1] != '"':
            raise ValueError("expected a key")
        key, pos = _DECODER.raw_decode(text, pos)
        pos = skip_ws(text, pos)
        if text[pos : pos + 1] != ":":
            raise ValueError("expected ':'")
        pos = skip_ws(text, pos + 1)
        value, end = _DECODER.raw_decode(text, pos)
        members[key] = (value, text[pos:end])
        pos = skip_ws(text, end)
        if text[pos : pos + 1] == ",":
            pos = skip_ws(text, pos + 1)
        elif text[pos : pos + 1] == "}":
            return members, pos + 1
        else:
            raise ValueError("expected ',' or '}'")


def call_from_members(members: dict[str, tuple[Any, str]]) -> tuple[str, str] | None:
    """(name, arguments) from a `{"name": …, "arguments"|"parameters": …}` object (or the OpenAI
    shape `{"type": "function", "function": {…}}`), else None."""
    nested = members.get("function")
    if nested and isinstance(nested[0], dict) and "name" not in members:
        return call_from_members(parse_members(nested[1], 0)[0])
    name = (members.get("name") or nested or (None, ""))[0]
    if not isinstance(name, str) or not name.strip():
        return None
    args = members.get("arguments") or members.get("parameters")
    return name.strip(), coerce_member(*args) if args else "{}"
