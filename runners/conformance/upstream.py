"""The scripted upstream: a real OpenAI Chat engine on 127.0.0.1 that plays scripted turns.

    upstream = ScriptedUpstream()
    with serve_in_thread(upstream.app) as root:          # k3 --upstream {root}/v1
        upstream.play([Reply(reasoning="r", calls=(Call("bash", '{"command": "ls"}'),)), Reply(text="done")])
        ...                                               # run a client through k3
        upstream.agent_requests()                         # every agent payload k3 sent, in order

Each agent request (`POST /v1/chat/completions`) gets the next scripted `Reply`, as JSON or as
SSE following the request's `stream`. A reply can carry reasoning in any engine vehicle (the
`reasoning_content` or `reasoning` key, inline `<think>`, the Kimi K3 think channel), tool calls
as native `tool_calls` or written in the text in any format k3 parses (Kimi K3 XTML, Kimi K2
tokens, Hermes, JSON, Pythonic), or an HTTP error. Requests a client makes on the side (titles,
summaries) are told apart by `side_when_no_tools` and get a short fixed answer, so their timing
cannot shift the script. `GET /v1/models` and vLLM's `POST /tokenize` are answered too. Every
request is recorded with its headers and body.
"""

from __future__ import annotations

import html
import json
import threading
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

MODEL = "kimi-linear"
TOOL_FORMATS = ("native", "kimi_k3", "kimi", "hermes", "json", "pythonic")
REASONING_FIELDS = ("reasoning_content", "reasoning", "think", "kimi_k3")
SIDE_ANSWER = '{"title": "k3 conformance"}'  # valid both as a plain title and as Claude Code's JSON title
SLICE_CHARS = 7  # characters per streamed delta: several deltas even for short texts

# Kimi K3 XTML and Kimi K2 control tokens (see k3/tools/kimi_k3.py and kimi_k2.py).
K3_OPEN, K3_CLOSE, K3_SEP = "<|open|>", "<|close|>", "<|sep|>"
K2_SECTION_BEGIN, K2_SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
K2_CALL_BEGIN, K2_ARG_BEGIN, K2_CALL_END = (
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
)


@dataclass(frozen=True)
class Call:
    name: str
    arguments: str  # the model's raw JSON text; k3 must hand these bytes back on the next turn
    id: str = "call_k3conf0"


@dataclass(frozen=True)
class Reply:
    text: str = ""
    reasoning: str = ""
    calls: tuple[Call, ...] = ()
    tool_format: str = "native"
    reasoning_field: str = "reasoning_content"
    status: int = 200  # >= 400: an OpenAI-shaped error whose message is `text`

    def __post_init__(self) -> None:
        if self.tool_format not in TOOL_FORMATS:
            raise ValueError(f"unknown tool format {self.tool_format!r}; one of {', '.join(TOOL_FORMATS)}")
        if self.reasoning_field not in REASONING_FIELDS:
            raise ValueError(f"unknown reasoning field {self.reasoning_field!r}")
        if self.reasoning_field == "kimi_k3" and self.tool_format != "kimi_k3":
            raise ValueError("the kimi_k3 think channel is only written with the kimi_k3 tool format")
        if self.tool_format in ("json", "pythonic") and self.text and self.calls:
            raise ValueError(f"a {self.tool_format} reply is the calls alone; it cannot carry text too")

    def expected_call_id(self, index: int) -> str | None:
        """The id k3 must give the call back upstream, where the engine fixed one."""
        if self.tool_format == "native":
            return self.calls[index].id
        if self.tool_format == "kimi":
            return f"functions.{self.calls[index].name}:{index}"
        return None  # minted by k3

    def content(self) -> str:
        """The message content as the engine writes it: inline reasoning, text, text-format calls."""
        think = (
            f"<think>{self.reasoning}</think>" if self.reasoning and self.reasoning_field == "think" else ""
        )
        return think + _RENDER[self.tool_format](self)

    def reasoning_key(self) -> str | None:
        if self.reasoning and self.reasoning_field in ("reasoning_content", "reasoning"):
            return self.reasoning_field
        return None


def _native(reply: Reply) -> str:
    return reply.text


def _kimi_k3(reply: Reply) -> str:
    out = []
    if reply.reasoning and reply.reasoning_field == "kimi_k3":
        out.append(f"{K3_OPEN}think{K3_SEP}{reply.reasoning}{K3_CLOSE}think{K3_SEP}")
    if reply.text:
        out.append(f"{K3_OPEN}response{K3_SEP}{reply.text}{K3_CLOSE}response{K3_SEP}")
    if reply.calls:
        calls = "".join(
            f'{K3_OPEN}call tool="{html.escape(c.name)}" index="{i}"{K3_SEP}'
            f'{K3_OPEN}json type="object"{K3_SEP}{c.arguments}{K3_CLOSE}json{K3_SEP}{K3_CLOSE}call{K3_SEP}'
            for i, c in enumerate(reply.calls, 1)
        )
        out.append(f"{K3_OPEN}tools{K3_SEP}{calls}{K3_CLOSE}tools{K3_SEP}")
    return "".join(out)


def _kimi_k2(reply: Reply) -> str:
    if not reply.calls:
        return reply.text
    calls = "".join(
        f"{K2_CALL_BEGIN}functions.{c.name}:{i}{K2_ARG_BEGIN}{c.arguments}{K2_CALL_END}"
        for i, c in enumerate(reply.calls)
    )
    return f"{reply.text}{K2_SECTION_BEGIN}{calls}{K2_SECTION_END}"


def _hermes(reply: Reply) -> str:
    calls = "".join(
        f'<tool_call>{{"name": {json.dumps(c.name)}, "arguments": {c.arguments}}}</tool_call>'
        for c in reply.calls
    )
    return reply.text + calls


def _json_calls(reply: Reply) -> str:
    if not reply.calls:
        return reply.text
    calls = [f'{{"name": {json.dumps(c.name)}, "arguments": {c.arguments}}}' for c in reply.calls]
    return calls[0] if len(calls) == 1 else "[" + ", ".join(calls) + "]"


def _pythonic(reply: Reply) -> str:
    if not reply.calls:
        return reply.text
    rendered = []
    for c in reply.calls:
        kwargs = ", ".join(f"{k}={v!r}" for k, v in json.loads(c.arguments).items())
        rendered.append(f"{c.name}({kwargs})")
    return "[" + ", ".join(rendered) + "]"


_RENDER = {
    "native": _native,
    "kimi_k3": _kimi_k3,
    "kimi": _kimi_k2,
    "hermes": _hermes,
    "json": _json_calls,
    "pythonic": _pythonic,
}


@dataclass
class Exchange:
    """One request the upstream received, and which part of the script answered it."""

    kind: str  # agent | side | models | tokenize | unknown
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    turn: int | None = None  # agent requests: the index of the scripted reply (None: script ran out)


@dataclass
class _Script:
    replies: list[Reply] = field(default_factory=list)
    side_when_no_tools: bool = False
    played: int = 0


class ScriptedUpstream:
    """The engine side of a conformance run. Thread-safe: uvicorn serves it from its own thread."""

    def __init__(self, model: str = MODEL):
        self.model = model
        self._lock = threading.Lock()
        self._script = _Script()
        self.exchanges: list[Exchange] = []
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/tokenize", self._tokenize, methods=["POST"]),
                Route("/{path:path}", self._unknown, methods=["GET", "POST", "HEAD", "PUT", "DELETE"]),
            ]
        )

    def play(self, replies: list[Reply], *, side_when_no_tools: bool = False) -> None:
        """Start a new script (and a new record). With `side_when_no_tools`, a chat request without
        tools is a side request (a title, a summary) and does not consume the script."""
        with self._lock:
            self._script = _Script(list(replies), side_when_no_tools)
            self.exchanges = []

    def agent_requests(self) -> list[Exchange]:
        with self._lock:
            return [e for e in self.exchanges if e.kind == "agent"]

    def unplayed(self) -> int:
        with self._lock:
            return len(self._script.replies) - self._script.played

    # -- routes ---------------------------------------------------------------------------------

    async def _record(self, request: Request, kind: str) -> Exchange:
        raw = await request.body()
        try:
            body = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            body = raw.decode("utf-8", "replace")
        exchange = Exchange(kind, request.method, request.url.path, dict(request.headers), body)
        with self._lock:
            self.exchanges.append(exchange)
        return exchange

    async def _chat(self, request: Request) -> Response:
        exchange = await self._record(request, "agent")
        payload = exchange.body if isinstance(exchange.body, dict) else {}
        with self._lock:
            script = self._script
            if script.side_when_no_tools and not payload.get("tools"):
                exchange.kind = "side"
                reply = Reply(text=SIDE_ANSWER)
            elif script.played < len(script.replies):
                exchange.turn = script.played
                reply = script.replies[script.played]
                script.played += 1
            elif script.replies and script.replies[-1].status >= 400:
                # Nothing follows a scripted failure but the client retrying it (opencode does, now
                # and then, even for a 400): the same turn, the same failure.
                exchange.turn = script.played - 1
                reply = script.replies[-1]
            else:
                reply = Reply(
                    text=f"k3 conformance: unexpected agent request #{script.played + 1}: "
                    f"the script has {len(script.replies)} turn(s)",
                    status=400,
                )
        if reply.status >= 400:
            kind = "invalid_request_error" if reply.status < 500 else "server_error"
            error = {"message": reply.text, "type": kind, "param": None, "code": None}
            return JSONResponse({"error": error}, status_code=reply.status)
        if payload.get("stream"):
            usage = bool((payload.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(_sse(self.model, reply, usage), media_type="text/event-stream")
        return Response(orjson.dumps(_completion(self.model, reply)), media_type="application/json")

    async def _models(self, request: Request) -> Response:
        await self._record(request, "models")
        return JSONResponse(
            {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "k3-conformance"}]}
        )

    async def _tokenize(self, request: Request) -> Response:
        exchange = await self._record(request, "tokenize")
        body = exchange.body if isinstance(exchange.body, dict) else {}
        count = max(1, len(orjson.dumps(body.get("messages") or body.get("prompt") or "")) // 4)
        return JSONResponse({"count": count, "max_model_len": 131072, "tokens": list(range(count))})

    async def _unknown(self, request: Request) -> Response:
        await self._record(request, "unknown")
        error = {"message": f"no route {request.method} {request.url.path}", "type": "not_found"}
        return JSONResponse({"error": error}, status_code=404)


# -- answers ------------------------------------------------------------------------------------


def _usage(reply: Reply) -> dict[str, int]:
    completion = max(1, (len(reply.content()) + len(reply.reasoning)) // 4)
    return {"prompt_tokens": 100, "completion_tokens": completion, "total_tokens": 100 + completion}


def _finish(reply: Reply) -> str:
    return "tool_calls" if reply.calls and reply.tool_format == "native" else "stop"


def _native_calls(reply: Reply) -> list[dict[str, Any]]:
    return [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in reply.calls
    ]


def _completion(model: str, reply: Reply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content() or None}
    if key := reply.reasoning_key():
        message[key] = reply.reasoning
    if reply.calls and reply.tool_format == "native":
        message["tool_calls"] = _native_calls(reply)
    return {
        "id": "chatcmpl-k3conformance",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": _finish(reply)}],
        "usage": _usage(reply),
    }


def _slices(text: str) -> list[str]:
    return [text[i : i + SLICE_CHARS] for i in range(0, len(text), SLICE_CHARS)]


async def _sse(model: str, reply: Reply, include_usage: bool):
    head = {"id": "chatcmpl-k3conformance", "object": "chat.completion.chunk", "created": 0, "model": model}

    def frame(delta: dict[str, Any], finish: str | None = None) -> bytes:
        chunk = {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return b"data: " + orjson.dumps(chunk) + b"\n\n"

    yield frame({"role": "assistant", "content": ""})
    if key := reply.reasoning_key():
        for piece in _slices(reply.reasoning):
            yield frame({key: piece})
    for piece in _slices(reply.content()):
        yield frame({"content": piece})
    if reply.tool_format == "native":
        for i, call in enumerate(reply.calls):
            start = {
                "index": i,
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": ""},
            }
            yield frame({"tool_calls": [start]})
            for piece in _slices(call.arguments):
                yield frame({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
    yield frame({}, _finish(reply))
    if include_usage:
        yield b"data: " + orjson.dumps({**head, "choices": [], "usage": _usage(reply)}) + b"\n\n"
    yield b"data: [DONE]\n\n"
