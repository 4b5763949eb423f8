"""k3's HTTP/1.1 transport to a plain-HTTP engine: keep-alive connections on asyncio protocols,
responses parsed by httptools (uvicorn's C parser).

Why not httpcore's pool: on every request and every response close it walks all its connections
and asks each idle one whether its socket is readable (a poll call through anyio's attribute
machinery), so k3's CPU per turn grew with the number of clients; and its close awaits, so a
cancellation could cut it short. Here a request takes the most recently used idle connection,
and closing a response is synchronous: it returns the connection to the pool when the response
was read to its end and the engine keeps the connection alive, and closes the socket otherwise.

An `httpx.AsyncBaseTransport`, so k3's upstream code and the tests' in-process transports stay one
interface; errors are httpx's (ConnectError, ConnectTimeout, ReadTimeout, ReadError,
RemoteProtocolError), which k3.upstream maps to 502/504. HTTPS engines use httpx's own transport.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator

import httptools
import httpx

PAUSE_ABOVE = 4 << 20  # unread response bytes at which the socket stops being read


class _Connection(asyncio.Protocol):
    """One keep-alive connection; one exchange at a time."""

    def __init__(self, key: tuple[str, int]) -> None:
        self.key = key  # (host, port) as the requests name it: the pool it returns to
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.error: Exception | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_done = False
        self.complete = False
        self.keep_alive = False
        self.got_bytes = False
        self._pieces: deque[bytes] = deque()
        self._buffered = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None

    # -- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(httpx.RemoteProtocolError(f"the engine broke HTTP/1.1: {exc}"))

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.complete:
            self._fail(httpx.ReadError(f"the engine closed the connection: {exc}" if exc else
                                       "the engine closed the connection before the response ended"))  # fmt: skip

    # -- httptools callbacks -----------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self.head_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._pieces.append(body)
        self._buffered += len(body)
        if self._buffered > PAUSE_ABOVE and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = self._parser.should_keep_alive()  # read here: the parser moves on after
        self._wake()

    # -- the exchange ----------------------------------------------------------------------------

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: Exception) -> None:
        if self.error is None:
            self.error = error
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)
        self.close()

    async def wait(self, timeout: float | None) -> None:
        """Until the parser made progress (or the timeout passed: ReadTimeout, connection closed)."""
        if self.error is not None:
            raise self.error
        loop = asyncio.get_running_loop()
        self._waiter = waiter = loop.create_future()
        timer = None if timeout is None else loop.call_later(timeout, self._timed_out, waiter, timeout)
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    def _timed_out(self, waiter: asyncio.Future[None], timeout: float) -> None:
        if not waiter.done():
            self._fail(httpx.ReadTimeout(f"no bytes from the engine for {timeout:g} s"))

    def take(self) -> bytes | None:
        """The next body piece, or None when none is buffered."""
        if not self._pieces:
            return None
        piece = self._pieces.popleft()
        self._buffered -= len(piece)
        if self._paused and self._buffered <= PAUSE_ABOVE // 2 and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return piece

    def reusable(self) -> bool:
        return self.complete and self.keep_alive and not self.closed and self.error is None

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class _Body(httpx.AsyncByteStream):
    """A response body as it arrives; `aclose` (synchronous inside) gives the connection back."""

    def __init__(self, pool: EngineTransport, connection: _Connection, read_timeout: float | None):
        self._pool = pool
        self._connection = connection
        self._timeout = read_timeout
        self._closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        connection = self._connection
        while True:
            piece = connection.take()
            if piece is not None:
                yield piece
            elif connection.complete:
                return
            else:
                await connection.wait(self._timeout)

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._pool._release(self._connection)


class EngineTransport(httpx.AsyncBaseTransport):
    """Keep-alive HTTP/1.1 connections to one plain-HTTP engine (any origin the requests name)."""

    def __init__(self, max_connections: int = 256, max_idle: int = 256):
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._open = 0
        self._max = max_connections
        self._max_idle = max_idle
        self._slots: deque[asyncio.Future[None]] = deque()  # requests waiting for a connection slot

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if url.scheme != "http":
            raise httpx.UnsupportedProtocol(f"EngineTransport speaks plain HTTP, not {url.scheme}")
        timeouts = request.extensions.get("timeout", {})
        body = b"".join([part async for part in request.stream])  # type: ignore[union-attr]
        head = [b"%s %s HTTP/1.1\r\n" % (request.method.encode(), url.raw_path)]
        head += [b"%s: %s\r\n" % (k, v) for k, v in request.headers.raw]
        message = b"".join(head) + b"\r\n" + body
        key = (url.host, url.port or 80)
        for attempt in range(2):
            connection, reused = await self._acquire(key, timeouts.get("connect"))
            assert connection.transport is not None
            connection.transport.write(message)
            try:
                while not connection.head_done:
                    await connection.wait(timeouts.get("read"))
            except (httpx.ReadError, httpx.RemoteProtocolError):
                self._release(connection)
                if reused and not connection.got_bytes and attempt == 0:
                    continue  # the engine had closed this idle connection: once more on a new one
                raise
            except BaseException:
                self._release(connection)
                raise
            stream = _Body(self, connection, timeouts.get("read"))
            return httpx.Response(connection.status, headers=connection.headers, stream=stream,
                                  extensions={"http_version": b"HTTP/1.1"})  # fmt: skip
        raise AssertionError("unreachable")

    def _idle_one(self, key: tuple[str, int]) -> _Connection | None:
        """The most recently used idle connection to `key` the engine has not closed meanwhile."""
        idle = self._idle.get(key)
        while idle:
            connection = idle.pop()
            if not connection.closed:
                connection._reset()
                return connection
            self._open -= 1
        return None

    async def _acquire(self, key: tuple[str, int], connect_timeout: float | None) -> tuple[_Connection, bool]:
        """-> (a connection, whether it served an exchange before)."""
        if (connection := self._idle_one(key)) is not None:
            return connection, True
        while self._open >= self._max:
            slot = asyncio.get_running_loop().create_future()
            self._slots.append(slot)
            try:
                await slot
            finally:
                if slot in self._slots:
                    self._slots.remove(slot)
            if (connection := self._idle_one(key)) is not None:  # one came back while we waited
                return connection, True
        self._open += 1
        try:
            loop = asyncio.get_running_loop()
            async with asyncio.timeout(connect_timeout):
                _, connection = await loop.create_connection(lambda: _Connection(key), *key)
        except TimeoutError:
            self._open -= 1
            self._wake_one()
            raise httpx.ConnectTimeout(
                f"connecting to {key[0]}:{key[1]} took over {connect_timeout:g} s"
            ) from None
        except OSError as exc:
            self._open -= 1
            self._wake_one()
            raise httpx.ConnectError(f"{exc.strerror or exc} ({key[0]}:{key[1]})") from exc
        except BaseException:
            self._open -= 1
            self._wake_one()
            raise
        return connection, False

    def _release(self, connection: _Connection) -> None:
        """A finished exchange: keep its connection for the next request, or close it."""
        idle = self._idle.setdefault(connection.key, []) if connection.reusable() else None
        if idle is not None and len(idle) < self._max_idle:
            idle.append(connection)
        else:
            connection.close()
            self._open -= 1
        self._wake_one()

    def _wake_one(self) -> None:
        while self._slots:
            slot = self._slots.popleft()
            if not slot.done():
                slot.set_result(None)
                return

    def connections(self) -> dict[str, int]:
        """How many connections are open, and how many of them wait idle for the next request."""
        return {"open": self._open, "idle": sum(len(idle) for idle in self._idle.values())}

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()
        self._open = 0
