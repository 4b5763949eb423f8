"""The scripted upstream: a real OpenAI Chat engine on 127.0.0.1 that plays scripted turns.

    upstream = ScriptedUpstream()
    with serve_in_thread(upstream.app) as root:          # k3 --upstream {root}/v1
        upstream.play([Reply(reasoning="r", tool_calls=[ToolCall("bash", '{"command": "ls"}')]),
                       Reply(content="done")])
        ...                                               # run a client through k3
        upstream.agent_requests()                         # every agent payload k3 sent, in order

The replies are the test suite's (`k3.testing.fake_upstream.Reply`), written as the fake engine writes
them: reasoning in any engine reasoning field, tool calls native or in any text format k3 parses, or an
HTTP error. What this adds for a run of a real client: each agent request (`POST
/v1/chat/completions`) gets the next scripted reply, as JSON or SSE following the request's
`stream`; requests a client makes on the side (titles, summaries) are told apart by
`side_when_no_tools` and get a short fixed answer, so their timing cannot shift the script; a
retried failure gets the same failure; every request is recorded with its headers and body. `GET
/v1/models` and vLLM's `POST /tokenize` are answered too.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from k3.testing.fake_upstream import Reply, chunks, completion, error_body
from k3.tokens import rough_tokens

MODEL = "kimi-linear"
SIDE_ANSWER = '{"title": "k3 conformance"}'  # valid both as a plain title and as Claude Code's JSON title


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
                reply = Reply(content=SIDE_ANSWER)
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
                    status=400,
                    error=f"k3 conformance: unexpected agent request #{script.played + 1}: "
                    f"the script has {len(script.replies)} turn(s)",
                )
        if reply.status >= 400:
            return JSONResponse(error_body(reply), status_code=reply.status)
        if payload.get("stream"):
            usage = bool((payload.get("stream_options") or {}).get("include_usage"))
            frames = chunks(payload, dataclasses.replace(reply, usage=usage))
            return StreamingResponse(_sse(frames), media_type="text/event-stream")
        return Response(orjson.dumps(completion(payload, reply, self.model)), media_type="application/json")

    async def _models(self, request: Request) -> Response:
        await self._record(request, "models")
        return JSONResponse(
            {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "k3-conformance"}]}
        )

    async def _tokenize(self, request: Request) -> Response:
        exchange = await self._record(request, "tokenize")
        body = exchange.body if isinstance(exchange.body, dict) else {}
        count = rough_tokens(len(orjson.dumps(body.get("messages") or body.get("prompt") or "")))
        return JSONResponse({"count": count, "max_model_len": 131072, "tokens": list(range(count))})

    async def _unknown(self, request: Request) -> Response:
        await self._record(request, "unknown")
        error = {"message": f"no route {request.method} {request.url.path}", "type": "not_found"}
        return JSONResponse({"error": error}, status_code=404)


async def _sse(frames: list[dict[str, Any]]):
    for frame in frames:
        yield b"data: " + orjson.dumps(frame) + b"\n\n"
    yield b"data: [DONE]\n\n"
