"""An httpx transport that streams an in-process ASGI app's response as it is produced.

httpx's own ASGITransport buffers the whole response before returning it, so it cannot show
keep-alives arriving, nor let a client hang up mid-stream. With this one, closing the response
early delivers `http.disconnect` to the app, as a real server does when the socket closes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx


class _Body(httpx.AsyncByteStream):
    def __init__(self, queue: asyncio.Queue[bytes | None], task: asyncio.Task[None], hangup: asyncio.Event):
        self._queue = queue
        self._task = task
        self._hangup = hangup

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            chunk = await self._queue.get()
            if chunk is None:
                return
            if chunk:
                yield chunk

    async def aclose(self) -> None:
        self._hangup.set()
        try:
            await asyncio.wait_for(asyncio.shield(self._task), 10)
        except Exception:  # the app's own failure is not the client's to raise on close
            pass


class StreamingASGITransport(httpx.AsyncBaseTransport):
    def __init__(self, app: Any):
        self.app = app

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = b"".join([part async for part in request.stream])  # type: ignore[union-attr]
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": request.method,
            "headers": [(k.lower(), v) for k, v in request.headers.raw],
            "scheme": request.url.scheme,
            "path": request.url.path,
            "raw_path": request.url.raw_path.split(b"?")[0],
            "query_string": request.url.query,
            "server": (request.url.host, request.url.port),
            "client": ("127.0.0.1", 1),
            "root_path": "",
        }
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        started: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        hangup = asyncio.Event()
        body_sent = False

        async def receive() -> dict[str, Any]:
            nonlocal body_sent
            if not body_sent:
                body_sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await hangup.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                started.set_result(message)
            elif message["type"] == "http.response.body":
                queue.put_nowait(message.get("body", b""))
                if not message.get("more_body", False):
                    queue.put_nowait(None)

        task = asyncio.ensure_future(self.app(scope, receive, send))
        task.add_done_callback(lambda _: queue.put_nowait(None))
        await asyncio.wait({started, task}, return_when=asyncio.FIRST_COMPLETED)
        if not started.done():
            task.result()  # re-raise the app's exception
            raise RuntimeError("the ASGI app returned without starting a response")
        start = started.result()
        return httpx.Response(
            start["status"], headers=start.get("headers", []), stream=_Body(queue, task, hangup)
        )
