"""The three wire dialects the serving benchmark speaks: where a turn goes, how its body is built from
plain messages, and what each streamed event carries.

Every streamed event becomes zero or more `Piece`s: `visible` (answer text or tool-call arguments: what a
user or an agent sees) or `reasoning` (thinking / reasoning deltas), each with its text. The endpoint's
token counts (usage) and in-stream errors are read from the same events.
"""

from __future__ import annotations

from dataclasses import dataclass

DIALECTS = ("chat", "anthropic", "responses")
ROUTES = {"chat": "/v1/chat/completions", "anthropic": "/v1/messages", "responses": "/v1/responses"}
# The key a body caps its output length with.
MAX_TOKENS_KEY = {"chat": "max_tokens", "anthropic": "max_tokens", "responses": "max_output_tokens"}


@dataclass(frozen=True)
class Piece:
    kind: str  # "visible" or "reasoning"
    text: str


@dataclass(frozen=True)
class Usage:
    input_tokens: int | None = None
    output_tokens: int | None = None


def headers(dialect: str, api_key: str | None) -> dict[str, str]:
    """Request headers: JSON in, SSE out, and the credential each dialect's clients send."""
    out = {"content-type": "application/json", "accept": "text/event-stream"}
    if dialect == "anthropic":
        out["anthropic-version"] = "2023-06-01"
        if api_key:
            out["x-api-key"] = api_key
    elif api_key:
        out["authorization"] = f"Bearer {api_key}"
    return out


def body_from_messages(dialect: str, model: str, messages: list[dict], max_tokens: int) -> dict:
    """A streamed request of `messages` (Chat shape: role system/user/assistant, string content)."""
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    turns = [m for m in messages if m["role"] != "system"]
    if dialect == "chat":
        return {"model": model, "messages": messages, "max_tokens": max_tokens, "stream": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
    if dialect == "anthropic":
        body = {"model": model, "messages": turns, "max_tokens": max_tokens, "stream": True}
        return body | ({"system": system} if system else {})
    body = {"model": model, "input": turns, "max_output_tokens": max_tokens, "stream": True, "store": False}
    return body | ({"instructions": system} if system else {})


def prepare_body(
    dialect: str, body: dict, model: str, max_tokens: int | None, ignore_eos: bool = False
) -> dict:
    """A dataset's body made ready to send: this model, streamed, usage asked for, output capped, and
    vLLM's `ignore_eos` (also SGLang's, llama-server's and our engine's) when asked for."""
    out = dict(body) | {"model": model, "stream": True} | ({"ignore_eos": True} if ignore_eos else {})
    if dialect == "chat":
        out["stream_options"] = {"include_usage": True}
    if max_tokens is not None:
        key = MAX_TOKENS_KEY[dialect]
        out[key] = min(max_tokens, out.get(key) or max_tokens)
    return out


def pieces(dialect: str, event: dict) -> list[Piece]:
    """The text one streamed event carries."""
    return _PIECES[dialect](event)


def _chat_pieces(event: dict) -> list[Piece]:
    out = []
    for choice in event.get("choices") or []:
        delta = choice.get("delta") or {}
        # vLLM and SGLang name it reasoning_content (older) or reasoning (newer); either is thinking.
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if reasoning:
            out.append(Piece("reasoning", reasoning))
        if delta.get("content"):
            out.append(Piece("visible", delta["content"]))
        for call in delta.get("tool_calls") or []:
            function = call.get("function") or {}
            text = (function.get("name") or "") + (function.get("arguments") or "")
            if text:
                out.append(Piece("visible", text))
    return out


def _anthropic_pieces(event: dict) -> list[Piece]:
    if event.get("type") != "content_block_delta":
        return []
    delta = event.get("delta") or {}
    kind = delta.get("type")
    if kind == "text_delta" and delta.get("text"):
        return [Piece("visible", delta["text"])]
    if kind == "input_json_delta" and delta.get("partial_json"):
        return [Piece("visible", delta["partial_json"])]
    if kind == "thinking_delta" and delta.get("thinking"):
        return [Piece("reasoning", delta["thinking"])]
    return []


RESPONSES_VISIBLE = ("response.output_text.delta", "response.function_call_arguments.delta",
                     "response.custom_tool_call_input.delta", "response.refusal.delta")  # fmt: skip
RESPONSES_REASONING = ("response.reasoning_text.delta", "response.reasoning_summary_text.delta")


def _responses_pieces(event: dict) -> list[Piece]:
    kind, delta = event.get("type"), event.get("delta")
    if not isinstance(delta, str) or not delta:
        return []
    if kind in RESPONSES_VISIBLE:
        return [Piece("visible", delta)]
    if kind in RESPONSES_REASONING:
        return [Piece("reasoning", delta)]
    return []


_PIECES = {"chat": _chat_pieces, "anthropic": _anthropic_pieces, "responses": _responses_pieces}


def usage(dialect: str, event: dict) -> Usage | None:
    """Token counts an event reports, when it reports any (Anthropic splits them over two events)."""
    if dialect == "chat":
        found = event.get("usage")
        if isinstance(found, dict):
            return Usage(found.get("prompt_tokens"), found.get("completion_tokens"))
    elif dialect == "anthropic":
        found = (event.get("message") or {}).get("usage") if event.get("type") == "message_start" else None
        found = found or (event.get("usage") if event.get("type") == "message_delta" else None)
        if isinstance(found, dict):
            return Usage(found.get("input_tokens"), found.get("output_tokens"))
    elif event.get("type") in ("response.completed", "response.incomplete"):
        found = (event.get("response") or {}).get("usage")
        if isinstance(found, dict):
            return Usage(found.get("input_tokens"), found.get("output_tokens"))
    return None


def error(dialect: str, event: dict) -> str | None:
    """The message of an error reported inside the stream (after a 200), or None."""
    err = event.get("error")
    if isinstance(err, dict | str) and err:
        return str(err.get("message") or err) if isinstance(err, dict) else err
    if event.get("type") == "error":  # Responses: the message at the top level
        return str(event.get("message") or "error event")
    if dialect == "responses" and event.get("type") == "response.failed":
        err = (event.get("response") or {}).get("error") or {}
        return str(err.get("message") or "response.failed")
    return None


def finished(dialect: str, event: dict) -> bool:
    """Whether this event ends the turn (a chat stream may also end with `data: [DONE]`; its usage chunk
    comes after the finish_reason, so the client reads on to the end of the body either way)."""
    if dialect == "chat":
        return any(choice.get("finish_reason") for choice in event.get("choices") or [])
    if dialect == "anthropic":
        return event.get("type") == "message_stop"
    return event.get("type") in ("response.completed", "response.incomplete", "response.failed")
