"""Listening TCP sockets for uvicorn, bound before the server starts.

Binding first lets a caller report a busy port in its own words and print the real port of an
ephemeral bind (port 0) before the server runs; listening first means a client that connects before
uvicorn starts is queued, not refused.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

BACKLOG = 2048
START_TIMEOUT_S = 10.0


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port) and listening; raises OSError when it cannot bind."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP explicitly: asyncio only disables Nagle on sockets whose proto says TCP, and with
    # Nagle on, every keep-alive response waits ~40 ms for the client's delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


def free_port() -> int:
    """A loopback port nothing listens on right now (for a child process that binds it itself)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def serve_in_thread(app: Any, host: str = "127.0.0.1", timeout_keep_alive: float = 5) -> Iterator[str]:
    """Serve an ASGI app with uvicorn in a daemon thread on an ephemeral port; yields `http://host:port`.

    Stops the server (and joins its thread) on exit. `timeout_keep_alive`: seconds before uvicorn
    closes an idle keep-alive connection."""
    sock = listening_socket(host, 0)
    port = sock.getsockname()[1]
    # uvicorn annotates timeout_keep_alive as int; it takes a float (the tests use 0.3 s).
    config = uvicorn.Config(app, log_level="error", lifespan="off", access_log=False)
    config.timeout_keep_alive = timeout_keep_alive  # type: ignore[assignment]
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("the server thread died while starting")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start within {START_TIMEOUT_S:.0f} s")
            time.sleep(0.01)
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=START_TIMEOUT_S)
        sock.close()
