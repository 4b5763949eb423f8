"""Helpers for the server tests: an in-process server on a real 127.0.0.1 socket, and CLI processes."""

from __future__ import annotations

import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import uvicorn

from engine.runtime import Engine, Scheduler
from engine.server.app import ServerContext, create_app
from engine.server.chat_template import SYNTHETIC_CHAT_TEMPLATE, ChatTemplate
from engine.server.scripted import ScriptedReplies
from runners.processes import stop

REPO_ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 30
# A CLI server's start: load, then compile the decode step (cold Inductor cache on a fresh CI machine, on
# two cores that other tests may share), before its "listening on" line.
START_TIMEOUT_S = 240

# TEST HOOK (see engine/server/scripted.py): requests whose last message contains the key get the reply.
SCRIPT = [
    ("weather in Paris", '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'),
    ("sunny, 21", "It is sunny in Paris."),
    ("think about it", "<think>plan it</think>The answer."),
    ("say stop", "alpha STOP beta"),
]


class ServerThread:
    """The app served by uvicorn on a free loopback port, in a daemon thread."""

    def __init__(self, context: ServerContext):
        self.context = context
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self.base_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        config = uvicorn.Config(create_app(context), log_level="warning", timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + TIMEOUT_S
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(TIMEOUT_S)


def make_context(*, max_active=2, max_queue=4, max_context=2048, prefix_cache_gib=0.05) -> ServerContext:
    engine = Engine.load(
        synthetic="tiny",
        device="cpu",
        dtype=torch.float32,
        max_context=max_context,
        prefix_cache_gib=prefix_cache_gib,
    )
    scheduler = Scheduler(engine, max_active=max_active, max_queue=max_queue)
    template = ChatTemplate(SYNTHETIC_CHAT_TEMPLATE)
    return ServerContext(
        engine, scheduler, template, "kimi-linear", ScriptedReplies(SCRIPT, engine.tokenizer)
    )


class CliProcess:
    """`python -m <module> ...` from the repo root; `url()` waits for its "listening on" line."""

    def __init__(self, *args: str):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", *args],
            cwd=REPO_ROOT,
            env={
                **os.environ,
                "PYTHONUNBUFFERED": "1",
            },  # every line as printed: a failure shows how far it got
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.output.append(line)
            self.lines.put(line)

    def url(self) -> str:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            if "listening on http://" in line:
                return line.split("listening on ")[1].split()[0]
        raise RuntimeError("no 'listening on' line:\n" + "".join(self.output))

    def stop(self) -> int:
        return stop(self.proc, TIMEOUT_S)


@contextmanager
def engine_and_k3(
    script: list[tuple[str, str]], script_dir: Path, *k3_args: str
) -> Iterator[tuple[str, str, CliProcess]]:
    """`kimi-engine serve --synthetic tiny` with scripted replies (match, reply), and `k3 serve` in front
    of it with `k3_args`: (engine URL, k3 URL, the engine's process); both stopped on exit."""
    path = script_dir / "replies.json"
    path.write_text(json.dumps([{"match": m, "reply": r} for m, r in script]))
    engine = CliProcess(
        "engine", "serve", "--synthetic", "tiny", "--port", "0", "--scripted-replies", str(path)
    )
    k3 = None
    try:
        engine_url = engine.url()
        k3 = CliProcess("k3", "serve", "--upstream", engine_url + "/v1", "--port", "0", *k3_args)
        yield engine_url, k3.url(), engine
    finally:
        if k3 is not None:
            k3.stop()
        engine.stop()
