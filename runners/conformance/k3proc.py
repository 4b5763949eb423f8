"""`k3 serve` as a child process, started from a chosen checkout, for the length of a block."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from common.listen import free_port

START_TIMEOUT_S = 30.0
K3_REPO_ENV = "K3_REPO"


class K3Error(RuntimeError):
    """k3 did not start (or refused its options); carries the tail of its log."""


def resolve_k3_repo(explicit: Path | None, default: Path) -> Path:
    """The checkout whose `k3` package serves: --k3-repo, else $K3_REPO, else this repository."""
    chosen = explicit or (Path(os.environ[K3_REPO_ENV]) if os.environ.get(K3_REPO_ENV) else default)
    if not (chosen / "k3" / "__init__.py").is_file():
        raise K3Error(f"{chosen} has no k3 package (set --k3-repo or ${K3_REPO_ENV} to a checkout)")
    return chosen


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@contextmanager
def k3_server(repo: Path, upstream: str, model: str, options: tuple[str, ...], log: Path) -> Iterator[str]:
    """Yields k3's base URL (`http://127.0.0.1:PORT`, no `/v1`). Its output goes to `log`."""
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "k3",
        "serve",
        "--port",
        str(port),
        "--upstream",
        upstream,
        "--model",
        model,
    ]
    argv += options
    env = {**os.environ, "PYTHONPATH": str(repo), "PYTHONUNBUFFERED": "1"}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, cwd=repo, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise K3Error(
                    f"k3 serve {' '.join(options) or '(defaults)'} exited with code {proc.returncode}:\n{_tail(log)}"
                )
            try:
                httpx.get(base + "/", timeout=1.0)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise K3Error(
                        f"k3 serve did not answer within {START_TIMEOUT_S:.0f} s:\n{_tail(log)}"
                    ) from None
                time.sleep(0.1)
        yield base
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
