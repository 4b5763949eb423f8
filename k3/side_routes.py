"""k3's routes beside the turn: token counts, model list, health, presets, stats, metrics, version,
the root probe and the dialect-aware 404. Each is a raw ASGI endpoint over the server's shared state
(`k3.app.K3`); the ones that show configuration or counters need the API key when one is set."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import orjson

from k3 import VERSION, presets
from k3.auth import unauthorized
from k3.connection import ClientGone, Receive, Scope, Send, headers_of, send_json
from k3.dialects import anthropic, chat
from k3.engine_transport import EngineTransport
from k3.errors import ProxyError, error_body
from k3.tokens import estimate, rough_tokens
from k3.upstream_request import build_payload, encode_payload

if TYPE_CHECKING:
    from k3.app import K3


def guess_dialect(path: str, headers: dict[str, str]) -> str:
    """Dialect for errors on routes that have none of their own."""
    return "anthropic" if "messages" in path or "anthropic-version" in headers else "chat"


class SideRoutes:
    def __init__(self, k3: K3) -> None:
        self.k3 = k3

    async def count_tokens(self, scope: Scope, receive: Receive, send: Send) -> None:
        if "anthropic" in self.k3.strict_refused:
            return await self.k3.refuse_route(scope, send)
        headers = headers_of(scope)
        try:
            self.k3.auth.check(headers)
            raw = await self.k3.read_body(receive, headers)
            body = self.k3.parse_json(raw)
        except ProxyError as err:
            return await send_json(send, err.status, error_body("anthropic", err))
        except ClientGone:
            return
        self.k3.stats.counters["count_tokens"] += 1
        try:
            request = anthropic.ingress(body, self.k3.config.model)
            model = presets.upstream_model(
                self.k3.detect("anthropic", headers, body).preset,
                request.model,
                self.k3.config.model,
                self.k3.config.small_model,
            )
            payload = build_payload(request, self.k3.config, model)
            encode_payload(payload, body)  # the tokenizer call must not be the first to find a bad value
        except Exception:  # counting never fails on an odd body: estimate from its size
            return await send_json(send, 200, orjson.dumps({"input_tokens": rough_tokens(len(raw))}))
        count = await self.k3.upstream.count_tokens(payload)
        await send_json(
            send, 200, orjson.dumps({"input_tokens": count if count is not None else estimate(payload)})
        )

    async def models(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = headers_of(scope)
        dialect = guess_dialect("", headers)
        if not self.k3.auth.allows(headers):
            return await send_json(send, 401, error_body(dialect, unauthorized()))
        preset = self.k3.detect(None, headers, None).preset
        ids = presets.model_ids(preset, self.k3.config.model, self.k3.config.small_model)
        body = (
            anthropic.models_json(ids) if dialect == "anthropic" else chat.models_json(ids, int(time.time()))
        )
        await send_json(send, 200, orjson.dumps(body))

    async def health(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = headers_of(scope)
        detail: dict[str, Any]
        try:
            served = await self.k3.upstream.models()
            status, detail = "ok", {"models": served}
        except ProxyError as err:
            status, detail = "degraded", {"error": err.message}
        body: dict[str, Any] = {"status": status}
        if self.k3.auth.enabled and self.k3.auth.allows(headers):  # only for callers known to be allowed
            body.update(
                upstream=self.k3.config.upstream_base,
                model=self.k3.config.model,
                client=self.k3.config.client or "auto",
                **detail,
            )
        await send_json(send, 200 if status == "ok" else 503, orjson.dumps(body))

    async def presets_route(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = headers_of(scope)
        if not self.k3.auth.allows(headers):
            return await send_json(send, 401, error_body("chat", unauthorized()))
        listing = [
            {
                "name": p.name,
                "title": p.title,
                "status": p.status,
                "dialects": list(p.dialects),
                "notes": p.notes,
            }
            for p in presets.PRESETS
        ]
        await send_json(
            send, 200, orjson.dumps({"active": self.k3.config.client or "auto", "presets": listing})
        )

    async def stats_route(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self.k3.auth.allows(headers_of(scope)):
            return await send_json(send, 401, error_body("chat", unauthorized()))
        stats = {**self.k3.stats.json(), "ledger": self.k3.memory.stats()}
        if (connections := self.connections()) is not None:
            stats["upstream_connections"] = connections
        await send_json(send, 200, orjson.dumps(stats))

    def connections(self) -> dict[str, int] | None:
        transport = self.k3.upstream.transport
        return transport.connections() if isinstance(transport, EngineTransport) else None

    async def metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Prometheus text: counts only (no prompts, no config), so open like /health's status."""
        body = self.k3.stats.prometheus(self.connections()).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8"),
                                (b"content-length", str(len(body)).encode())]})  # fmt: skip
        await send({"type": "http.response.body", "body": body})

    async def version(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_json(send, 200, orjson.dumps({"name": "k3", "version": VERSION}))

    async def root(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Claude Code probes `HEAD /` before its first request.
        body = b"" if scope["method"] == "HEAD" else orjson.dumps({"name": "k3", "status": "ok"})
        await send_json(send, 200, body)

    async def not_found(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"]
        err = ProxyError(404, f"no route {scope['method']} {path}", code="not_found")
        await send_json(send, 404, error_body(guess_dialect(path, headers_of(scope)), err))
