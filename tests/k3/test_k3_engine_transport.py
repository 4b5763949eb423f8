"""k3.engine_transport: k3's keep-alive HTTP/1.1 transport to the engine, against the scripted
engine served by uvicorn on a real socket."""

from __future__ import annotations

import asyncio
import socket

import httpx
import orjson
import pytest

from k3.engine_transport import EngineTransport
from k3.testing.fake_upstream import FakeUpstream, Reply, serve_in_thread

CHAT = {"model": "kimi-linear", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def engine():
    fake = FakeUpstream()
    with serve_in_thread(fake, timeout_keep_alive=0.3) as base:
        yield fake, base


def _post(base: str, body: dict, timeout: float = 10) -> httpx.Request:
    raw = orjson.dumps(body)
    url = httpx.URL(base + "/chat/completions")
    headers = [(b"Host", url.netloc), (b"content-type", b"application/json"),
               (b"Content-Length", str(len(raw)).encode())]  # fmt: skip
    return httpx.Request("POST", url, headers=headers, stream=httpx.ByteStream(raw),
                         extensions={"timeout": {"connect": timeout, "read": timeout}})  # fmt: skip


async def _exchange(transport: EngineTransport, request: httpx.Request) -> tuple[int, list[bytes], dict]:
    response = await transport.handle_async_request(request)
    try:
        pieces = [piece async for piece in response.stream]  # type: ignore[union-attr]
    finally:
        await response.stream.aclose()  # type: ignore[union-attr]
    return response.status_code, pieces, dict(response.headers)


async def test_a_stream_comes_piece_by_piece_and_its_connection_serves_the_next_request(engine) -> None:
    fake, base = engine
    transport = EngineTransport()
    fake.push(Reply(content="abcdefghijklmnop", chunk_chars=4, delay=0.01), Reply(content="second"))
    status, pieces, headers = await _exchange(transport, _post(base, {**CHAT, "stream": True}))
    assert status == 200 and headers["content-type"] == "text/event-stream"
    assert len(pieces) > 3  # the engine's chunks, not one buffered body
    body = b"".join(pieces)
    assert body.endswith(b"data: [DONE]\n\n") and b'"abcd"' in body
    status, pieces, _ = await _exchange(transport, _post(base, CHAT))
    assert status == 200 and orjson.loads(b"".join(pieces))["choices"][0]["message"]["content"] == "second"
    assert transport.connections() == {"open": 1, "idle": 1}
    await transport.aclose()


async def test_an_error_status_comes_with_its_body_and_headers(engine) -> None:
    fake, base = engine
    transport = EngineTransport()
    fake.push(Reply(status=429, error="slow down"))
    status, pieces, _ = await _exchange(transport, _post(base, CHAT))
    assert status == 429 and b"slow down" in b"".join(pieces)
    await transport.aclose()


async def test_a_connection_the_engine_closed_while_idle_is_replaced_without_an_error(engine) -> None:
    fake, base = engine
    transport = EngineTransport()
    assert (await _exchange(transport, _post(base, CHAT)))[0] == 200
    await asyncio.sleep(0.8)  # past the engine's keep-alive timeout: it closes the idle connection
    assert (await _exchange(transport, _post(base, CHAT)))[0] == 200
    assert transport.connections()["open"] == 1
    await transport.aclose()


async def test_an_engine_that_is_not_there_is_a_connect_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    with pytest.raises(httpx.ConnectError):
        await EngineTransport().handle_async_request(_post(f"http://127.0.0.1:{port}/v1", CHAT))


async def test_silence_longer_than_the_read_timeout_is_a_read_timeout(engine) -> None:
    fake, base = engine
    transport = EngineTransport()
    fake.push(Reply(content="late", delay=2.0))
    with pytest.raises(httpx.ReadTimeout):
        await _exchange(transport, _post(base, CHAT, timeout=0.3))
    assert transport.connections()["open"] == 0  # a timed-out connection is not reused
    await transport.aclose()


async def test_an_engine_that_drops_the_connection_mid_stream_is_a_read_error(engine) -> None:
    fake, base = engine
    transport = EngineTransport()
    fake.push(Reply(content="x" * 64, drop_after=3))
    with pytest.raises(httpx.ReadError):
        await _exchange(transport, _post(base, {**CHAT, "stream": True}))
    assert transport.connections()["open"] == 0
    await transport.aclose()


async def test_a_response_left_unread_or_cancelled_closes_its_connection(engine) -> None:
    fake, base = engine
    transport = EngineTransport()
    fake.push(Reply(content="y" * 400, chunk_chars=8, delay=0.05))
    response = await transport.handle_async_request(_post(base, {**CHAT, "stream": True}))
    reader = asyncio.ensure_future(anext(aiter(response.stream)))  # type: ignore[arg-type]
    await reader
    await response.stream.aclose()  # type: ignore[union-attr]
    assert transport.connections() == {"open": 0, "idle": 0}
    assert await asyncio.to_thread(fake.disconnected.wait, 5)  # the engine saw k3 go
    await transport.aclose()


async def test_requests_beyond_the_connection_limit_wait_for_a_free_connection(engine) -> None:
    fake, base = engine
    transport = EngineTransport(max_connections=2)
    fake.push(*(Reply(content=f"r{i}", delay=0.05) for i in range(6)))
    most = 0

    async def one() -> int:
        nonlocal most
        response = await transport.handle_async_request(_post(base, CHAT))
        most = max(most, transport.connections()["open"])
        await response.aread()
        await response.aclose()
        return response.status_code

    assert await asyncio.gather(*(one() for _ in range(6))) == [200] * 6
    assert most == 2 and transport.connections()["open"] <= 2
    await transport.aclose()


async def test_httpx_clients_work_over_it(engine) -> None:
    fake, base = engine
    async with httpx.AsyncClient(transport=EngineTransport()) as client:
        response = await client.get(base + "/models")
    assert response.status_code == 200 and response.json()["data"][0]["id"] == "kimi-linear"
