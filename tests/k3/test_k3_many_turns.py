"""k3 at the scale agents use it: hundreds of streamed turns through one k3 over real sockets.

The defect these guard against: every streamed turn that outlived the hang-up watch's first tick
(50 ms) was taken for a client hang-up once its response was complete (uvicorn's `receive()`
answers `http.disconnect` then), and the cancellation cut the close of its engine response short,
leaving the connection checked out of the pool. After 256 such turns k3 stopped serving.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import psutil
import pytest
from k3_helpers import anthropic_stream

from k3.app import create_app
from k3.cancel import closing, may_cancel
from k3.config import Config
from k3.connection import Hangup
from k3.testing.fake_upstream import FakeUpstream, Reply, serve_in_thread

TURNS = 600
CLIENTS = 32  # concurrent clients: 600 turns of 0.2 s in about 4 s
STREAM_S = 0.2

BODIES = {
    "/v1/messages": {"model": "claude-sonnet-4", "max_tokens": 64, "stream": True},
    "/v1/chat/completions": {"model": "kimi-linear", "stream": True},
    "/v1/responses": {"model": "gpt-5-codex", "stream": True, "input": "hello"},
}


def _body(path: str) -> dict:
    body = dict(BODIES[path])
    if path != "/v1/responses":
        body["messages"] = [{"role": "user", "content": "hello"}]
    return body


def _engine_connections(port: int) -> int:
    """Established TCP connections the engine (this process, listening on `port`) holds open."""
    return sum(
        1
        for c in psutil.Process().net_connections(kind="tcp")
        if c.laddr and c.laddr.port == port and c.status == psutil.CONN_ESTABLISHED
    )


@pytest.fixture
def servers() -> Iterator[tuple[FakeUpstream, str, str, object]]:
    """A fake engine and one k3 in front of it, each served by uvicorn on its own socket."""
    fake = FakeUpstream()
    with serve_in_thread(fake) as engine:
        app = create_app(Config(upstream=engine))
        with serve_in_thread(app) as k3_base:
            yield fake, engine, k3_base.removesuffix("/v1"), app


def _slow_reply() -> Reply:
    # 16 characters in slices of 8, plus role, finish and usage chunks: about five chunks of 40 ms.
    return Reply(content="x" * 16, chunk_chars=8, delay=STREAM_S / 5)


async def _turns(k3: str, n: int, clients: int) -> list[int]:
    """`n` streamed turns from `clients` keep-alive clients, rotating the three dialects."""
    paths = list(BODIES)
    statuses: list[int] = []
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(n):
        queue.put_nowait(i)

    async def client() -> None:
        async with httpx.AsyncClient(base_url=k3, timeout=10) as http:
            while not queue.empty():
                i = queue.get_nowait()
                path = paths[i % len(paths)]
                response = await http.post(path, json=_body(path))
                statuses.append(response.status_code)

    await asyncio.gather(*(client() for _ in range(clients)))
    return statuses


async def test_600_streamed_turns_leave_no_engine_connection_behind(servers) -> None:
    fake, engine, k3, app = servers
    fake.push(*(_slow_reply() for _ in range(TURNS)))
    statuses = await _turns(k3, TURNS, CLIENTS)
    assert statuses == [200] * TURNS
    await asyncio.sleep(0.7)  # the last turns finish closing after their clients got the last byte
    port = int(engine.rsplit(":", 1)[1].split("/")[0])
    # k3 keeps at most one idle connection per concurrent client; leaked ones would be ~600.
    assert _engine_connections(port) <= CLIENTS
    async with httpx.AsyncClient(base_url=k3, timeout=10) as http:
        everything = (await http.get("/k3/stats")).json()
    pool, stats = everything["upstream_connections"], everything["counters"]
    assert pool["open"] == pool["idle"] <= CLIENTS  # none left checked out
    assert stats["streamed"] == TURNS
    assert stats["disconnects"] == 0  # a completed response is not a hang-up


async def test_keep_alive_connections_to_the_engine_are_reused(servers) -> None:
    fake, engine, k3, app = servers
    fake.push(*(_slow_reply() for _ in range(20)))
    assert await _turns(k3, 20, 1) == [200] * 20
    await asyncio.sleep(0.3)
    # One client, one turn at a time: one engine connection, used for all 20.
    assert app.state.k3.upstream.transport.connections() == {"open": 1, "idle": 1}  # type: ignore[attr-defined]
    port = int(engine.rsplit(":", 1)[1].split("/")[0])
    assert _engine_connections(port) == 1


async def test_every_client_cut_mid_stream_closes_its_engine_response(servers) -> None:
    fake, engine, k3, app = servers
    cuts = 12
    # Long streams (about 6 s) that the clients leave after their first event.
    fake.push(*(Reply(content="y" * 240, chunk_chars=8, delay=0.2) for _ in range(cuts)))
    for n in range(cuts):
        fake.disconnected.clear()
        async with httpx.AsyncClient(base_url=k3, timeout=10) as http:
            path = list(BODIES)[n % 3]
            async with http.stream("POST", path, json=_body(path)) as response:
                assert response.status_code == 200
                async for _ in response.aiter_raw():
                    break  # the client hangs up
        assert await asyncio.to_thread(fake.disconnected.wait, 5), f"cut {n}: engine response left open"
    await asyncio.sleep(0.3)
    pool = app.state.k3.upstream.transport.connections()  # type: ignore[attr-defined]
    assert pool["open"] == pool["idle"]
    async with httpx.AsyncClient(base_url=k3, timeout=10) as http:
        stats = (await http.get("/k3/stats")).json()["counters"]
        # k3 still serves after all the cuts, and counted each of them once.
        fake.push(Reply(content="still here"))
        reply = await http.post("/v1/messages", json=_body("/v1/messages"))
    assert stats["disconnects"] == cuts
    assert anthropic_stream(reply.text).content[0].text == "still here"


async def test_a_hang_up_while_the_turn_closes_its_engine_response_does_not_cancel_it() -> None:
    disconnect = asyncio.Event()
    closed = asyncio.Event()

    async def receive() -> dict:
        await disconnect.wait()
        return {"type": "http.disconnect"}

    async def close() -> None:
        disconnect.set()  # the client hangs up just as the close begins
        await asyncio.sleep(0.05)  # the watch runs meanwhile
        closed.set()

    async def turn() -> None:
        hangup = Hangup(asyncio.current_task(), receive)  # type: ignore[arg-type]
        hangup.start()
        await asyncio.sleep(0)
        await closing(close)
        assert hangup.hung_up  # noted, for the disconnect count

    await turn()  # a cancellation would raise CancelledError here
    assert closed.is_set()


async def test_outside_a_close_a_hang_up_cancels_the_turn() -> None:
    async def receive() -> dict:
        return {"type": "http.disconnect"}

    async def turn() -> None:
        hangup = Hangup(asyncio.current_task(), receive)  # type: ignore[arg-type]
        assert may_cancel(asyncio.current_task())  # type: ignore[arg-type]
        hangup.start()
        await asyncio.sleep(1)

    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(turn(), 5)
