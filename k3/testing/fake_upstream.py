"""A scripted fake OpenAI Chat Completions engine (a real ASGI app) for tests and benchmarks.

    fake = FakeUpstream()
    fake.push(Reply(reasoning="think", tool_calls=[ToolCall("bash", '{"cmd": "ls"}')]))
    with serve_in_thread(fake) as base_url:   # http://127.0.0.1:PORT/v1
        ...  # point k3 at base_url; fake.requests holds every payload it received

Each POST `.../chat/completions` pops the next scripted `Reply` (or echoes the last user text
when the script is empty) and answers it as JSON or SSE, following the request's `stream`.
A Reply can also be an HTTP error (with extra headers), a slow stream, a stream cut short, a
stream that reports an error mid-way, or raw body pieces sent verbatim (bad wire data).
`GET .../models` lists the model. The tokenizer endpoints follow `tokenizer`: "vllm" answers
`POST /tokenize {messages}` with `{"count": N}`; "llama.cpp" serves
`POST /apply-template {messages} -> {prompt}` and `POST /tokenize {content} -> {tokens}`; None
serves neither. Every client disconnect during a stream is counted in `disconnects` and sets
`disconnected`, so a test can see the proxy close the connection.

The engine's own formats are scriptable: `Reply.reasoning_key` puts reasoning in a delta key
(`reasoning_content`, `reasoning`, any other name), inline in the content (`think`: `<think>…</think>`) or in the
Kimi K3 think channel (`kimi_k3`); `Reply.tool_format` sends tool calls natively (`native`) or
writes them into the content in a text format a `--tool-parser` reads (`kimi_k3`, `kimi`,
`hermes`, `json`, `pythonic`; for the last two the reply is the call list alone, so leave
`content` empty). `model_text(reply)` is the content the engine writes; `completion`, `chunks` and
`error_body` are its answers, which the conformance runner's upstream (runners/conformance/upstream.py)
plays to real clients too.
"""

from __future__ import annotations

import asyncio
import html
import json
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson

from common import listen
from k3.connection import Receive, Scope, Send
from k3.tokens import CHARS_PER_TOKEN, rough_tokens


@dataclass
class ToolCall:
    name: str
    arguments: str  # raw JSON text, streamed in slices as the model would
    id: str | None = None


@dataclass
class Reply:
    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None  # default: "tool_calls" when there are calls, else "stop"
    usage: bool = True  # send usage (always in JSON; in streams as the final chunk)
    # A delta key ("reasoning" for newer vLLM), or "think" (inline) / "kimi_k3" (XTML channel) in content.
    reasoning_key: str = "reasoning_content"
    tool_format: str = "native"  # or a text format: "kimi_k3", "kimi", "hermes", "json", "pythonic"
    stop_reason: str | None = None  # vLLM's matched stop string
    status: int = 200  # >= 400: answer with an error body instead
    error: str = "scripted upstream error"
    param: str | None = None  # the request field an error blames (OpenAI's `param`)
    chunk_chars: int = 8  # characters per streamed slice of text, reasoning and arguments
    delay: float = 0.0  # seconds before each streamed chunk (before the body, for JSON replies)
    cut_after: int | None = None  # end the stream after this many chunks: no finish, no [DONE]
    drop_after: int | None = None  # drop the connection after this many chunks (an engine crash)
    error_after: int | None = None  # after this many chunks send an {"error": ...} chunk and stop
    raw: list[bytes] | None = None  # stream exactly these body pieces, one read each (bad wire data)
    headers: dict[str, str] = field(default_factory=dict)  # extra response headers (e.g. Retry-After)

    def __post_init__(self) -> None:
        if self.tool_format not in TOOL_FORMATS:
            raise ValueError(
                f"unknown tool_format {self.tool_format!r}; choose one of: {', '.join(TOOL_FORMATS)}"
            )
        if self.tool_format in ("json", "pythonic") and self.content and self.tool_calls:
            raise ValueError(f"a {self.tool_format} reply is the calls alone; it cannot carry content too")

    def expected_call_id(self, index: int) -> str | None:
        """The id a proxy must give call `index` back to the engine, where the engine fixed one."""
        if self.tool_format == "native":
            return self.tool_calls[index].id or f"call_fake{index}"
        if self.tool_format == "kimi":
            return f"functions.{self.tool_calls[index].name}:{index}"
        return None  # minted by the proxy


IN_CONTENT = ("think", "kimi_k3")  # reasoning_key values that write reasoning into the content
TOOL_FORMATS = ("native", "kimi_k3", "kimi", "hermes", "json", "pythonic")


def _slices(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def _python_call(call: ToolCall) -> str:
    arguments = json.loads(call.arguments or "{}")
    return f"{call.name}({', '.join(f'{key}={value!r}' for key, value in arguments.items())})"


def _calls_text(calls: list[ToolCall], fmt: str) -> str:
    if not calls:
        return ""
    if fmt == "kimi_k3":  # the raw `json` element keeps the argument bytes
        return (
            "<|open|>tools<|sep|>"
            + "".join(
                f'<|open|>call tool="{html.escape(c.name)}" index="{i + 1}"<|sep|>'
                f'<|open|>json type="object"<|sep|>{c.arguments}<|close|>json<|sep|><|close|>call<|sep|>'
                for i, c in enumerate(calls)
            )
            + "<|close|>tools<|sep|>"
        )
    if fmt == "kimi":
        return (
            "<|tool_calls_section_begin|>"
            + "".join(
                f"<|tool_call_begin|>functions.{c.name}:{i}<|tool_call_argument_begin|>{c.arguments}<|tool_call_end|>"
                for i, c in enumerate(calls)
            )
            + "<|tool_calls_section_end|>"
        )
    objects = [f'{{"name": {json.dumps(c.name)}, "arguments": {c.arguments}}}' for c in calls]
    if fmt == "hermes":
        return "".join(f"<tool_call>{o}</tool_call>" for o in objects)
    if fmt == "json":
        return objects[0] if len(objects) == 1 else "[" + ", ".join(objects) + "]"
    if fmt == "pythonic":
        return "[" + ", ".join(_python_call(c) for c in calls) + "]"
    raise ValueError(f"unknown tool_format {fmt!r}; choose one of: {', '.join(TOOL_FORMATS)}")


def model_text(reply: Reply) -> str:
    """The content the engine writes: inline reasoning, the answer, then text-format tool calls."""
    head = ""
    if reply.reasoning and reply.reasoning_key == "think":
        head = f"<think>{reply.reasoning}</think>"
    elif reply.reasoning and reply.reasoning_key == "kimi_k3":
        head = f"<|open|>think<|sep|>{reply.reasoning}<|close|>think<|sep|>"
    calls = "" if reply.tool_format == "native" else _calls_text(reply.tool_calls, reply.tool_format)
    return head + reply.content + calls


def _native_calls(reply: Reply) -> list[ToolCall]:
    return reply.tool_calls if reply.tool_format == "native" else []


def usage(payload: dict[str, Any], reply: Reply) -> dict[str, Any]:
    """The engine's usage block: the plain four-characters-a-token count of what it read and wrote."""
    prompt = rough_tokens(len(orjson.dumps(payload.get("messages", []))))
    text = len(reply.content) + len(reply.reasoning) + sum(len(c.arguments) for c in reply.tool_calls)
    written = rough_tokens(text)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": written,
        "total_tokens": prompt + written,
        "prompt_tokens_details": {"cached_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": len(reply.reasoning) // CHARS_PER_TOKEN},
    }


def _finish(reply: Reply) -> str:
    return reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")


def completion(payload: dict[str, Any], reply: Reply, model: str) -> dict[str, Any]:
    """The engine's JSON answer (`model`: when the request names none)."""
    message: dict[str, Any] = {"role": "assistant", "content": model_text(reply) or None}
    if reply.reasoning and reply.reasoning_key not in IN_CONTENT:
        message[reply.reasoning_key] = reply.reasoning
    if _native_calls(reply):
        message["tool_calls"] = [
            {
                "id": c.id or f"call_fake{i}",
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for i, c in enumerate(reply.tool_calls)
        ]
    choice = {
        "index": 0,
        "message": message,
        "finish_reason": _finish(reply),
        "stop_reason": reply.stop_reason,
    }
    body = {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 0,
        "model": payload.get("model", model),
        "choices": [choice],
    }
    if reply.usage:
        body["usage"] = usage(payload, reply)
    return body


def chunks(payload: dict[str, Any], reply: Reply) -> list[dict[str, Any]]:
    """The engine's stream, one dict per SSE `data:` line (before `[DONE]`)."""
    head = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": payload.get("model"),
    }

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, **extra}]}

    out = [chunk({"role": "assistant", "content": ""})]
    if reply.reasoning_key not in IN_CONTENT:
        out += [chunk({reply.reasoning_key: s}) for s in _slices(reply.reasoning, reply.chunk_chars)]
    out += [chunk({"content": s}) for s in _slices(model_text(reply), reply.chunk_chars)]
    for i, call in enumerate(_native_calls(reply)):
        first = {
            "index": i,
            "id": call.id or f"call_fake{i}",
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        out.append(chunk({"tool_calls": [first]}))
        out += [
            chunk({"tool_calls": [{"index": i, "function": {"arguments": s}}]})
            for s in _slices(call.arguments, reply.chunk_chars)
        ]
    out.append(chunk({}, _finish(reply), stop_reason=reply.stop_reason))
    if reply.usage:
        out.append({**head, "choices": [], "usage": usage(payload, reply)})
    return out


def error_body(reply: Reply) -> dict[str, Any]:
    """vLLM's error answer for a scripted failure (OpenAI's `error` object, also at the top level)."""
    error = {
        "message": reply.error,
        "type": "BadRequestError" if reply.status < 500 else "InternalServerError",
        "code": reply.status,
        "param": reply.param,
    }
    return {"object": "error", **error, "error": error}


class FakeUpstream:
    def __init__(self, model: str = "kimi-linear", tokenizer: str | None = "vllm", name: str | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.name = name  # answered at GET /version when set (kimi-engine names itself there)
        self.script: deque[Reply] = deque()
        self.requests: list[dict[str, Any]] = []  # chat payloads, in arrival order
        self.request_headers: list[dict[str, str]] = []  # the headers of each, in the same order
        self.tokenize_requests: list[dict[str, Any]] = []
        self.disconnects = 0
        self.disconnected = threading.Event()
        self.chunks_sent = 0  # streamed chunks written, over all requests

    def push(self, *replies: Reply) -> None:
        self.script.extend(replies)

    def reset(self) -> None:
        self.script.clear()
        self.requests.clear()
        self.request_headers.clear()
        self.tokenize_requests.clear()
        self.disconnects = 0
        self.disconnected.clear()
        self.chunks_sent = 0

    # -- replies --------------------------------------------------------------------------------

    def _next_reply(self, payload: dict[str, Any]) -> Reply:
        if self.script:
            return self.script.popleft()
        last = ""
        for message in reversed(payload.get("messages") or []):
            if isinstance(message, dict) and message.get("role") == "user":
                content = message.get("content")
                last = content if isinstance(content, str) else orjson.dumps(content).decode()
                break
        return Reply(content=f"echo: {last}")

    def completion(self, payload: dict[str, Any], reply: Reply) -> dict[str, Any]:
        return completion(payload, reply, self.model)

    def chunks(self, payload: dict[str, Any], reply: Reply) -> list[dict[str, Any]]:
        return chunks(payload, reply)

    # -- ASGI -----------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if path.endswith("/chat/completions") and scope["method"] == "POST":
            payload = orjson.loads(body)
            self.requests.append(payload)
            self.request_headers.append({k.decode(): v.decode() for k, v in scope["headers"]})
            await self._chat(payload, receive, send)
        elif path.endswith("/models"):
            await self._json(
                send,
                200,
                {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "fake"}]},
            )
        elif path == "/version" and self.name is not None:
            await self._json(send, 200, {"name": self.name, "version": "0"})
        elif path in ("/tokenize", "/apply-template") and self.tokenizer is not None:
            request = orjson.loads(body)
            self.tokenize_requests.append(request)
            await self._json(send, 200, self._tokenizer_reply(path, request))
        else:
            await self._json(
                send, 404, {"error": {"message": f"no route {path}", "type": "not_found", "code": 404}}
            )

    def _tokenizer_reply(self, path: str, request: dict[str, Any]) -> dict[str, Any]:
        if self.tokenizer == "vllm":
            return {"count": rough_tokens(len(orjson.dumps(request.get("messages", []))))}
        if path == "/apply-template":  # llama.cpp
            return {
                "prompt": "".join(
                    f"<{m['role']}>{m.get('content') or ''}" for m in request.get("messages", [])
                )
            }
        return {"tokens": list(range(len(request.get("content", "")) // CHARS_PER_TOKEN))}

    async def _json(
        self, send: Any, status: int, body: dict[str, Any], extra: dict[str, str] | None = None
    ) -> None:
        raw = orjson.dumps(body)
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
        headers += [(k.lower().encode(), v.encode()) for k, v in (extra or {}).items()]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": raw})

    async def _chat(self, payload: dict[str, Any], receive: Any, send: Any) -> None:
        reply = self._next_reply(payload)
        if reply.status >= 400:
            return await self._json(send, reply.status, error_body(reply), reply.headers)
        if reply.raw is not None:
            return await self._raw(reply, send, bool(payload.get("stream")))
        if not payload.get("stream"):
            if reply.delay:
                await asyncio.sleep(reply.delay)
            return await self._json(send, 200, self.completion(payload, reply))
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        watcher = asyncio.ensure_future(self._watch(receive))
        try:
            for n, chunk in enumerate(self.chunks(payload, reply)):
                if reply.cut_after is not None and n >= reply.cut_after:
                    break
                if reply.drop_after is not None and n >= reply.drop_after:
                    return  # an unfinished response: the server closes the connection
                if reply.error_after is not None and n >= reply.error_after:
                    err = {"error": {"message": reply.error, "type": "InternalServerError", "code": 500}}
                    await send(
                        {
                            "type": "http.response.body",
                            "body": b"data: " + orjson.dumps(err) + b"\n\n",
                            "more_body": True,
                        }
                    )
                    break
                if reply.delay:
                    await asyncio.sleep(reply.delay)
                if watcher.done():
                    return  # the client went away: stop generating, as a real engine does
                await send(
                    {
                        "type": "http.response.body",
                        "body": b"data: " + orjson.dumps(chunk) + b"\n\n",
                        "more_body": True,
                    }
                )
                self.chunks_sent += 1
            else:
                await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            watcher.cancel()

    async def _raw(self, reply: Reply, send: Any, stream: bool) -> None:
        kind = b"text/event-stream" if stream else b"application/json"
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", kind)]})
        for piece in reply.raw or ():
            if reply.delay:
                await asyncio.sleep(reply.delay)
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _watch(self, receive: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.disconnects += 1
                self.disconnected.set()
                return


@contextmanager
def serve_in_thread(app: Any, host: str = "127.0.0.1", timeout_keep_alive: float = 5) -> Iterator[str]:
    """Serve an ASGI app with uvicorn in a daemon thread on an ephemeral port; yields `http://host:port/v1`.
    `timeout_keep_alive`: seconds before uvicorn closes an idle keep-alive connection."""
    with listen.serve_in_thread(app, host, timeout_keep_alive) as root:
        yield f"{root}/v1"
