"""Pinned real clients, installed from npm and PyPI into `.cache/clients/` (ignored by git).

    .cache/clients/npm/      @anthropic-ai/claude-code, @openai/codex, opencode-ai (native binaries
                             arrive as npm platform packages)
    .cache/clients/aider/    a venv with aider-chat (it pins many dependencies of its own)
    .cache/clients/sdk/      a venv with the openai and anthropic Python SDKs

Each directory holds a stamp with the pins it was built from; a rerun whose stamp matches and whose
programs are present does nothing. A lock file keeps two runs from installing at once.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from harness.hardware import REPO_ROOT

CACHE = REPO_ROOT / ".cache" / "clients"
NPM_REGISTRY = "https://registry.npmjs.org/"
INSTALL_TIMEOUT_S = 900
STAMP = ".k3-conformance-stamp.json"


@dataclass(frozen=True)
class Pin:
    group: str  # the directory under the cache: npm | aider | sdk
    package: str
    version: str
    program: str = ""  # the executable it provides, if the suite runs one


PINS: dict[str, Pin] = {
    "claude-code": Pin("npm", "@anthropic-ai/claude-code", "2.1.197", "claude"),
    "codex": Pin("npm", "@openai/codex", "0.171.0", "codex"),
    "opencode": Pin("npm", "opencode-ai", "1.18.33", "opencode"),
    "aider": Pin("aider", "aider-chat", "0.86.2", "aider"),
    "openai": Pin("sdk", "openai", "2.20.0"),
    "anthropic": Pin("sdk", "anthropic", "2.14.0"),
}


class InstallError(RuntimeError):
    """A client could not be installed; says which, from where, and what the installer printed."""


class NoNpm(InstallError):
    """No npm on this machine: the npm clients cannot be installed at all."""


@dataclass(frozen=True)
class Installed:
    cache: Path

    def program(self, name: str) -> Path:
        """The executable of an installed pin (`claude-code` -> .../node_modules/.bin/claude)."""
        pin = PINS[name]
        if pin.group == "npm":
            return self.cache / "npm" / "node_modules" / ".bin" / pin.program
        return self.cache / pin.group / "bin" / pin.program

    def python(self, group: str) -> Path:
        return self.cache / group / "bin" / "python"


def _group_pins(group: str) -> dict[str, str]:
    return {p.package: p.version for p in PINS.values() if p.group == group}


def _stamp_ok(directory: Path, wanted: dict) -> bool:
    try:
        return json.loads((directory / STAMP).read_text()) == wanted
    except (OSError, ValueError):
        return False


def _run(argv: list[str], cwd: Path, what: str) -> None:
    try:
        done = subprocess.run(
            argv, cwd=cwd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        raise InstallError(
            f"{what}: no result after {INSTALL_TIMEOUT_S} s (is the registry reachable?)"
        ) from None
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise InstallError(f"{what} failed (exit {done.returncode}); is the registry reachable?\n{tail}")


def _install_npm(directory: Path, pins: dict[str, str]) -> None:
    npm = shutil.which("npm")
    if npm is None:
        raise NoNpm("npm is not installed: Claude Code, Codex and opencode need Node.js 18+ with npm")
    directory.mkdir(parents=True, exist_ok=True)
    manifest = {"name": "k3-conformance-clients", "private": True, "dependencies": pins}
    (directory / "package.json").write_text(json.dumps(manifest, indent=2) + "\n")
    what = f"npm install {' '.join(f'{k}@{v}' for k, v in pins.items())} from {NPM_REGISTRY}"
    # Install scripts must run: Claude Code's links its platform package's binary into place.
    _run([npm, "install", "--no-audit", "--no-fund", "--registry", NPM_REGISTRY], directory, what)


def _install_venv(directory: Path, pins: dict[str, str]) -> None:
    shutil.rmtree(directory, ignore_errors=True)  # a changed pin gets a clean environment
    _run([sys.executable, "-m", "venv", str(directory)], REPO_ROOT, f"python -m venv {directory}")
    requirements = [f"{k}=={v}" for k, v in pins.items()]
    pip = [str(directory / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    _run(pip + requirements, directory, f"pip install {' '.join(requirements)} from PyPI")


def _verify(installed: Installed, group: str) -> None:
    """Each pinned program runs and reports its pinned version (a package can install and not run)."""
    for name, pin in PINS.items():
        if pin.group != group:
            continue
        if pin.group == "npm":
            argv = [str(installed.program(name)), "--version"]
        else:
            code = f"import importlib.metadata as m; print(m.version({pin.package!r}))"
            argv = [str(installed.python(group)), "-c", code]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
            said = (done.stdout + done.stderr).strip()
        except (OSError, subprocess.TimeoutExpired) as exc:
            said = f"{type(exc).__name__}: {exc}"
        if pin.version not in said:
            raise InstallError(
                f"{pin.package}@{pin.version} installed but does not run as expected: {said[-500:]}"
            )


INSTALLERS = {"npm": _install_npm, "aider": _install_venv, "sdk": _install_venv}


@contextmanager
def _locked(cache: Path) -> Iterator[None]:
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def groups_for(pins: list[str]) -> list[str]:
    return sorted({PINS[name].group for name in pins})


def ensure(pins: list[str] | None = None, cache: Path = CACHE, log=print) -> Installed:
    """Install what is missing or out of date; returns where the programs are."""
    installed = Installed(cache)
    with _locked(cache):
        for group in groups_for(pins or list(PINS)):
            directory = cache / group
            wanted: dict = {"pins": _group_pins(group)}
            if group != "npm":  # a venv belongs to the interpreter that made it
                wanted["python"] = sys.version.split()[0]
            present = all(
                installed.program(n).exists() for n, p in PINS.items() if p.group == group and p.program
            ) and (group == "npm" or installed.python(group).exists())
            if present and _stamp_ok(directory, wanted):
                continue
            log(f"installing {group}: {', '.join(f'{k} {v}' for k, v in wanted['pins'].items())} ...")
            started = time.perf_counter()
            (directory / STAMP).unlink(missing_ok=True)
            INSTALLERS[group](directory, wanted["pins"])
            _verify(installed, group)
            (directory / STAMP).write_text(json.dumps(wanted, indent=2) + "\n")
            log(f"installed {group} in {time.perf_counter() - started:.0f} s")
    return installed
