"""The OpenAI-compatible HTTP API over the scheduler (Starlette).

Routes: POST /v1/chat/completions (JSON or SSE), GET /v1/models, GET /health, POST /tokenize (vLLM's
form, {messages} or {prompt} -> {count, tokens, max_model_len}; k3's count_tokens uses it), GET /metrics
(Prometheus) and GET /version. With an API key every route but /health, /metrics and /version needs
`Authorization: Bearer KEY` (engine.server.observe). The event
loop only parses, renders templates (in a worker thread) and relays events: the model runs on the
scheduler's executor thread. A client that disconnects has its sequence cancelled and freed at once.
Every error is OpenAI-shaped JSON; bad input is a 4xx, a full queue a 429 with Retry-After.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import orjson
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from engine import VERSION
from engine.model import SamplingParams
from engine.runtime import Engine, Failed, Finished, QueueFull, Scheduler, Started, Token
from engine.runtime import Request as GenerationRequest
from engine.server.chat_template import ChatTemplate, ChatTemplateError
from engine.server.observe import Metrics, Observed
from engine.server.protocol import ApiError, ChatRequest, bad_request, normalize_messages, parse_chat_request
from engine.server.scripted import ScriptedReplies
from engine.server.text import Delta, OutputText

STOP_TOKEN_NAMES = ("<|im_end|>", "[EOS]", "[EOT]")
_FAILURE_STATUS = {"memory": 503, "invalid": 400, "shutdown": 503, "internal": 500}


@dataclass
class ServerContext:
    engine: Engine
    scheduler: Scheduler
    template: ChatTemplate
    model_name: str
    scripted: ScriptedReplies | None = None

    def __post_init__(self) -> None:
        tok = self.engine.tokenizer
        stops = {i for i in (tok.eos_id, self.engine.model.config.eos_token_id) if i is not None}
        stops |= {tok.special_tokens[name] for name in STOP_TOKEN_NAMES if name in tok.special_tokens}
        self.stop_token_ids = frozenset(stops)
        self.created = int(time.time())

    def encode_chat(self, messages: list[dict], tools: list[dict] | None, add_generation_prompt=True):
        """(prompt text, token ids) of a conversation; runs in a worker thread (long prompts take a while)."""
        text = self.template.render(messages, tools=tools, add_generation_prompt=add_generation_prompt)
        return text, self.engine.tokenizer.encode(text, allow_special=True)


def json_response(data, status: int = 200, headers: dict | None = None) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json", headers=headers)


def error_response(error: ApiError) -> Response:
    return json_response(error.body(), error.status, error.headers)


async def read_json(request: Request):
    body = await request.body()
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise bad_request(f"the body is not valid JSON: {e}") from None


# ---------------------------------------------------------------------------- events from the executor


class EventStream:
    """The executor's events for one request, delivered onto the event loop; None marks a disconnect."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue = asyncio.Queue()

    def sink(self, event) -> None:  # called on the executor thread
        self._loop.call_soon_threadsafe(self._queue.put_nowait, event)

    def close(self) -> None:
        self._queue.put_nowait(None)

    def __aiter__(self):
        return self

    async def __anext__(self):
        event = await self._queue.get()
        if event is None:
            raise StopAsyncIteration
        return event


@dataclass
class Outcome:
    finish_reason: str
    usage: dict


def usage(prompt: int, completion: int, cached: int) -> dict:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


async def outputs(
    events: EventStream, handle, text: OutputText, prompt_tokens: int, state: dict, started: float
) -> AsyncIterator:
    """Text deltas, then one Outcome; raises ApiError for a failed generation. Ends early (no Outcome)
    when the client went away. Token counts and token times go into `state` (the request's, for the
    log line and /metrics); `started` is when the request arrived (perf_counter)."""
    cached = completion = 0
    state.update(prompt_tokens=prompt_tokens, completion_tokens=0, itl_s=[])
    last = started
    async for event in events:
        if isinstance(event, Started):
            cached = state["cached_tokens"] = event.cached_tokens
        elif isinstance(event, Token):
            now = time.perf_counter()
            if completion == 0:
                state["ttft_s"] = now - started
            else:
                state["itl_s"].append(now - last)
            last = now
            completion = state["completion_tokens"] = completion + 1
            delta = text.add(event.token_id)
            if delta:
                yield delta
            if delta.stopped:  # a stop string: the rest is not wanted
                handle.cancel()
                yield Outcome("stop", usage(prompt_tokens, completion, cached))
                return
        elif isinstance(event, Finished):
            tail = text.finish()
            if tail:
                yield tail
            state.update(completion_tokens=event.completion_tokens, cached_tokens=event.cached_tokens)
            yield Outcome(
                event.reason, usage(event.prompt_tokens, event.completion_tokens, event.cached_tokens)
            )
            return
        elif isinstance(event, Failed):
            kind = "invalid_request_error" if event.code == "invalid" else "server_error"
            raise ApiError(_FAILURE_STATUS[event.code], event.message, type=kind, code=event.code)


async def _cancel_on_disconnect(request: Request, handle, events: EventStream) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
    handle.cancel()
    events.close()


# ---------------------------------------------------------------------------- routes


def _context(request: Request) -> ServerContext:
    return request.app.state.context


async def chat_completions(request: Request) -> Response:
    started = time.perf_counter()
    ctx = _context(request)
    chat = parse_chat_request(await read_json(request))
    if chat.model is not None and chat.model not in (ctx.model_name, ""):
        raise ApiError(
            404,
            f"The model `{chat.model}` does not exist; this engine serves `{ctx.model_name}`",
            param="model",
            code="model_not_found",
        )
    try:
        prompt_text, prompt_ids = await run_in_threadpool(ctx.encode_chat, chat.messages, chat.tools)
    except ChatTemplateError as e:
        raise bad_request(str(e), "messages") from None
    room = ctx.engine.max_context - len(prompt_ids)
    if room < 1:
        raise bad_request(
            f"the prompt has {len(prompt_ids)} tokens; this engine's max context is {ctx.engine.max_context}",
            "messages",
            "context_length_exceeded",
        )
    params = SamplingParams(
        max_tokens=min(chat.max_tokens or room, room),
        temperature=chat.temperature,
        top_p=chat.top_p,
        top_k=chat.top_k,
        min_p=chat.min_p,
        stop_token_ids=frozenset() if chat.ignore_eos else ctx.stop_token_ids,
        seed=chat.seed,
    )
    processor = ctx.scripted.processor_for(chat.messages) if ctx.scripted else None
    events = EventStream()
    try:
        handle = ctx.scheduler.submit(GenerationRequest(prompt_ids, params, processor), events.sink)
    except QueueFull as e:
        raise ApiError(
            429,
            str(e),
            type="rate_limit_error",
            code="queue_full",
            headers={"Retry-After": str(e.retry_after_s)},
        ) from None
    text = OutputText(ctx.engine.tokenizer, chat.stop, in_reasoning=prompt_text.rstrip().endswith("<think>"))
    stream = outputs(events, handle, text, len(prompt_ids), request.scope["state"], started)
    watcher = asyncio.create_task(_cancel_on_disconnect(request, handle, events))
    try:
        first = await anext(stream, None)  # errors before any output get their own status code
        if first is None:
            return Response(status_code=499)  # the client is gone
        if chat.stream:
            watcher.cancel()  # from here the streaming response watches the connection itself
            return StreamingResponse(
                _sse(ctx, chat, handle, first, stream),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )
        return await _complete(ctx, first, stream)
    except BaseException:
        handle.cancel()
        raise
    finally:
        watcher.cancel()


def _completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


async def _complete(ctx: ServerContext, first, stream: AsyncIterator) -> Response:
    reasoning, content, outcome = [], [], None
    async for item in _chain(first, stream):
        if isinstance(item, Delta):
            reasoning.append(item.reasoning)
            content.append(item.content)
        else:
            outcome = item
    if outcome is None:
        return Response(status_code=499)
    message = {"role": "assistant", "content": "".join(content)}
    if any(reasoning):
        message["reasoning_content"] = "".join(reasoning)
    return json_response(
        {
            "id": _completion_id(),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": ctx.model_name,
            "choices": [
                {"index": 0, "message": message, "logprobs": None, "finish_reason": outcome.finish_reason}
            ],
            "usage": outcome.usage,
        }
    )


async def _chain(first, rest: AsyncIterator) -> AsyncIterator:
    yield first
    async for item in rest:
        yield item


async def _sse(ctx: ServerContext, chat: ChatRequest, handle, first, stream: AsyncIterator):
    chunk_id, created = _completion_id(), int(time.time())

    def event(delta: dict, finish_reason: str | None = None, **extra) -> bytes:
        chunk = {
            "id": chunk_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": ctx.model_name,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
        }
        if chat.include_usage:
            chunk["usage"] = None
        chunk.update(extra)
        return b"data: " + orjson.dumps(chunk) + b"\n\n"

    try:
        yield event({"role": "assistant", "content": ""})
        async for item in _chain(first, stream):
            if isinstance(item, Delta):
                if item.reasoning:
                    yield event({"reasoning_content": item.reasoning})
                if item.content:
                    yield event({"content": item.content})
            else:
                yield event({}, item.finish_reason)
                if chat.include_usage:
                    yield event({}, choices=[], usage=item.usage)
        yield b"data: [DONE]\n\n"
    except ApiError as e:
        yield b"data: " + orjson.dumps(e.body()) + b"\n\n"
    finally:
        handle.cancel()  # a no-op after a normal end; frees the sequence at once if the client left


async def models(request: Request) -> Response:
    ctx = _context(request)
    entry = {
        "id": ctx.model_name,
        "object": "model",
        "created": ctx.created,
        "owned_by": "local-kimi",
        "max_model_len": ctx.engine.max_context,
    }
    return json_response({"object": "list", "data": [entry]})


async def health(request: Request) -> Response:
    ctx = _context(request)
    engine = ctx.engine
    return json_response(
        {
            "status": "ok",
            "model": ctx.model_name,
            "weights": engine.source.name,
            "synthetic_weights": engine.source.synthetic,
            "device": str(engine.device),
            "dtype": str(engine.model.dtype).removeprefix("torch."),
            "max_context": engine.max_context,
            "quant_plan": None if engine.source.plan is None else engine.source.plan.name,
            "kernel_variants": engine.kernel_variants,
            "kda_prefill_kernel": engine.kda_kernel,
            "cuda_graphs": engine.pool.cuda_graphs,
            "decode_step": engine.step,
            "scripted_replies": ctx.scripted is not None,
            "scheduler": ctx.scheduler.stats(),
            "memory": engine.memory_report(),
        }
    )


async def metrics(request: Request) -> Response:
    ctx = _context(request)
    text = request.app.state.metrics.render(ctx.scheduler.stats())
    return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")


async def version(request: Request) -> Response:
    import torch  # already loaded by the engine

    return json_response(
        {
            "name": "kimi-engine",
            "version": VERSION,
            "model": _context(request).model_name,
            "torch": torch.__version__,
        }
    )


async def tokenize(request: Request) -> Response:
    ctx = _context(request)
    body = await read_json(request)
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    if "messages" in body:
        messages = normalize_messages(body["messages"])
        tools = body.get("tools") if isinstance(body.get("tools"), list) else None
        add = body.get("add_generation_prompt", True)
        try:
            _, ids = await run_in_threadpool(ctx.encode_chat, messages, tools, bool(add))
        except ChatTemplateError as e:
            raise bad_request(str(e), "messages") from None
    else:
        prompt = body.get("prompt", body.get("content"))
        if not isinstance(prompt, str):
            raise bad_request("give messages (a conversation) or prompt (a string)", "prompt")
        ids = await run_in_threadpool(ctx.engine.tokenizer.encode, prompt)
    return json_response({"count": len(ids), "max_model_len": ctx.engine.max_context, "tokens": ids})


# ---------------------------------------------------------------------------- the application


async def _api_error(request: Request, exc: ApiError) -> Response:
    return error_response(exc)


async def _http_error(request: Request, exc: HTTPException) -> Response:
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return error_response(ApiError(exc.status_code, str(exc.detail), type=kind))


async def _server_error(request: Request, exc: Exception) -> Response:
    return error_response(ApiError(500, f"internal error: {exc}", type="server_error"))


def create_app(context: ServerContext, api_key: str | None = None) -> Starlette:
    """The app; its lifespan starts the scheduler's executor thread and stops it on shutdown.
    `api_key`: required as a bearer token on every route but /health, /metrics and /version."""
    observed = Metrics()

    @asynccontextmanager
    async def lifespan(app):
        context.scheduler.start()
        try:
            yield
        finally:
            await run_in_threadpool(context.scheduler.stop)

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/tokenize", tokenize, methods=["POST"]),
            Route("/metrics", metrics, methods=["GET"]),
            Route("/version", version, methods=["GET"]),
        ],
        middleware=[Middleware(Observed, metrics=observed, api_key=api_key)],
        # Starlette types every handler as taking any Exception; each of these gets only its own class
        exception_handlers={ApiError: _api_error, HTTPException: _http_error, Exception: _server_error},  # type: ignore[dict-item]
        lifespan=lifespan,
    )
    app.state.context = context
    app.state.metrics = observed
    return app
