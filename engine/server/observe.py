"""What the engine server tells its operator: one log line per finished request, Prometheus metrics
(`GET /metrics`, text format 0.0.4) and the bearer-key check (`--api-key`).

`Observed` wraps the whole ASGI app, so every route and every error path is counted the same way; a
chat request leaves its token counts and first-token time in the request state for it to read.
Prompts, outputs and keys are never logged.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections import Counter
from typing import Any

import orjson

log = logging.getLogger("engine.server")

# Seconds; the same buckets as vLLM's TTFT and inter-token histograms, so dashboards carry over.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)
OPEN_PATHS = ("/health", "/metrics", "/version")  # answered without the key (no prompt data in them)


class Histogram:
    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.total = 0.0
        self.n = 0

    def observe(self, value: float) -> None:
        self.total += value
        self.n += 1
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
                break

    def lines(self, name: str, help_text: str) -> list[str]:
        out = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        running = 0
        for bound, count in zip(self.buckets, self.counts, strict=True):
            running += count
            out.append(f'{name}_bucket{{le="{bound:g}"}} {running}')
        out += [
            f'{name}_bucket{{le="+Inf"}} {self.n}',
            f"{name}_sum {self.total:.6f}",
            f"{name}_count {self.n}",
        ]
        return out


class Metrics:
    def __init__(self) -> None:
        self.responses: Counter[tuple[str, int]] = Counter()  # (route, status)
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cached_tokens = 0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)

    def finished_generation(self, state: dict, elapsed_s: float) -> None:
        self.prompt_tokens += state.get("prompt_tokens", 0)
        self.completion_tokens += state.get("completion_tokens", 0)
        self.cached_tokens += state.get("cached_tokens", 0)
        if "ttft_s" in state:
            self.ttft.observe(state["ttft_s"])
        for gap in state.get("itl_s", ()):
            self.itl.observe(gap)
        self.e2e.observe(elapsed_s)

    def render(self, scheduler: dict) -> str:
        lines = ["# HELP kimi_requests_total Finished HTTP requests by route and status code.",
                 "# TYPE kimi_requests_total counter"]  # fmt: skip
        for (route, status), n in sorted(self.responses.items()):
            lines.append(f'kimi_requests_total{{route="{route}",status="{status}"}} {n}')
        for name, value, text in (
            ("kimi_prompt_tokens_total", self.prompt_tokens, "Prompt tokens of finished generations."),
            ("kimi_generation_tokens_total", self.completion_tokens, "Tokens generated."),
            ("kimi_prefix_cache_hit_tokens_total", self.cached_tokens, "Prompt tokens served from the prefix cache."),
        ):  # fmt: skip
            lines += [f"# HELP {name} {text}", f"# TYPE {name} counter", f"{name} {value}"]
        for name, key, text in (
            ("kimi_requests_waiting", "queued", "Requests waiting for a sequence slot."),
            ("kimi_requests_running", "active", "Sequences being generated."),
        ):
            lines += [f"# HELP {name} {text}", f"# TYPE {name} gauge", f"{name} {scheduler.get(key, 0)}"]
        lines += self.ttft.lines("kimi_time_to_first_token_seconds", "Time from request to first token.")
        lines += self.itl.lines("kimi_inter_token_latency_seconds", "Time between successive tokens.")
        lines += self.e2e.lines("kimi_e2e_request_latency_seconds", "Time from request to its last byte.")
        return "\n".join(lines) + "\n"


def _route(path: str) -> str:
    """Known routes by name; anything else as one label, so label cardinality stays bounded."""
    known = ("/v1/chat/completions", "/v1/models", "/health", "/tokenize", "/metrics", "/version")
    return path if path in known else "other"


class Observed:
    """ASGI wrapper: checks the bearer key, counts every response, logs one line per finished request."""

    def __init__(self, app: Any, metrics: Metrics, api_key: str | None = None):
        self.app = app
        self.metrics = metrics
        self._key = api_key.encode() if api_key else None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        status = 500  # if the app fails before answering
        scope.setdefault("state", {})

        async def watched(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            if self._key is not None and scope["path"] not in OPEN_PATHS and not self._authorized(scope):
                status = 401
                return await _unauthorized(send)
            await self.app(scope, receive, watched)
        finally:
            elapsed = time.perf_counter() - start
            path = _route(scope["path"])
            self.metrics.responses[path, status] += 1
            state = scope["state"]
            if "completion_tokens" in state:
                self.metrics.finished_generation(state, elapsed)
            tokens = {
                k: state[k] for k in ("prompt_tokens", "completion_tokens", "cached_tokens") if k in state
            }
            log.info(
                "%s %s %d %.1f ms prompt=%s completion=%s cached=%s",
                scope["method"], scope["path"], status, elapsed * 1e3, state.get("prompt_tokens", "-"),
                state.get("completion_tokens", "-"), state.get("cached_tokens", "-"),
                extra={"method": scope["method"], "path": scope["path"], "status": status,
                       "latency_ms": round(elapsed * 1e3, 1), **tokens},
            )  # fmt: skip

    def _authorized(self, scope: dict) -> bool:
        for name, value in scope["headers"]:
            if name == b"authorization" and value[:7].lower() == b"bearer ":
                return hmac.compare_digest(value[7:].strip(), self._key or b"")
        return False


async def _unauthorized(send: Any) -> None:
    body = orjson.dumps(
        {"error": {"message": "missing or invalid API key (Authorization: Bearer …)",
                   "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}}
    )  # fmt: skip
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"www-authenticate", b"Bearer")]  # fmt: skip
    await send({"type": "http.response.start", "status": 401, "headers": headers})
    await send({"type": "http.response.body", "body": body})
