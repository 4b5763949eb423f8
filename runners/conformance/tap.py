"""A recording pass-through between a client and k3, so a run can show every request the client made.

Clients make calls k3 answers itself (model lists, token counts, `HEAD /` probes), and those never
reach the upstream. The tap forwards every request unchanged and streams every answer back as it
arrives, noting method, path, status, the SSE event names (or chunk count) and, for errors, the
body: enough to name the first wrong request or event of a run.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import httpx
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

_HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}
_OWN_HEADERS = {"date", "server"}  # the tap's server sets its own
_ERROR_KEEP = 2000  # characters of an error body kept for the report


@dataclass
class Hit:
    method: str
    path: str  # with the query string
    status: int = 0
    content_type: str = ""
    events: list[str] = field(default_factory=list)  # SSE `event:` names, or "data" per unnamed frame
    error_body: str = ""  # the first characters of a non-2xx body
    seconds: float = 0.0

    def line(self) -> str:
        summary = f"{self.method} {self.path} -> {self.status}"
        if self.events:
            summary += f" (SSE, {len(self.events)} frames)"
        if self.error_body:
            summary += f": {self.error_body[:300]}"
        return summary


class _SSEEvents:
    """Collects event names from an SSE byte stream split at arbitrary points."""

    def __init__(self, into: list[str]):
        self.into = into
        self._buf = b""
        self._name = ""

    def feed(self, data: bytes) -> None:
        self._buf += data
        *lines, self._buf = self._buf.split(b"\n")
        for raw in lines:
            line = raw.rstrip(b"\r")
            if line.startswith(b"event:"):
                self._name = line[6:].strip().decode("utf-8", "replace")
            elif line.startswith(b"data:") and not self._name:
                self.into.append("[DONE]" if line[5:].strip() == b"[DONE]" else "data")
                self._name = "-"  # one frame, however many data lines
            elif not line:
                if self._name and self._name != "-":
                    self.into.append(self._name)
                self._name = ""


class Tap:
    def __init__(self, target: str):
        self.target = target.rstrip("/")
        self._lock = threading.Lock()
        self.hits: list[Hit] = []
        self.app = Starlette(
            routes=[Route("/{path:path}", self._forward, methods=["GET", "POST", "HEAD", "PUT", "DELETE"])]
        )

    def reset(self) -> None:
        with self._lock:
            self.hits = []

    def snapshot(self) -> list[Hit]:
        with self._lock:
            return list(self.hits)

    async def _forward(self, request: Request) -> Response:
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        hit = Hit(request.method, path)
        with self._lock:
            self.hits.append(hit)
        started = time.perf_counter()
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS]
        # One client per request: loopback connections are cheap, and nothing outlives the request.
        client = httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=10.0))
        upstream = client.build_request(
            request.method, self.target + path, headers=headers, content=await request.body()
        )
        try:
            response = await client.send(upstream, stream=True)
        except httpx.HTTPError as exc:
            await client.aclose()
            hit.status, hit.error_body = 599, f"tap could not reach k3: {type(exc).__name__}: {exc}"
            return Response(hit.error_body, status_code=502)
        hit.status = response.status_code
        hit.content_type = response.headers.get("content-type", "")
        events = _SSEEvents(hit.events) if hit.content_type.startswith("text/event-stream") else None
        error: list[bytes] = []

        async def body():
            async for chunk in response.aiter_raw():
                if events is not None:
                    events.feed(chunk)
                if hit.status >= 400 and sum(map(len, error)) < _ERROR_KEEP:
                    error.append(chunk)
                yield chunk

        async def done() -> None:
            await response.aclose()
            await client.aclose()
            hit.seconds = time.perf_counter() - started
            if error:
                hit.error_body = b"".join(error)[:_ERROR_KEEP].decode("utf-8", "replace")

        out_headers = {
            k: v for k, v in response.headers.items() if k.lower() not in _HOP_HEADERS | _OWN_HEADERS
        }
        return StreamingResponse(
            body(), status_code=response.status_code, headers=out_headers, background=BackgroundTask(done)
        )
