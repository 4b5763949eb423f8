"""Overload and disconnects over real sockets: 429 with Retry-After when the queue is full; a client
that goes away (streaming or not) has its sequence cancelled and its cache freed."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.server.server_support import TIMEOUT_S, ServerThread, make_context

LONG = {"messages": [{"role": "user", "content": "go on"}], "max_tokens": 1800, "ignore_eos": True}


@pytest.fixture(scope="module")
def small_server():
    context = make_context(max_active=1, max_queue=1)
    with ServerThread(context) as running:
        yield running
    context.engine.close()


async def _until(condition):
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


def _freed(context):
    stats = context.scheduler.stats()
    return stats["active"] == 0 and stats["queued"] == 0 and context.engine.pool.in_use_bytes == 0


async def test_a_full_queue_answers_429_with_retry_after(small_server):
    scheduler = small_server.context.scheduler
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    async with httpx.AsyncClient(base_url=small_server.base_url, timeout=TIMEOUT_S) as client:
        # A long stream holds the only slot, one request waits behind it, then there is no room.
        async with client.stream("POST", "/v1/chat/completions", json={**LONG, "stream": True}) as running:
            assert running.status_code == 200
            await _until(lambda: scheduler.stats()["active"] == 1)
            waiting = asyncio.create_task(client.post("/v1/chat/completions", json=body))
            await _until(lambda: scheduler.stats()["queued"] == 1)
            rejected = await client.post("/v1/chat/completions", json=body)
            assert scheduler.stats()["active"] == 1  # still streaming: the 429 came while it held the slot
        # leaving the stream cancels it and frees the slot for the waiting request
        assert rejected.status_code == 429
        assert int(rejected.headers["retry-after"]) >= 1
        assert rejected.json()["error"]["code"] == "queue_full"
        assert (await waiting).status_code == 200


async def test_a_streaming_client_that_leaves_frees_its_sequence(small_server):
    context = small_server.context
    before = context.scheduler.stats()["cancelled"]
    async with httpx.AsyncClient(base_url=small_server.base_url, timeout=TIMEOUT_S) as client:
        async with client.stream("POST", "/v1/chat/completions", json={**LONG, "stream": True}) as r:
            assert r.status_code == 200
            chunks = 0
            async for line in r.aiter_lines():
                chunks += line.startswith("data: ")
                if chunks == 4:
                    break
            assert context.engine.pool.in_use_bytes > 0
    # the connection is closed here, long before 1800 tokens
    await _until(lambda: _freed(context))
    assert context.scheduler.stats()["cancelled"] == before + 1
    assert context.engine.pool.reserved_bytes == 0


async def test_a_waiting_client_that_leaves_frees_its_sequence(small_server):
    context = small_server.context
    before = context.scheduler.stats()["cancelled"]
    async with httpx.AsyncClient(base_url=small_server.base_url, timeout=TIMEOUT_S) as client:
        request = asyncio.create_task(client.post("/v1/chat/completions", json=LONG))
        await _until(
            lambda: context.scheduler.stats()["active"] == 1 and context.engine.pool.in_use_bytes > 0
        )
        request.cancel()  # drops the connection
        with pytest.raises(asyncio.CancelledError):
            await request
    await _until(lambda: _freed(context))
    assert context.scheduler.stats()["cancelled"] == before + 1
