"""The tap forwards requests unchanged, streams answers through, and records what happened."""

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from common.listen import serve_in_thread
from runners.conformance.tap import Tap


async def stream(request: Request) -> Response:
    body = await request.json()

    async def frames():
        yield b"event: message_start\ndata: {}\n\n"
        yield b"event: content_block_delta\nda"  # a frame split across network writes
        yield b"ta: {}\n\nevent: message_stop\ndata: {}\n\n"

    assert request.headers["x-api-key"] == "t" and body == {"a": 1}
    return StreamingResponse(frames(), media_type="text/event-stream")


async def chat_stream(request: Request) -> Response:
    async def frames():
        yield b'data: {"x": 1}\n\ndata: {"x": 2}\n\ndata: [DONE]\n\n'

    return StreamingResponse(frames(), media_type="text/event-stream")


async def broken(request: Request) -> Response:
    return JSONResponse({"error": {"message": "nope"}}, status_code=422)


TARGET = Starlette(
    routes=[
        Route("/v1/messages", stream, methods=["POST"]),
        Route("/v1/chat/completions", chat_stream, methods=["POST"]),
        Route("/v1/models", broken, methods=["GET"]),
    ]
)


def test_tap_records_events_statuses_and_error_bodies():
    with serve_in_thread(TARGET) as target:
        tap = Tap(target)
        with serve_in_thread(tap.app) as front, httpx.Client(base_url=front, timeout=10) as client:
            streamed = client.post("/v1/messages?beta=true", json={"a": 1}, headers={"x-api-key": "t"})
            assert streamed.status_code == 200 and "message_stop" in streamed.text
            assert client.post("/v1/chat/completions", json={}).text.endswith("data: [DONE]\n\n")
            assert client.get("/v1/models").status_code == 422
        first, second, third = tap.snapshot()
    assert (first.method, first.path, first.status) == ("POST", "/v1/messages?beta=true", 200)
    assert first.events == ["message_start", "content_block_delta", "message_stop"]
    assert second.events == ["data", "data", "[DONE]"]
    assert third.status == 422 and "nope" in third.error_body and "422" in third.line()
    tap.reset()
    assert tap.snapshot() == []


def test_tap_reports_an_unreachable_k3():
    tap = Tap("http://127.0.0.1:9")  # the discard port: nothing listens
    with serve_in_thread(tap.app) as front:
        assert httpx.get(front + "/v1/models", timeout=10).status_code == 502
    [hit] = tap.snapshot()
    assert hit.status == 599 and "could not reach k3" in hit.error_body
