"""Server subprocesses for the runners: start one and learn its address, and stop one for sure."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import time
from contextlib import contextmanager

import click
import psutil

from harness.hardware import REPO_ROOT


def stop(proc: subprocess.Popen, timeout: float = 10) -> int:
    """Terminate, and kill what does not exit within `timeout` seconds; -> the exit code."""
    proc.terminate()
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait(timeout)


@contextmanager
def server_process(
    cmd: list[str], announces: str, *, startup_s: float = 30, extra_env: dict[str, str] | None = None
):
    """A server subprocess that prints `<announces> http://...`; yields (its URL, psutil.Process)."""
    with tempfile.TemporaryFile("w+") as log:
        # Output goes to a file, not a pipe: an undrained pipe could block the server mid-benchmark.
        env = os.environ | {"PYTHONUNBUFFERED": "1"} | (extra_env or {})
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.monotonic() + startup_s
            while not (match := re.search(re.escape(announces) + r" (http://\S+)", _read(log))):
                if proc.poll() is not None:
                    raise click.ClickException(
                        f"{cmd[2]} exited early (code {proc.returncode}):\n{_read(log)}"
                    )
                if time.monotonic() > deadline:
                    raise click.ClickException(
                        f"{cmd[2]} did not report its address within {startup_s:g} s:\n{_read(log)[-2000:]}"
                    )
                time.sleep(0.05)
            yield match.group(1).rstrip("/"), psutil.Process(proc.pid)
        finally:
            stop(proc)


def _read(log) -> str:
    log.seek(0)
    return log.read()
