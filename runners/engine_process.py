"""`python -m runners.engine_process`: the scripted fake engine (k3.testing.fake_upstream) in its own
process on an ephemeral loopback port, so a benchmark's client does not share a GIL with it."""

import uvicorn

from common.listen import listening_socket
from k3.testing.fake_upstream import FakeUpstream

if __name__ == "__main__":
    sock = listening_socket("127.0.0.1", 0)  # listening before the address is announced
    print(f"engine listening on http://127.0.0.1:{sock.getsockname()[1]}/v1", flush=True)
    config = uvicorn.Config(FakeUpstream(), log_level="warning", lifespan="off", access_log=False)
    uvicorn.Server(config).run(sockets=[sock])
