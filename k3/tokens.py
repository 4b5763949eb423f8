"""Token estimates where the engine gives no count: four characters a token.

`estimate` is the prompt size for `/v1/messages/count_tokens` when the engine has no tokenizer endpoint.

The estimate is ceil(characters / 4) over every text the engine would read (message contents,
reasoning, tool-call names and arguments, tool results, tool definitions as JSON), plus 4 per
message for the chat template's role markers, plus a flat 768 per image. It is at least 1.
"""

from __future__ import annotations

from typing import Any

import orjson

CHARS_PER_TOKEN = 4
PER_MESSAGE = 4
PER_IMAGE = 768


def rough_tokens(chars: int) -> int:
    """Tokens in a text of `chars` characters by the plain rule (chars / 4, rounded down), at least 1."""
    return max(1, chars // CHARS_PER_TOKEN)


def _chars(content: Any) -> tuple[int, int]:
    """-> (characters of text, number of images) of a Chat message content."""
    if isinstance(content, str):
        return len(content), 0
    chars = images = 0
    if isinstance(content, list):
        for part in content:
            if isinstance(part, dict):
                if part.get("type") == "image_url":
                    images += 1
                elif isinstance(part.get("text"), str):
                    chars += len(part["text"])
    return chars, images


def estimate(payload: dict[str, Any]) -> int:
    chars = images = 0
    messages = payload.get("messages", [])
    for message in messages:
        text, pictures = _chars(message.get("content"))
        chars += text
        images += pictures
        for key, value in message.items():
            if key not in ("role", "content", "tool_calls", "tool_call_id") and isinstance(value, str):
                chars += len(value)  # reasoning under whatever field name
        for call in message.get("tool_calls") or ():
            function = call["function"]
            chars += len(function["name"]) + len(function["arguments"])
    if payload.get("tools"):
        chars += len(orjson.dumps(payload["tools"]))
    tokens = -(-chars // CHARS_PER_TOKEN) + PER_MESSAGE * len(messages) + PER_IMAGE * images
    return max(1, tokens)
