"""A minimal agent on the official Python SDKs, the way an application would write one.

Run with the SDK venv's Python (it imports only the SDK and the standard library):

    OPENAI_BASE_URL=http://127.0.0.1:8080/v1 OPENAI_API_KEY=local python sdk_agent.py chat --stream "prompt"

It offers one tool, `shell` (run a command in the current directory), executes every call the model
makes, sends the results back, and stops at the first answer without calls. It prints one JSON line:
{"text": final answer, "calls": calls executed} or, when the API failed, {"error": the SDK's message}.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

MODEL = "kimi-linear"
MAX_TURNS = 4
DESCRIPTION = "Run a shell command in the working directory and return its output."
PARAMETERS = {
    "type": "object",
    "properties": {"command": {"type": "string", "description": "The command to run."}},
    "required": ["command"],
}


def shell(arguments: str) -> str:
    command = json.loads(arguments)["command"]
    done = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=30)
    return done.stdout + done.stderr


def chat(prompt: str, stream: bool, tools: bool) -> dict:
    from openai import OpenAI

    client = OpenAI(max_retries=0)
    messages: list[dict] = [{"role": "user", "content": prompt}]
    extra = {"tools": [{"type": "function", "function": {"name": "shell", "description": DESCRIPTION,
                                                         "parameters": PARAMETERS}}]} if tools else {}  # fmt: skip
    calls = 0
    for _ in range(MAX_TURNS):
        if stream:
            message = _chat_stream(client, messages, extra)
        else:
            reply = client.chat.completions.create(model=MODEL, messages=messages, **extra)
            message = reply.choices[0].message.model_dump(exclude_none=True)
        messages.append(message)
        if not message.get("tool_calls"):
            return {"text": message.get("content") or "", "calls": calls}
        for call in message["tool_calls"]:
            calls += 1
            output = shell(call["function"]["arguments"])
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})
    return {"error": f"no answer after {MAX_TURNS} turns"}


def _chat_stream(client, messages: list[dict], extra: dict) -> dict:
    text, calls = [], {}
    with client.chat.completions.create(
        model=MODEL, messages=messages, stream=True, stream_options={"include_usage": True}, **extra
    ) as chunks:
        for chunk in chunks:
            for choice in chunk.choices:
                delta = choice.delta
                text.append(delta.content or "")
                for piece in delta.tool_calls or []:
                    call = calls.setdefault(piece.index, {"id": "", "name": "", "arguments": []})
                    call["id"] = piece.id or call["id"]
                    if piece.function:
                        call["name"] = piece.function.name or call["name"]
                        call["arguments"].append(piece.function.arguments or "")
    message: dict = {"role": "assistant", "content": "".join(text)}
    if calls:
        message["tool_calls"] = [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["name"], "arguments": "".join(c["arguments"])},
            }
            for _, c in sorted(calls.items())
        ]
    return message


def responses(prompt: str, stream: bool, tools: bool) -> dict:
    from openai import OpenAI

    client = OpenAI(max_retries=0)
    items: list = [{"role": "user", "content": prompt}]
    extra = {"tools": [{"type": "function", "name": "shell", "description": DESCRIPTION,
                        "parameters": PARAMETERS}]} if tools else {}  # fmt: skip
    calls = 0
    for _ in range(MAX_TURNS):
        kwargs = dict(model=MODEL, input=items, store=False, include=["reasoning.encrypted_content"], **extra)
        if stream:
            response = None
            for event in client.responses.create(stream=True, **kwargs):
                if event.type in ("response.completed", "response.incomplete"):
                    response = event.response
                elif event.type in ("error", "response.failed"):
                    return {"error": str(getattr(event, "message", None) or event)}
            if response is None:
                return {"error": "the stream ended without response.completed"}
        else:
            response = client.responses.create(**kwargs)
        output = [item.model_dump(exclude_none=True) for item in response.output]
        items += [{k: v for k, v in item.items() if k != "status"} for item in output]
        pending = [item for item in output if item["type"] == "function_call"]
        if not pending:
            return {"text": response.output_text, "calls": calls}
        for call in pending:
            calls += 1
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": call["call_id"],
                    "output": shell(call["arguments"]),
                }
            )
    return {"error": f"no answer after {MAX_TURNS} turns"}


def messages(prompt: str, stream: bool, tools: bool) -> dict:
    from anthropic import Anthropic

    client = Anthropic(max_retries=0)
    history: list[dict] = [{"role": "user", "content": prompt}]
    extra = (
        {"tools": [{"name": "shell", "description": DESCRIPTION, "input_schema": PARAMETERS}]}
        if tools
        else {}
    )
    calls = 0
    for _ in range(MAX_TURNS):
        kwargs = dict(model=MODEL, max_tokens=1024, messages=history, **extra)
        if stream:
            with client.messages.stream(**kwargs) as events:
                reply = events.get_final_message()
        else:
            reply = client.messages.create(**kwargs)
        content = [block.model_dump(exclude_none=True) for block in reply.content]
        history.append({"role": "assistant", "content": content})
        uses = [block for block in content if block["type"] == "tool_use"]
        if not uses:
            return {
                "text": "".join(b.get("text", "") for b in content if b["type"] == "text"),
                "calls": calls,
            }
        results = []
        for use in uses:
            calls += 1
            output = shell(json.dumps(use["input"]))
            results.append({"type": "tool_result", "tool_use_id": use["id"], "content": output})
        history.append({"role": "user", "content": results})
    return {"error": f"no answer after {MAX_TURNS} turns"}


APIS = {"chat": chat, "responses": responses, "messages": messages}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("api", choices=sorted(APIS))
    parser.add_argument("prompt")
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--tools", action="store_true", help="offer the shell tool")
    args = parser.parse_args()
    try:
        result = APIS[args.api](args.prompt, args.stream, args.tools)
    except Exception as exc:  # the SDK's own error is the result under test
        result = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(result))
    return 1 if "error" in result else 0


if __name__ == "__main__":
    sys.exit(main())
