"""`python -m runners.engine_process`: the scripted fake engine (k3.testing.fake_upstream) in its own
process on an ephemeral loopback port, so a benchmark's client does not share a GIL with it."""

import socket

import uvicorn

from k3.testing.fake_upstream import FakeUpstream

if __name__ == "__main__":
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # see k3/cli.py: Nagle
    sock.bind(("127.0.0.1", 0))
    sock.listen(2048)  # before announcing the address: early clients are queued, not refused
    print(f"engine listening on http://127.0.0.1:{sock.getsockname()[1]}/v1", flush=True)
    config = uvicorn.Config(FakeUpstream(), log_level="warning", lifespan="off", access_log=False)
    uvicorn.Server(config).run(sockets=[sock])
