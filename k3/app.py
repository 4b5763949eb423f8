"""The k3 ASGI application: the routes, body limits, the turn loop, streaming and errors.

Beside it: the side routes (k3.side_routes), the API key (k3.auth), the counters (k3.stats), the
dialects behind the three turn routes (k3.dialects: each module implements `Dialect`).

A client turn: read the body (413 over the limit), parse it (400), detect the client preset,
lower it through the route's dialect into a CanonicalRequest, build the OpenAI Chat payload,
make exactly one upstream POST, translate the upstream chunks into canonical events
(k3.pipeline), and raise them back into the dialect, as SSE or as one JSON body.

Streams commit their 200 only once the first canonical event exists (or after one keep-alive
interval of silence), so an upstream that fails early gets a proper JSON error in the caller's
dialect; a failure after that ends the stream with the dialect's error event. A client that
disconnects cancels the turn, which closes the upstream connection at once.

Reasoning continuity (k3.continuity): assistant turns are restored while the payload is built; a
reply with reasoning or tool calls is recorded as soon as the upstream stream ends, before the
client's last frames, or on the way out if the client left before that.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import orjson
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.routing import Route

from k3 import presets
from k3.auth import ApiKey
from k3.config import Config
from k3.connection import (
    SSE_HEADERS,
    ClientGone,
    Hangup,
    LateStart,
    Receive,
    Scope,
    Send,
    SSEWriter,
    headers_of,
    send_json,
)
from k3.continuity import TurnMemory, assistant_turns, open_memory
from k3.detect import Detection, detect
from k3.dialects import DIALECTS
from k3.dialects.common import Turn, new_id
from k3.draining import SETTLE, Drain
from k3.errors import ProxyError, bad_request, error_body
from k3.ir import Event
from k3.pipeline import Collector, Translator, completion_to_chunk, make_text_parser
from k3.side_routes import SideRoutes
from k3.stats import Stats
from k3.tokens import rough_tokens
from k3.upstream import Upstream
from k3.upstream_request import build_payload, encode_payload, tool_to_upstream

log = logging.getLogger("k3")
# One line per finished request (status, latency, tokens; never prompts or keys): `k3 serve --access-log`.
access = logging.getLogger("k3.access")

# Nesting a client body may have: far deeper than any real request, and shallow enough that what
# k3 echoes back inside its own envelopes (Responses' tool_choice, metadata) stays encodable.
MAX_JSON_DEPTH = 128
ORJSON_MAX_DEPTH = 254  # the deepest nesting orjson writes (a test pins it)


def nests_deeper(value: Any, limit: int) -> bool:
    """Whether `value` nests more than `limit` objects/arrays deep. orjson does the walk, in C:
    wrapped in enough lists, `value` reaches orjson's own limit exactly when it passes `limit`."""
    for _ in range(ORJSON_MAX_DEPTH - limit):
        value = [value]
    try:
        orjson.dumps(value)
    except orjson.JSONEncodeError:  # parsed JSON is always encodable: only the depth can fail
        return True
    return False


TURN_ROUTES = {"/v1/messages": "anthropic", "/v1/chat/completions": "chat", "/v1/responses": "responses"}
TURN_PATHS = {dialect: path for path, dialect in TURN_ROUTES.items()}


def _unanticipated(exc: Exception) -> ProxyError:
    log.exception("a request shape no check anticipated")
    return bad_request(f"could not parse request: {type(exc).__name__}: {exc}")


def _translation_error(exc: BaseException) -> ProxyError:
    log.exception("could not translate the upstream reply")
    return ProxyError(
        502,
        f"k3 could not translate the upstream reply: {type(exc).__name__}: {exc}",
        code="translation_error",
    )


class K3:
    """Shared state of one server: config, the pooled upstream client, counters."""

    def __init__(self, config: Config, upstream_transport: httpx.AsyncBaseTransport | None = None):
        self.config = config
        self.upstream = Upstream(config, upstream_transport)
        self.stats = Stats()
        self.memory = open_memory(config)
        self.late = LateStart()  # hang-up watches and keep-alive timers of long turns
        self.drain = Drain()  # the turns in flight, for a graceful shutdown
        self.auth = ApiKey(config.api_key)
        # --strict-routes with --client: the dialects the pinned client does not speak get a 404.
        pinned = presets.get(config.client) if config.client and config.strict_routes else None
        self.strict_refused = {d for d in DIALECTS if d not in pinned.dialects} if pinned else set()

    async def refuse_route(self, scope: Scope, send: Send) -> None:
        """The 404 of --strict-routes, in the pinned client's dialect."""
        name = self.config.client
        err = ProxyError(
            404, f"{scope['path']} is not served under --client {name} with --strict-routes", code="not_found"
        )
        await send_json(send, 404, error_body(presets.get(name).dialects[0], err))  # type: ignore[arg-type]

    # -- helpers --------------------------------------------------------------------------------

    async def read_body(self, receive: Receive, headers: dict[str, str]) -> bytes:
        limit = self.config.max_body_bytes
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise ProxyError(
                413, f"request body is {declared} bytes; the limit is {limit}", code="body_too_large"
            )
        chunks = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise ProxyError(
                    413, f"request body exceeds the limit of {limit} bytes", code="body_too_large"
                )
            chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    @staticmethod
    def parse_json(raw: bytes) -> dict[str, Any]:
        if not raw.strip():
            return {}
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise bad_request(f"request body is not valid JSON: {exc}") from None
        if body is None:
            return {}
        if not isinstance(body, dict):
            raise bad_request(f"request body must be a JSON object, got {type(body).__name__}")
        # Fewer brackets than the limit cannot nest past it: only bigger bodies pay for the check.
        if raw.count(b"{") + raw.count(b"[") > MAX_JSON_DEPTH and nests_deeper(body, MAX_JSON_DEPTH):
            raise bad_request(f"request body nests deeper than {MAX_JSON_DEPTH} levels of objects and arrays")
        return body

    def detect(self, dialect: str | None, headers: dict[str, str], body: dict[str, Any] | None) -> Detection:
        return detect(dialect, headers, body, self.config.client)

    # -- the turn -------------------------------------------------------------------------------

    async def turn(self, scope: Scope, receive: Receive, send: Send, dialect: str) -> None:
        if dialect in self.strict_refused:
            return await self.refuse_route(scope, send)
        headers = headers_of(scope)
        try:
            self.auth.check(headers)
            body = self.parse_json(await self.read_body(receive, headers))
            found = self.detect(dialect, headers, body)
            module = DIALECTS[dialect]
            request = module.ingress(body, self.config.model)
            turn = Turn(
                dialect,
                found.preset,
                request,
                body,
                new_id(module.ID_PREFIX),
                show=self.config.show_reasoning,
            )
            upstream_model = presets.upstream_model(
                found.preset, request.model, self.config.model, self.config.small_model
            )
            memory = TurnMemory(self.memory, headers, found.preset.name, assistant_turns(request.messages))
            payload = encode_payload(build_payload(request, self.config, upstream_model, memory), body)
        except ClientGone:
            self.stats.counters["disconnects"] += 1
            return
        except Exception as exc:
            # Everything so far derives from the client's input: a shape no check anticipated is a 400.
            err = exc if isinstance(exc, ProxyError) else _unanticipated(exc)
            self.stats.counters["errors"] += 1
            self.stats.finished(err.status, 0.0)
            if access.isEnabledFor(logging.INFO):
                access.info(
                    "%s %s %d (%s)", scope["method"], scope["path"], err.status, err.code,
                    extra={"method": scope["method"], "path": scope["path"], "status": err.status},
                )  # fmt: skip
            return await send_json(send, err.status, error_body(dialect, err))
        self.stats.counters["requests"] += 1
        self.stats.by_preset[found.preset.name] += 1
        self.stats.by_dialect[dialect] += 1
        if log.isEnabledFor(logging.DEBUG):  # per request: DEBUG (--access-log gives one line each)
            log.debug(
                "%s -> %s (%s) model=%s->%s stream=%s tools=%d",
                scope["path"], found.preset.name, found.reason, request.model, upstream_model,
                request.stream, len(request.tools),
            )  # fmt: skip
        work = self._stream if request.stream else self._json
        await self._watching(receive, work, turn, payload, memory, send)

    async def _watching(
        self,
        receive: Receive,
        work: Callable[[Turn, bytes, TurnMemory, Send, Hangup], Awaitable[None]],
        turn: Turn,
        payload: bytes,
        memory: TurnMemory,
        send: Send,
    ) -> None:
        """Run the turn; if the client hangs up first, cancel it (closing the upstream request).
        The turn stops the watch before its last write (a complete response is no hang-up)."""
        started = time.perf_counter()
        task = asyncio.current_task()
        assert task is not None
        hangup = Hangup(task, receive)
        self.late.add(hangup)
        self.drain.enter(task)
        try:
            await work(turn, payload, memory, send, hangup)
        except asyncio.CancelledError:
            if not hangup.hung_up:
                raise
            task.uncancel()
        finally:
            self.drain.leave(task)
            self.late.discard(hangup)
            hangup.stop()
            if hangup.hung_up:
                self.stats.counters["disconnects"] += 1
                turn.status = 499  # nginx's "client closed request", as access logs write it
            elapsed = time.perf_counter() - started
            self.stats.finished(turn.status, elapsed)
            if access.isEnabledFor(logging.INFO):
                usage = turn.usage
                tokens = (
                    {"prompt_tokens": usage.input_tokens, "completion_tokens": usage.output_tokens}
                    if usage
                    else {}
                )
                access.info(
                    "POST %s %d %.1f ms %s/%s in=%s out=%s", TURN_PATHS[turn.dialect], turn.status,
                    elapsed * 1e3, turn.dialect, turn.preset.name, usage.input_tokens if usage else "-",
                    usage.output_tokens if usage else "-",
                    extra={"method": "POST", "path": TURN_PATHS[turn.dialect], "status": turn.status,
                           "latency_ms": round(elapsed * 1e3, 1), "dialect": turn.dialect,
                           "preset": turn.preset.name, **tokens},
                )  # fmt: skip

    def _finish_record(
        self, turn: Turn, memory: TurnMemory, events: list[Event], translator: Translator
    ) -> None:
        try:
            events.extend(translator.finish())
        except Exception:  # a parser that cannot finish: record what was already translated
            log.exception("could not finish the abandoned turn")
        self._record(turn, memory, events, translator)

    def _failure(self, exc: BaseException) -> ProxyError:
        """The error a turn ends with. A cancellation goes on up unless the shutdown sent it."""
        if isinstance(exc, ProxyError):
            return exc
        if isinstance(exc, asyncio.CancelledError):
            if not self.drain.ended(asyncio.current_task()):
                raise exc
            return ProxyError(
                503, "k3 is shutting down; the turn was ended before it finished", code="shutting_down"
            )
        return _translation_error(exc)

    def _failed(self, turn: Turn, err: ProxyError) -> None:
        turn.status = err.status
        self.stats.counters["errors"] += 1
        log.warning("%s turn for %s failed: %d %s", turn.dialect, turn.preset.name, err.status, err.message)

    def _translator(self, turn: Turn, payload: bytes, memory: TurnMemory) -> Translator:
        parser_name = self.config.parser_for(turn.preset.tool_parser)
        request = turn.request
        parser = make_text_parser(
            parser_name, self.config.reasoning_field, lambda: [tool_to_upstream(t) for t in request.tools]
        )
        # Chat has no field for a signature; hidden reasoning is found again by fingerprint.
        sign = memory.sign if turn.dialect != "chat" and turn.show_reasoning else None
        text_field = "kimi_k3" if parser_name == "kimi_k3" else "think"
        return Translator(parser, request.stop, rough_tokens(len(payload)), sign, text_field)

    def _record(
        self, turn: Turn, memory: TurnMemory, events: list[Event] | Collector, translator: Translator
    ) -> None:
        """Ledger write for the finished reply (once; nothing for a plain text answer)."""
        turn.usage = translator.usage
        if memory.committed:
            return
        if translator.reasoning_field is None and not translator.tool_calls:
            memory.skip()  # nothing to restore later
            return
        if isinstance(events, Collector):
            collector = events
        else:
            collector = Collector()
            for event in events:
                collector.add(event)
        memory.commit(collector.parts, translator.reasoning_field)
        if translator.reasoning_field is not None:
            self.stats.saw_reasoning(turn.preset.name, translator.reasoning_field)

    async def _json(self, turn: Turn, payload: bytes, memory: TurnMemory, send: Send, hangup: Hangup) -> None:
        module = DIALECTS[turn.dialect]
        try:
            completion = await self.upstream.complete(payload)
            translator = self._translator(turn, payload, memory)
            collector = Collector()
            for event in translator.feed(completion_to_chunk(completion)):
                collector.add(event)
            for event in translator.finish():
                collector.add(event)
            self._record(turn, memory, collector, translator)
            body = orjson.dumps(module.render(collector.response(), turn))
        except (Exception, asyncio.CancelledError) as exc:
            err = self._failure(exc)
            self._failed(turn, err)
            hangup.stop()
            return await send_json(send, err.status, error_body(turn.dialect, err), err.headers)
        hangup.stop()
        await send_json(send, 200, body, [(b"x-k3-preset", turn.preset.name.encode())])

    async def _stream(
        self, turn: Turn, payload: bytes, memory: TurnMemory, send: Send, hangup: Hangup
    ) -> None:
        self.stats.counters["streamed"] += 1
        encoder = DIALECTS[turn.dialect].Stream(turn)
        headers = [*SSE_HEADERS, (b"x-k3-preset", turn.preset.name.encode())]
        writer = SSEWriter(send, encoder.start(), headers, encoder.keepalive, self.config.keepalive_interval)
        translator = self._translator(turn, payload, memory)
        seen: list[Event] = []  # the reply so far, folded for the ledger only if it needs recording
        feed, keep = encoder.feed, seen.extend
        failed = False
        try:
            try:
                async with self.upstream.stream(payload) as chunks:
                    self.late.add(writer)
                    last: list[Event] = []
                    async for batch in chunks:
                        events = [e for chunk in batch for e in translator.feed(chunk)]
                        if chunks.done:  # the engine's last read: it goes out with the closing frames
                            last = events
                            break
                        if events:
                            keep(events)
                            await writer.write(b"".join([feed(e) for e in events]))
                    last += translator.finish()
                    keep(last)
                    self._record(turn, memory, seen, translator)  # before the client's last bytes
                    hangup.stop()
                    await writer.close(b"".join([feed(e) for e in last]))
            except ProxyError:
                raise
            except (Exception, asyncio.CancelledError) as exc:
                raise self._failure(exc) from exc
        except ProxyError as err:
            failed = True
            self._failed(turn, err)
            writer.disarm()
            hangup.stop()
            if writer.committed:
                await writer.close(encoder.error(err))
            else:
                await send_json(send, err.status, error_body(turn.dialect, err), err.headers)
        finally:
            self.late.discard(writer)
            writer.disarm()
            if not failed and not memory.committed:
                # The client left early (perhaps after the engine's last token, before our last
                # frames): what it got may still come back next turn, so record it.
                self._finish_record(turn, memory, seen, translator)


class _Endpoint:
    """A raw ASGI endpoint (no Request/Response objects on the hot path)."""

    __slots__ = ("_handler", "_methods", "_dialect")

    def __init__(
        self, handler: Callable[..., Awaitable[None]], methods: tuple[str, ...], dialect: str = "chat"
    ):
        self._handler = handler
        self._methods = methods
        self._dialect = dialect

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._methods and scope["method"] not in self._methods:
            err = ProxyError(
                405, f"{scope['path']} accepts {', '.join(self._methods)}", code="method_not_allowed"
            )
            return await send_json(send, 405, error_body(self._dialect, err))
        await self._handler(scope, receive, send)


class K3App(Starlette):
    """Starlette routes everything; the three turn routes (POST, the hot path) are dispatched
    before its middleware stack, which they do not need: they answer every failure themselves."""

    def __init__(
        self, k3: K3, routes: list[Route], turns: dict[str, Callable[..., Awaitable[None]]], lifespan: Any
    ):
        middleware = []
        if k3.config.cors_origins:  # --cors-origin: those origins only, any method and header
            middleware.append(
                Middleware(
                    CORSMiddleware,
                    allow_origins=list(k3.config.cors_origins),
                    allow_methods=["*"],
                    allow_headers=["*"],
                )
            )
        super().__init__(routes=routes, lifespan=lifespan, middleware=middleware)
        self.state.k3 = k3
        # Turns skip the middleware stack, unless CORS headers must be added to their answers.
        self._turns = {} if middleware else turns

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            turn = self._turns.get(scope["path"])
            if turn is not None:
                return await turn(scope, receive, send)  # the turn writes its own access line
        if scope["type"] == "http" and access.isEnabledFor(logging.INFO) and scope["path"] not in TURN_ROUTES:
            return await _logged(super().__call__, scope, receive, send)
        await super().__call__(scope, receive, send)


async def _logged(app: Callable[..., Awaitable[None]], scope: Scope, receive: Receive, send: Send) -> None:
    """A side route with its access line (method, path, status, latency)."""
    started, status = time.perf_counter(), 500

    async def noting(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        await send(message)

    try:
        await app(scope, receive, noting)
    finally:
        latency_ms = (time.perf_counter() - started) * 1e3
        access.info(
            "%s %s %d %.1f ms", scope["method"], scope["path"], status, latency_ms,
            extra={"method": scope["method"], "path": scope["path"], "status": status,
                   "latency_ms": round(latency_ms, 1)},
        )  # fmt: skip


def create_app(config: Config, *, upstream_transport: httpx.AsyncBaseTransport | None = None) -> K3App:
    """The ASGI app. `upstream_transport` swaps the network for tests and benchmarks."""
    k3 = K3(config, upstream_transport)
    side = SideRoutes(k3)

    def turn_handler(dialect: str) -> Callable[..., Awaitable[None]]:
        async def handler(scope: Scope, receive: Receive, send: Send) -> None:
            await k3.turn(scope, receive, send, dialect)

        return handler

    turns = {path: turn_handler(dialect) for path, dialect in TURN_ROUTES.items()}
    routes = [
        *(Route(path, _Endpoint(turns[path], ("POST",), dialect)) for path, dialect in TURN_ROUTES.items()),
        Route("/v1/messages/count_tokens", _Endpoint(side.count_tokens, ("POST",), "anthropic")),
        Route("/v1/models", _Endpoint(side.models, ("GET",))),
        Route("/health", _Endpoint(side.health, ("GET",))),
        Route("/k3/presets", _Endpoint(side.presets_route, ("GET",))),
        Route("/k3/stats", _Endpoint(side.stats_route, ("GET",))),
        Route("/metrics", _Endpoint(side.metrics, ("GET",))),
        Route("/version", _Endpoint(side.version, ("GET",))),
        Route("/", _Endpoint(side.root, ("GET", "HEAD"))),
        Route("/{path:path}", _Endpoint(side.not_found, ())),
    ]

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await k3.drain.idle(SETTLE)  # a turn still ending may yet write the ledger: it closes last
        await k3.upstream.aclose()
        k3.memory.close()

    return K3App(k3, routes, turns, lifespan)
