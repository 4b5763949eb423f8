"""llama.cpp's `llama-server` for one model: started on 127.0.0.1 with an ephemeral port, always stopped.

The server binds port 0 itself (no race for a free port) and logs the address it got; its log goes to a
temporary file that is read back to find the port. Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import click
import httpx

from runners.processes import stop

LISTENING = re.compile(r"listening on http://127\.0\.0\.1:(\d+)")


@contextlib.contextmanager
def running_server(
    server: Path,
    model: Path,
    *,
    threads: int,
    context: int,
    gpu_layers: int,
    timeout_s: float = 120.0,
    parallel: int = 1,
) -> Iterator[str]:
    """Yield the base URL of a ready llama-server serving `model` with `parallel` slots (`context` tokens
    shared among them); stop it on exit, whatever happens."""
    args = [
        str(server), "-m", str(model), "--host", "127.0.0.1", "--port", "0", "-t", str(threads),
        "-c", str(context), "-np", str(parallel), "-ngl", str(gpu_layers), "--no-webui",
    ]  # fmt: skip
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, text=True)
        try:
            yield _wait_ready(proc, log, timeout_s)
        finally:
            stop(proc, timeout=15)


def _wait_ready(proc: subprocess.Popen, log, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    url = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise click.ClickException(f"llama-server exited ({proc.returncode}):\n{_tail(log)}")
        if url is None:
            log.seek(0)
            found = LISTENING.search(log.read())
            url = found and f"http://127.0.0.1:{found.group(1)}"
        if url is not None:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                    return url
        time.sleep(0.2)
    raise click.ClickException(f"llama-server was not ready within {timeout_s:.0f} s:\n{_tail(log)}")


def _tail(log, lines: int = 20) -> str:
    log.seek(0)
    return "\n".join(log.read().splitlines()[-lines:])


def completion_timings(url: str, prompt_ids: list[int], n_predict: int, timeout_s: float = 600.0) -> dict:
    """One greedy /completion of exactly `n_predict` tokens (EOS ignored, no prompt cache): the server's
    own `timings` plus the request's wall time seen by the client (`request_ms`)."""
    body = {
        "prompt": prompt_ids,
        "n_predict": n_predict,
        "temperature": 0.0,
        "ignore_eos": True,
        "cache_prompt": False,
        "stream": False,
    }
    start = time.perf_counter()
    response = httpx.post(f"{url}/completion", json=body, timeout=timeout_s)
    elapsed = time.perf_counter() - start
    response.raise_for_status()
    timings = response.json()["timings"]
    if timings["predicted_n"] != n_predict or timings["prompt_n"] != len(prompt_ids):
        raise click.ClickException(
            f"llama-server processed {timings['prompt_n']} prompt / {timings['predicted_n']} generated tokens, "
            f"expected {len(prompt_ids)} / {n_predict}"
        )
    return timings | {"request_ms": elapsed * 1e3}
