"""Run cases: the scripted engine, `k3 serve` in front of it, a tap in front of k3, the real client.

    with Driver(installed, k3_repo) as driver:
        result = driver.run(case)          # a Result: pass/fail, seconds, the first problem, evidence

One engine serves every case; k3 is restarted only when a case needs other k3 options. Each client
run gets a fresh HOME and working directory, a time limit, and no environment from the caller but
PATH and locale, so nothing on the machine leaks into what is tested.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from common.listen import serve_in_thread
from harness.hardware import REPO_ROOT
from runners.conformance.clients import Setup
from runners.conformance.install import Installed
from runners.conformance.k3proc import K3Error, k3_server
from runners.conformance.scenarios import Case, Evidence, Result, Words
from runners.conformance.tap import Tap
from runners.conformance.upstream import MODEL, ScriptedUpstream

TOKEN = "k3-conformance-token"  # k3 runs with --api-key: every client must send its token
CLIENT_TIMEOUT_S = 60.0
OUTPUT_TAIL = 1500


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _client_env(home: Path, setup: Setup) -> dict[str, str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "NO_COLOR": "1",
    }
    return env | setup.env


def _write_files(setup: Setup, home: Path, work: Path) -> None:
    for name, text in setup.files.items():
        path = home / name[2:] if name.startswith("~/") else work / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


class Driver:
    def __init__(
        self,
        installed: Installed,
        k3_repo: Path = REPO_ROOT,
        log_dir: Path | None = None,
        timeout: float = CLIENT_TIMEOUT_S,
    ):
        self.installed = installed
        self.k3_repo = k3_repo
        self.timeout = timeout
        self._stack = ExitStack()
        self.log_dir = log_dir or Path(
            self._stack.enter_context(tempfile.TemporaryDirectory(prefix="k3-conf-"))
        )
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.upstream = ScriptedUpstream()
        self._k3_stack: ExitStack | None = None
        self._k3_options: tuple[str, ...] | None = None
        self._k3: tuple[Tap, str] | K3Error | None = None

    def __enter__(self) -> Driver:
        self.upstream_root = self._stack.enter_context(serve_in_thread(self.upstream.app))
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop_k3()
        self._stack.close()

    # -- k3 -------------------------------------------------------------------------------------

    def _stop_k3(self) -> None:
        if self._k3_stack is not None:
            self._k3_stack.close()
        self._k3_stack, self._k3_options, self._k3 = None, None, None

    def _k3_for(self, options: tuple[str, ...]) -> tuple[Tap, str] | K3Error:
        """k3 (behind its tap) with these options, started once; a k3 that refused them stays an error."""
        if self._k3_options == options and self._k3 is not None:
            return self._k3
        self._stop_k3()
        stack = ExitStack()
        log = self.log_dir / ("k3" + "".join("_" + o.strip("-") for o in options) + ".log")
        try:
            base = stack.enter_context(
                k3_server(
                    self.k3_repo, self.upstream_root + "/v1", MODEL, ("--api-key", TOKEN, *options), log
                )
            )
            tap = Tap(base)
            self._k3 = (tap, stack.enter_context(serve_in_thread(tap.app)))
        except K3Error as exc:
            stack.close()
            self._k3 = exc
        self._k3_stack, self._k3_options = stack, options
        return self._k3

    # -- one case -------------------------------------------------------------------------------

    def run(self, case: Case) -> Result:
        client, scenario = case.client, case.scenario
        k3 = self._k3_for(scenario.k3_options)
        if isinstance(k3, K3Error):
            return Result(
                case, False, 0.0, f"k3 did not start: {str(k3).splitlines()[0]}", str(k3).splitlines()
            )
        tap, k3_url = k3
        words = Words(secrets.token_hex(4))
        with tempfile.TemporaryDirectory(prefix=f"{case.key}-") as scratch:
            home, work = Path(scratch) / "home", Path(scratch) / "work"
            home.mkdir()
            work.mkdir()
            scenario.prepare(work, words)
            request = scenario.request(client, words)
            setup = client.setup(k3_url, TOKEN, request)
            _write_files(setup, home, work)
            argv = client.argv(setup, self.installed)
            self.upstream.play(
                scenario.replies(client, words), side_when_no_tools=client.always_sends_tools or request.tools
            )
            tap.reset()
            started = time.perf_counter()
            proc = subprocess.Popen(
                argv, cwd=work, env=_client_env(home, setup), stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
            )  # fmt: skip
            try:
                stdout, stderr = proc.communicate(timeout=self.timeout)
                returncode: int | None = proc.returncode
            except subprocess.TimeoutExpired:
                _kill(proc)
                stdout, stderr = proc.communicate()
                returncode = None
            finally:
                _kill(proc)  # helpers a client left behind in its session
            seconds = time.perf_counter() - started
            evidence = Evidence(
                client.outcome(stdout, stderr, returncode if returncode is not None else -9),
                returncode, seconds, self.timeout, list(self.upstream.exchanges), tap.snapshot(), work,
            )  # fmt: skip
            problem = scenario.check(client, words, evidence)
        details = self._details(case, argv, evidence, stdout, stderr) if problem else []
        traffic = [f"{hit.method} {hit.path.split('?')[0]} -> {hit.status}" for hit in evidence.hits]
        engine = [e.kind for e in evidence.exchanges]
        return Result(case, problem is None, seconds, problem, details, traffic, engine, returncode is None)

    def _details(self, case: Case, argv: list[str], ev: Evidence, stdout: str, stderr: str) -> list[str]:
        dump = self.log_dir / f"{case.key}.json"
        exchanges = [e.__dict__ for e in ev.exchanges]
        dump.write_text(
            json.dumps({"argv": argv, "stdout": stdout, "stderr": stderr, "engine": exchanges}, indent=1)
        )
        code = "timed out" if ev.returncode is None else f"exit {ev.returncode}"
        lines = [f"client: {' '.join(argv[:3])} ... ({code} after {ev.seconds:.1f} s)", "requests to k3:"]
        lines += [f"  {hit.line()}" for hit in ev.hits] or ["  (none)"]
        lines.append("engine requests:")
        for n, e in enumerate(ev.exchanges, 1):
            body = e.body if isinstance(e.body, dict) else {}
            messages = body.get("messages") or []
            last = messages[-1].get("role") if messages and isinstance(messages[-1], dict) else None
            lines.append(
                f"  #{n} {e.kind} {e.method} {e.path} turn={e.turn} stream={body.get('stream')} "
                f"messages={len(messages)} last={last} tools={len(body.get('tools') or [])}"
            )
        lines.append(f"client stdout (tail): {stdout[-OUTPUT_TAIL:]!r}")
        lines.append(f"client stderr (tail): {stderr[-OUTPUT_TAIL:]!r}")
        lines.append(f"full record: {dump}")
        return lines
