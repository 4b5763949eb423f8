"""The one pooled HTTP client to the engine, and the mapping of its failures to ProxyError.

502: the engine cannot be reached or broke the protocol; 504: it timed out (connect or read:
the read timeout is the longest silence allowed between two chunks); an engine 4xx/5xx passes
through with its own status and message.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import httpx
import orjson

from k3.cancel import closing
from k3.config import Config
from k3.engine_transport import EngineTransport
from k3.errors import ProxyError
from k3.sse import LineTooLong, SSEDecoder

_ERROR_BODY_LIMIT = 64 * 1024
DRAIN_AFTER_DONE = 0.5  # seconds to wait for the end of a body after `[DONE]` before cutting it


def upstream_message(status: int, raw: bytes) -> tuple[str, str | None]:
    """The engine's own error message (OpenAI, vLLM, llama.cpp and FastAPI shapes), else its text; and
    the request field it blamed (OpenAI's `param`), when it named one."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = None
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            param = error.get("param")
            return error["message"], param if isinstance(param, str) else None
        for value in (error, body.get("message"), body.get("detail")):
            if isinstance(value, str):
                return value, None
    text = raw[:2000].decode("utf-8", "replace").strip()
    return text or f"upstream returned HTTP {status} with an empty body", None


_PASSED_HEADERS = ("retry-after", "retry-after-ms")  # when to try again: the client's SDK reads them


def _status_error(response: httpx.Response, raw: bytes) -> ProxyError:
    """An engine 4xx/5xx with its own status and message, and its Retry-After for the client."""
    message, param = upstream_message(response.status_code, raw)
    headers = [
        (name.encode(), response.headers[name].encode())
        for name in _PASSED_HEADERS
        if name in response.headers
    ]
    if "retry-after" in response.headers:
        message += f" (retry after {response.headers['retry-after']})"
    return ProxyError(response.status_code, message, code="upstream_error", param=param, headers=headers)


def _transport_error(exc: Exception, url: str) -> ProxyError:
    if isinstance(exc, httpx.TimeoutException):
        return ProxyError(504, f"upstream timed out ({type(exc).__name__}) at {url}", code="upstream_timeout")
    if isinstance(exc, httpx.ConnectError):
        return ProxyError(502, f"cannot reach the upstream at {url}: {exc}", code="upstream_unreachable")
    return ProxyError(
        502, f"upstream connection failed at {url}: {type(exc).__name__}: {exc}", code="upstream_error"
    )


def _protocol_error(message: str) -> ProxyError:
    return ProxyError(502, message, code="upstream_protocol")


def _excerpt(data: bytes, limit: int = 120) -> str:
    text = data[:limit].decode("utf-8", "replace")
    return repr(text + ("..." if len(data) > limit else ""))


def _stream_error(chunk: dict[str, Any]) -> ProxyError:
    """An `{"error": ...}` object sent inside the SSE stream (vLLM does this on failures)."""
    error = chunk["error"]
    message = error.get("message") if isinstance(error, dict) else error
    code = error.get("code") if isinstance(error, dict) else None
    status = code if isinstance(code, int) and 400 <= code < 600 else 502
    return ProxyError(status, str(message or "upstream reported an error mid-stream"), code="upstream_error")


class _ChunkReader:
    """SSE payloads -> chunk objects; notes `[DONE]`, whether a finish_reason was seen, and the
    error that ends the stream: an error chunk, a payload that is not a JSON object, or `[DONE]`
    before any finish_reason (each raised after the chunks before it are passed on)."""

    __slots__ = ("done", "finished", "error")

    def __init__(self) -> None:
        self.done = False
        self.finished = False
        self.error: ProxyError | None = None

    def parse(self, payloads: list[bytes]) -> list[dict[str, Any]]:
        batch = []
        for data in payloads:
            if data == b"[DONE]":
                if self.finished:
                    self.done = True
                else:  # the engine stopped without saying why: not a normal end
                    self.error = _protocol_error("upstream ended the stream ([DONE]) without a finish_reason")
                break
            try:
                chunk = orjson.loads(data)
            except orjson.JSONDecodeError:
                chunk = None
            if not isinstance(chunk, dict):  # a cut or garbled chunk: part of the reply is lost
                self.error = _protocol_error(
                    f"upstream sent an SSE event that is not a JSON object: {_excerpt(data)}"
                )
                break
            if "error" in chunk and not chunk.get("choices"):
                self.error = _stream_error(chunk)  # raised after the chunks before it are passed on
                break
            if not self.finished:
                choices = chunk.get("choices")
                self.finished = bool(
                    choices and isinstance(choices[0], dict) and choices[0].get("finish_reason")
                )
            batch.append(chunk)
        return batch


class Chunks:
    """One streaming chat completion: `async with upstream.stream(body) as chunks`, then
    `async for batch in chunks`. Batches hold the chunk objects of one network read: what arrived
    together is translated and written together. Status errors raise on entry, before any chunk,
    so the caller can still answer with a plain JSON error. `done` turns true as the batch that
    carried the engine's `[DONE]` is handed out, so the caller knows that batch is the last one.
    (A class, not a generator-based context manager: this is on every streamed turn's path.)"""

    __slots__ = ("_upstream", "_body", "_response", "_pieces", "_batches", "_reader")

    def __init__(self, upstream: Upstream, body: bytes):
        self._upstream = upstream
        self._body = body
        self._reader = _ChunkReader()

    async def __aenter__(self) -> Chunks:
        upstream = self._upstream
        try:
            response = await upstream.transport.handle_async_request(upstream.chat_request(self._body))
        except httpx.TransportError as exc:
            raise _transport_error(exc, upstream.chat_url) from exc
        if response.status_code >= 400:
            raw = b""
            try:
                async for piece in response.stream:  # type: ignore[union-attr]
                    raw += piece
                    if len(raw) > _ERROR_BODY_LIMIT:
                        break
            except httpx.TransportError:
                pass  # the status is the message; a cut error body does not change it
            finally:
                await closing(response.stream.aclose)  # type: ignore[union-attr]
            raise _status_error(response, raw)
        self._response = response
        # Closed by _close, not left to the garbage collector: an async generator abandoned at
        # `[DONE]` is finalised by a task the loop schedules through its self-pipe.
        self._pieces = aiter(response.stream)  # type: ignore[arg-type]
        self._batches = upstream._batches(self._pieces, self._reader)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await closing(self._close)

    async def _close(self) -> None:
        try:
            if self._reader.done:
                await self._drain()
            await self._batches.aclose()
        finally:
            await self._response.stream.aclose()  # type: ignore[union-attr]

    async def _drain(self) -> None:
        """Read the body's end after `[DONE]` (the chunked terminator, normally the next read), so
        the connection goes back to the pool: a response closed unread costs the next turn a new
        connection to the engine. An engine that keeps talking after `[DONE]` is cut off."""
        try:
            async with asyncio.timeout(DRAIN_AFTER_DONE):
                async for _ in self._pieces:
                    pass
        except (TimeoutError, httpx.TransportError):
            pass  # the connection is closed instead of reused; the reply is complete either way

    def __aiter__(self) -> AsyncGenerator[list[dict[str, Any]], None]:
        return self._batches

    @property
    def done(self) -> bool:
        return self._reader.done


class Upstream:
    """One pooled `httpx.AsyncClient`. Chat completions, the hot path, go straight to the client's
    transport (its connection pool) with a prepared request, and read the raw body stream: the
    client layer's URL merging, cookie jar, auth, redirect and decoding machinery is not needed
    there (k3 sends no Accept-Encoding, so bodies come uncompressed) and costs more than the rest
    of a turn's translation; responses are closed through their transport stream, which is what
    `Response.aclose` does under a context that only annotates errors for the client layer.
    Side calls (/models, /tokenize) use the client itself."""

    def __init__(self, config: Config, transport: httpx.AsyncBaseTransport | None = None):
        self.base = config.upstream_base
        self.max_sse_line = config.max_sse_line_bytes
        self.chat_url = self.base + "/chat/completions"
        headers = {"content-type": "application/json"}
        if config.upstream_api_key:
            headers["authorization"] = f"Bearer {config.upstream_api_key}"
        elif config.upstream_credentials is not None:
            pair = ":".join(config.upstream_credentials).encode()
            headers["authorization"] = "Basic " + base64.b64encode(pair).decode()
        timeout = httpx.Timeout(config.read_timeout, connect=config.connect_timeout)
        if transport is None and self.base.startswith("http://"):
            transport = EngineTransport()
        elif transport is None:  # an HTTPS engine: httpx's own pool
            limits = httpx.Limits(max_connections=256, max_keepalive_connections=64, keepalive_expiry=60)
            transport = httpx.AsyncHTTPTransport(limits=limits)
        self.transport = transport
        self.client = httpx.AsyncClient(headers=headers, timeout=timeout, transport=self.transport)
        self._chat_url = httpx.URL(self.chat_url)
        # A request built from a stream gets no automatic headers: Host comes from here.
        self._headers = [(b"Host", self._chat_url.netloc)] + [
            (k.encode(), v.encode()) for k, v in headers.items()
        ]
        self._extensions = {"timeout": timeout.as_dict()}
        # Server root for the tokenizer endpoints (vLLM and llama.cpp serve /tokenize there, not under /v1).
        self.root = self.base[: -len("/v1")] if self.base.endswith("/v1") else self.base
        self.tokenizer: str | None = None  # "vllm" | "llama.cpp" | "none", learned on first use

    async def aclose(self) -> None:
        await self.client.aclose()

    def chat_request(self, body: bytes) -> httpx.Request:
        """The prepared POST of a chat payload, for `transport.handle_async_request`."""
        headers = [*self._headers, (b"Content-Length", str(len(body)).encode())]
        return httpx.Request(
            "POST",
            self._chat_url,
            headers=headers,
            stream=httpx.ByteStream(body),
            extensions=self._extensions,
        )

    async def complete(self, body: bytes) -> dict[str, Any]:
        """Non-streaming chat completion."""
        try:
            response = await self.transport.handle_async_request(self.chat_request(body))
            try:
                content = b"".join([piece async for piece in response.stream])  # type: ignore[union-attr]
            finally:
                await closing(response.stream.aclose)  # type: ignore[union-attr]
        except httpx.TransportError as exc:
            raise _transport_error(exc, self.chat_url) from exc
        if response.status_code >= 400:
            raise _status_error(response, content)
        try:
            completion = orjson.loads(content)
        except orjson.JSONDecodeError:
            raise _protocol_error("upstream sent a body that is not JSON") from None
        if not isinstance(completion, dict):
            raise _protocol_error("upstream sent JSON that is not an object")
        return completion

    def stream(self, body: bytes) -> Chunks:
        """Streaming chat completion (see Chunks)."""
        return Chunks(self, body)

    async def _batches(
        self, pieces: AsyncIterator[bytes], reader: _ChunkReader
    ) -> AsyncGenerator[list[dict[str, Any]], None]:
        decoder = SSEDecoder(self.max_sse_line)
        try:
            try:
                async for raw in pieces:
                    batch = reader.parse(decoder.feed(raw))
                    if batch:
                        yield batch
                    if reader.error is not None:
                        raise reader.error
                    if reader.done:
                        return
                batch = reader.parse(decoder.finish())
                if batch:
                    yield batch
                if reader.error is not None:
                    raise reader.error
            finally:
                close = getattr(pieces, "aclose", None)
                if close is not None and not reader.done:  # after [DONE], Chunks drains it first
                    await close()
        except httpx.TransportError as exc:
            raise _transport_error(exc, self.chat_url) from exc
        except LineTooLong as exc:
            raise _protocol_error(
                f"upstream sent an SSE line over the {exc.limit}-byte limit (k3 serve --max-sse-line-mb)"
            ) from None
        if not (reader.done or reader.finished):
            raise _protocol_error("upstream stream ended before the completion finished")

    async def models(self) -> list[str]:
        """GET /models: the engine's model ids (for doctor and /health)."""
        url = self.base + "/models"
        try:
            response = await self.client.get(url, timeout=10.0)
        except httpx.TransportError as exc:
            raise _transport_error(exc, url) from exc
        if response.status_code >= 400:
            raise _status_error(response, response.content)
        try:
            data = orjson.loads(response.content).get("data", [])
            return [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]
        except (orjson.JSONDecodeError, AttributeError, TypeError):
            raise _protocol_error("upstream /models is not an OpenAI model list") from None

    async def engine_name(self) -> str | None:
        """The engine's name from GET /version at the server root (kimi-engine answers it), else None."""
        try:
            response = await self.client.get(self.root + "/version", timeout=10.0)
            name = orjson.loads(response.content).get("name") if response.status_code == 200 else None
        except (httpx.TransportError, orjson.JSONDecodeError, AttributeError):
            return None
        return name if isinstance(name, str) else None

    async def count_tokens(self, payload: dict[str, Any]) -> int | None:
        """Exact prompt tokens from the engine's tokenizer endpoint, or None when it has none.

        vLLM: POST /tokenize {model, messages, tools} -> {count}. llama.cpp: POST /apply-template
        {messages} -> {prompt}, then POST /tokenize {content} -> {tokens}. The kind that answers
        is remembered; an engine with neither is not asked again.
        """
        if self.tokenizer == "none":
            return None
        try:
            if self.tokenizer in (None, "vllm"):
                body = {
                    "model": payload["model"],
                    "messages": payload["messages"],
                    "add_generation_prompt": True,
                }
                if payload.get("tools"):
                    body["tools"] = payload["tools"]
                count = await self._post_json(self.root + "/tokenize", body)
                if isinstance(count, dict) and isinstance(count.get("count"), int):
                    self.tokenizer = "vllm"
                    return count["count"]
            templated = await self._post_json(
                self.root + "/apply-template", {"messages": payload["messages"]}
            )
            if isinstance(templated, dict) and isinstance(templated.get("prompt"), str):
                tokens = await self._post_json(self.root + "/tokenize", {"content": templated["prompt"]})
                if isinstance(tokens, dict) and isinstance(tokens.get("tokens"), list):
                    self.tokenizer = "llama.cpp"
                    return len(tokens["tokens"])
        except (httpx.TransportError, ProxyError):
            return None  # transient: try again next time
        self.tokenizer = "none"
        return None

    async def _post_json(self, url: str, body: dict[str, Any]) -> Any:
        response = await self.client.post(url, content=orjson.dumps(body), timeout=10.0)
        if response.status_code >= 500:
            raise ProxyError(response.status_code, "tokenizer endpoint failed")
        if response.status_code >= 400:
            return None
        try:
            return orjson.loads(response.content)
        except orjson.JSONDecodeError:
            return None
