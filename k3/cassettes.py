"""Cassettes: `k3 serve --record DIR` writes one per turn request; `k3 replay DIR` plays them back.

A cassette (version 1, JSON, gzip with `--record-compress`) holds what one turn saw:

    {"k3_cassette": 1, "name", "recorded_at", "source": "recorded", "preset", "streamed",
     "config": {the serve options that shape a turn},
     "request": {"path", "headers" (lower-cased; credentials "<redacted>"), "body",
                 "raw" (only for a body that is not JSON)},
     "upstream": {"request": payload sent, "chunks": [stream chunks] | null, "response": json | null},
     "client": {"status", "body": json | null, "sse": ["event: …\\ndata: …\\n\\n", …]}}

Recording wraps the app (an ASGI middleware for the turn routes) and the upstream transport (a
tee of the engine's bytes), joined by a context variable, so the turn code itself knows nothing
of it and costs nothing when recording is off. Replay answers the engine's side from the
cassette and compares what k3 sends the engine and the client now with what was recorded, after
`normalize` (ids, timestamps and signatures differ on every run by design).
"""

from __future__ import annotations

import contextvars
import gzip
import itertools
import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from k3.config import Config

VERSION = 1
SECRET_HEADERS = ("authorization", "x-api-key", "proxy-authorization", "cookie")
# The Config fields a recorded turn depends on (replay rebuilds the same configuration).
CONFIG_FIELDS = ("model", "small_model", "client", "reasoning_field", "tool_parser", "show_reasoning")
# Values that differ on every run: replaced by placeholders numbered by first appearance.
VOLATILE_KEYS = frozenset(
    ("id", "call_id", "item_id", "tool_use_id", "tool_call_id", "signature", "encrypted_content")
)
TIME_KEYS = frozenset(("created", "created_at", "recorded_at"))

_current: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("k3_cassette", default=None)


def _json_or_none(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _data_chunks(raw: bytes) -> list[Any]:
    """The JSON `data:` payloads of an SSE body (comments, `[DONE]` and bad lines left out)."""
    chunks = []
    for line in raw.decode("utf-8", "replace").splitlines():
        if line.startswith("data:") and line[5:].strip() != "[DONE]":
            value = _json_or_none(line[5:].strip().encode())
            if value is not None:
                chunks.append(value)
    return chunks


class _Tee(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, pieces: list[bytes]) -> None:
        self._inner, self._pieces = inner, pieces

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for piece in self._inner:
            self._pieces.append(piece)
            yield piece

    async def aclose(self) -> None:
        await self._inner.aclose()


class RecordingTransport(httpx.AsyncBaseTransport):
    """Passes everything to `inner`; for a turn being recorded, keeps the chat request and reply."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self._inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        cassette = _current.get()
        if cassette is None or not request.url.path.endswith("/chat/completions"):
            return await self._inner.handle_async_request(request)
        payload = await request.aread()
        cassette["_upstream_request"] = payload
        response = await self._inner.handle_async_request(request)
        pieces: list[bytes] = []
        cassette["_upstream_pieces"] = pieces
        response.stream = _Tee(response.stream, pieces)  # type: ignore[arg-type]
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


class Recorder:
    """ASGI middleware: one cassette file per request on the turn routes."""

    def __init__(self, app: Any, directory: str, config: Config, compress: bool = False) -> None:
        self.app, self.directory, self.compress = app, Path(directory), compress
        self.state = app.state  # what the server reads off the app (the K3 object) stays reachable
        self.config = {name: getattr(config, name) for name in CONFIG_FIELDS}
        self.directory.mkdir(parents=True, exist_ok=True)
        self._serial = itertools.count(1)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        from k3.app import TURN_ROUTES

        if scope["type"] != "http" or scope["path"] not in TURN_ROUTES:
            return await self.app(scope, receive, send)
        cassette: dict[str, Any] = {}
        body: list[bytes] = []
        reply: list[bytes] = []
        status: dict[str, Any] = {}

        async def recording_receive() -> dict:
            message = await receive()
            body.append(message.get("body", b""))
            return message

        async def recording_send(message: dict) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                status["headers"] = {k.decode().lower(): v.decode() for k, v in message.get("headers", [])}
            elif message["type"] == "http.response.body":
                reply.append(message.get("body", b""))
            await send(message)

        token = _current.set(cassette)
        try:
            await self.app(scope, recording_receive, recording_send)
        finally:
            _current.reset(token)
            self._write(scope, cassette, b"".join(body), status, b"".join(reply))

    @staticmethod
    def _request(path: str, headers: dict[str, str], body: bytes) -> dict[str, Any]:
        parsed = _json_or_none(body)
        request = {"path": path, "headers": headers, "body": parsed}
        if parsed is None and body.strip():  # not JSON: the bytes themselves, to replay the 400
            request["raw"] = body.decode("utf-8", "replace")
        return request

    def _write(self, scope: dict, cassette: dict, body: bytes, status: dict, reply: bytes) -> None:
        headers = {k.decode().lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        for name in SECRET_HEADERS:
            if name in headers:
                headers[name] = "<redacted>"
        response_headers = status.get("headers", {})
        streamed = response_headers.get("content-type", "").startswith("text/event-stream")
        upstream_raw = b"".join(cassette.get("_upstream_pieces", []))
        upstream_streamed = b"data:" in upstream_raw[:64] or upstream_raw.startswith(b":")
        name = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{next(self._serial):05d}"
        record = {
            "k3_cassette": VERSION,
            "name": name,
            "recorded_at": time.time(),
            "source": "recorded",
            "preset": response_headers.get("x-k3-preset"),
            "streamed": streamed,
            "config": self.config,
            "request": self._request(scope["path"], headers, body),
            "upstream": {
                "request": _json_or_none(cassette.get("_upstream_request", b"null")),
                "chunks": _data_chunks(upstream_raw) if upstream_streamed else None,
                "response": None if upstream_streamed else _json_or_none(upstream_raw),
            },
            "client": {
                "status": status.get("code"),
                "body": None if streamed else _json_or_none(reply),
                "sse": [f + "\n\n" for f in reply.decode("utf-8", "replace").split("\n\n") if f.strip()]
                if streamed
                else [],
            },
        }
        text = json.dumps(record, indent=2, ensure_ascii=False)
        if self.compress:
            (self.directory / f"{name}.json.gz").write_bytes(gzip.compress(text.encode()))
        else:
            (self.directory / f"{name}.json").write_text(text, encoding="utf-8")


def load_cassettes(directory: str | Path) -> list[dict[str, Any]]:
    """Every cassette in `directory` (`.json` and `.json.gz`), in name order."""
    found = []
    for path in sorted(Path(directory).glob("*.json*")):
        if path.name.endswith(".json.gz"):
            found.append(json.loads(gzip.decompress(path.read_bytes())))
        elif path.suffix == ".json":
            found.append(json.loads(path.read_text(encoding="utf-8")))
    return [c for c in found if isinstance(c, dict) and c.get("k3_cassette") == VERSION]


def normalize(value: Any, names: dict[str, str] | None = None) -> Any:
    """`value` with run-specific ids, signatures and timestamps replaced by stable placeholders
    (the same value gets the same placeholder, so the relations between ids still compare)."""
    names = {} if names is None else names

    def walk(node: Any, key: str | None) -> Any:
        if isinstance(node, dict):
            return {k: walk(v, k) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v, key) for v in node]
        if key in TIME_KEYS and isinstance(node, int | float | str):
            return "<time>"
        if key in VOLATILE_KEYS and isinstance(node, str) and node:
            return names.setdefault(node, f"<{key}:{len(names) + 1}>")
        return node

    return walk(value, None)


def _sse_events(frames: list[str]) -> list[Any]:
    """SSE frames as (event name, parsed data) pairs."""
    events = []
    for frame in frames:
        name, data = None, []
        for line in frame.splitlines():
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())
        text = "\n".join(data)
        events.append([name, _json_or_none(text.encode()) if text != "[DONE]" else "[DONE]"])
    return events


def differences(expected: Any, actual: Any, path: str = "$", limit: int = 10) -> list[str]:
    """Where two JSON values differ, as `path: detail` lines (at most `limit`)."""
    out: list[str] = []

    def visit(a: Any, b: Any, where: str) -> None:
        if len(out) >= limit:
            return
        if isinstance(a, dict) and isinstance(b, dict):
            for k in a.keys() - b.keys():
                out.append(f"{where}.{k}: missing")
            for k in b.keys() - a.keys():
                out.append(f"{where}.{k}: unexpected")
            for k in a.keys() & b.keys():
                visit(a[k], b[k], f"{where}.{k}")
        elif isinstance(a, list) and isinstance(b, list):
            if len(a) != len(b):
                out.append(f"{where}: length {len(a)} != {len(b)}")
            for i, (x, y) in enumerate(zip(a, b, strict=False)):
                visit(x, y, f"{where}[{i}]")
        elif a != b:
            out.append(
                f"{where}: {json.dumps(a, ensure_ascii=False)[:80]} != {json.dumps(b, ensure_ascii=False)[:80]}"
            )

    visit(expected, actual, path)
    return out[:limit]


class _ReplayEngine(httpx.AsyncBaseTransport):
    """Answers the engine's side of one cassette; keeps the payload k3 sent."""

    def __init__(self, cassette: dict[str, Any]) -> None:
        self.upstream = cassette.get("upstream") or {}
        self.sent: Any = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if not request.url.path.endswith("/chat/completions"):
            return httpx.Response(200, json={"object": "list", "data": []})
        self.sent = _json_or_none(await request.aread())
        chunks = self.upstream.get("chunks")
        if chunks is not None:
            body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
            return httpx.Response(200, content=body.encode(), headers={"content-type": "text/event-stream"})
        return httpx.Response(200, json=self.upstream.get("response") or {})


async def replay(cassette: dict[str, Any], state_dir: str | None = None) -> list[str]:
    """The differences between a cassette and what k3 does with its request now ([] = match)."""
    from k3.app import create_app

    settings = {k: v for k, v in (cassette.get("config") or {}).items() if k in CONFIG_FIELDS}
    engine = _ReplayEngine(cassette)
    app = create_app(
        Config(upstream="http://replay/v1", state_dir=state_dir, **settings), upstream_transport=engine
    )
    request = cassette["request"]
    headers = {k: v for k, v in request.get("headers", {}).items() if k not in ("content-length", "host")}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://k3") as client:
        if "raw" in request:
            response = await client.post(request["path"], content=request["raw"].encode(), headers=headers)
        else:
            response = await client.post(request["path"], json=request.get("body"), headers=headers)
    await app.state.k3.upstream.aclose()
    app.state.k3.memory.close()
    recorded = cassette.get("client") or {}
    names: dict[str, str] = {}
    expected = {
        "upstream": normalize((cassette.get("upstream") or {}).get("request"), names),
        "status": recorded.get("status"),
        "client": normalize(
            _sse_events(recorded["sse"]) if recorded.get("sse") else recorded.get("body"), names
        ),
    }
    mine: dict[str, str] = {}
    streamed = response.headers.get("content-type", "").startswith("text/event-stream")
    frames = [f + "\n\n" for f in response.text.split("\n\n") if f.strip()]
    actual = {
        "upstream": normalize(engine.sent, mine),
        "status": response.status_code,
        "client": normalize(_sse_events(frames) if streamed else _json_or_none(response.content), mine),
    }
    return differences(expected, actual)


def recording(app: Any, directory: str, config: Config, compress: bool = False) -> Recorder:
    """`app` (from `create_app`) recording every turn into `directory`."""
    upstream = app.state.k3.upstream
    upstream.transport = RecordingTransport(upstream.transport)  # the hot path's transport only
    return Recorder(app, directory, config, compress)
