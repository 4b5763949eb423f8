"""Test helpers: SSE parsing, and the official SDKs' own models and stream accumulators as judges."""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import orjson
from anthropic.lib.streaming._messages import accumulate_event
from openai.lib.streaming.chat._completions import ChatCompletionStreamState
from openai.lib.streaming.responses._responses import ResponseStreamState
from pydantic import TypeAdapter

_ANTHROPIC_EVENT = TypeAdapter(anthropic.types.RawMessageStreamEvent)
_RESPONSES_EVENT = TypeAdapter(openai.types.responses.ResponseStreamEvent)


def sse_frames(text: str) -> list[tuple[str | None, Any]]:
    """[(event name or None, parsed data)]; a comment-only frame gives (":", comment)."""
    frames = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        event = None
        data = []
        comment = None
        for line in block.split("\n"):
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip(" "))
            elif line.startswith(":"):
                comment = line[1:].strip()
        if not data:
            frames.append((":", comment))
            continue
        raw = "\n".join(data)
        frames.append((event, raw if raw == "[DONE]" else orjson.loads(raw)))
    return frames


def anthropic_stream(text: str) -> anthropic.types.Message:
    """Validate every frame as the SDK's event types and fold them with the SDK's accumulator."""
    snapshot = None
    buffers: dict[int, bytes] = {}
    for name, data in sse_frames(text):
        assert name is not None and name != ":", f"unnamed frame {data!r}"
        assert data["type"] == name, f"event name {name} != data type {data['type']}"
        if name == "ping":
            continue
        assert name != "error", f"stream error: {data}"
        event = _ANTHROPIC_EVENT.validate_python(data)
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=buffers)
    assert snapshot is not None
    return anthropic.types.Message.model_validate(snapshot.model_dump())


def chat_stream(text: str) -> openai.types.chat.ChatCompletion:
    frames = [f for f in sse_frames(text) if f[0] != ":"]
    assert frames[-1] == (None, "[DONE]"), "a Chat stream ends with [DONE]"
    assert [f for f in frames if f[1] == "[DONE]"] == [frames[-1]]
    state = ChatCompletionStreamState()
    for name, data in frames[:-1]:
        assert name is None
        assert "error" not in data, f"stream error: {data}"
        state.handle_chunk(openai.types.chat.ChatCompletionChunk.model_validate(data))
    return state.get_final_completion()


def responses_stream(text: str) -> openai.types.responses.Response:
    state = ResponseStreamState(input_tools=openai.omit, text_format=openai.omit)
    final = None
    frames = [f for f in sse_frames(text) if f[0] != ":"]
    for seq, (name, data) in enumerate(frames):
        assert name == data["type"], f"event name {name} != data type {data['type']}"
        assert data["sequence_number"] == seq
        assert name != "error", f"stream error: {data}"
        for event in state.handle_event(_RESPONSES_EVENT.validate_python(data)):
            if event.type in ("response.completed", "response.incomplete"):
                assert final is None, "more than one terminal event"
                final = data["response"]
                # the SDK's accumulated items must agree with the terminal object's
                assert [o.id for o in event.response.output] == [o["id"] for o in final["output"]]
    assert final is not None, "no terminal response event"
    return openai.types.responses.Response.model_validate(final)


def start_k3(args: list[str], env: dict[str, str]):
    """`python -m k3 ARGS` with `env` added; -> (the process, its base URL from the banner's first line)."""
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    process = subprocess.Popen(
        [sys.executable, "-m", "k3", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONPATH": str(root), **env},
    )  # fmt: skip
    first = process.stdout.readline()  # type: ignore[union-attr]
    match = re.match(r"k3 listening on (http://\S+)", first)
    if match is None:
        process.kill()
        raise AssertionError(first + process.stdout.read())  # type: ignore[union-attr]
    return process, match.group(1)


def stop_k3(process) -> str:
    """Terminate it; -> the rest of what it printed. Read through the text stream, not communicate():
    with a timeout that reads the raw pipe and drops what readline() had already buffered."""
    process.terminate()
    output = process.stdout.read()  # until the process closes it, as it exits
    process.wait(20)
    return output
