"""Every job the project runs, each in its own environment: a fresh machine needs only `pip install nox`.

nox -s tests          the test suite (what CI runs)
nox -s bench-decode   the main job: engine decode throughput, written as receipts
nox -s bench-kernels  every kernel variant against its reference (GPU: full shapes; CPU: small, interpreted)
nox -s bench-micro    pytest-benchmark microbenchmarks (benchmarks/): k3's turn steps, the engine's host work
nox -s accuracy       quantised against unquantised model, per plan and group size
nox -s bench-llamacpp our engine against llama.cpp on the same model (builds llama.cpp's tools once)
nox -s bench-serve    serving benchmark: our engine and llama-server, each directly and through k3 (or args)
nox -s audit          check that every number shown comes from a receipt
nox -s typecheck      mypy over common/, engine/, k3/ and harness/ (what CI runs after the tests)
nox -s conformance    real coding agents through k3 (receipt + docs/CLIENTS.md)
"""

from __future__ import annotations

import os
import shutil

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_venv = "yes"
nox.options.sessions = ["tests"]

PYTHON = "3.11"
LITELLM = "litellm[proxy]==1.108.7"  # the peer proxy `bench-proxy-peers` measures k3 against


# On a machine with no NVIDIA GPU, torch is installed first at this CPU build's version (the one
# on this project's machines' disk), before the project: the project's range would otherwise take the
# newest CUDA build, several GB in every session's venv (CI once ran out of disk that way).
# KIMI_TORCH overrides it: a pip requirement (`KIMI_TORCH='torch==2.14.1'`), or empty for the range.
CPU_TORCH = "torch==2.13.0"


def has_nvidia_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None or os.path.exists("/dev/nvidia0")


def torch_requirement() -> str:
    """The torch requirement installed before the project, or "" to leave it to pyproject's range."""
    if "KIMI_TORCH" in os.environ:
        return os.environ["KIMI_TORCH"].strip()
    return "" if has_nvidia_gpu() else CPU_TORCH


def install(session: nox.Session, extras: str = "") -> None:
    torch = torch_requirement()
    if torch:
        session.install(torch)
    session.install("-e", f".[{extras}]" if extras else ".")


def harness(session: nox.Session, command: str) -> None:
    """Install the project and run one `kimi-harness` command."""
    install(session)
    session.run("kimi-harness", command)


def runner(session: nox.Session, command: str, *, extras: str = "", packages: tuple[str, ...] = ()) -> None:
    """Install the project (with `extras`, then `packages`) and run one `python -m runners` command with
    the session's args."""
    install(session, extras)
    if packages:
        session.install(*packages)
    session.run("python", "-m", "runners", command, *session.posargs)


def regenerate(session: nox.Session) -> None:
    session.run("kimi-harness", "report")
    session.run("kimi-harness", "figures")


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """Run the test suite (GPU-only tests skip on the CPU). Extra args go to pytest."""
    install(session, "test,oracles")
    # --durations: the slowest tests in every log, to keep the suite within its budget on 2 cores.
    args = session.posargs or ["-q", "-p", "no:cacheprovider", "--durations=15"]
    # pytest exits 5 when nothing was collected (e.g. a -k filter): say so rather than fail.
    code = session.run("pytest", *args, success_codes=[0, 5])
    if code == 5:
        session.log("pytest collected no tests")


@nox.session(python=PYTHON)
def conformance(session: nox.Session) -> None:
    """Real coding agents (Claude Code, Codex, opencode, aider, the SDKs) through k3: receipt + docs/CLIENTS.md.

    Installs the pinned clients into .cache/clients/ on first use. Extra args go to
    `python -m runners.conformance run` (e.g. -c codex -s tool_round_trip; --k3-repo PATH).
    """
    install(session)
    session.run("python", "-m", "runners.conformance", "run", *session.posargs)


@nox.session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    """mypy over common/, engine/, k3/ and harness/ (settings under [tool.mypy] in pyproject.toml; args go
    to mypy). Installs the project too: mypy reads torch's and the other libraries' own type information."""
    install(session, "typecheck")
    session.run("mypy", *session.posargs)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff check + format check (ruff pinned: another release may format the same code otherwise)."""
    session.install("ruff==0.17.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


# Thread counts every engine benchmark runs at: one, and the runners' default (all cores).
THREAD_RUNS = (["--threads", "1"], [])


@nox.session(name="bench-decode", python=PYTHON)
def bench_decode(session: nox.Session) -> None:
    """Engine decode tokens/s and TTFT under the memory cap, with the roofline (args go to the runner)."""
    install(session)
    for threads in THREAD_RUNS:  # one thread, then all cores
        session.run("python", "-m", "runners", "decode", "--no-regenerate", *threads, *session.posargs)
    session.run("python", "-m", "runners", "profile")  # the decode time split; regenerates the report


@nox.session(name="bench-kernels", python=PYTHON)
def bench_kernels(session: nox.Session) -> None:
    """Every kernel variant against its reference: achieved bandwidth (args go to the runner)."""
    runner(session, "kernels")


@nox.session(name="bench-micro", python=PYTHON)
def bench_micro(session: nox.Session) -> None:
    """k3's per-turn steps and the engine's per-token host work (benchmarks/), as `micro` receipts.

    Not part of `nox -s tests`. Args go to `python -m runners micro` (e.g. --runs 3 --max-time 1 -k k3).
    """
    runner(session, "micro", extras="test")


@nox.session(name="bench-proxy", python=PYTHON)
def bench_proxy(session: nox.Session) -> None:
    """Latency k3 adds per request and per event, for each dialect (args go to the runner)."""
    runner(session, "proxy")


@nox.session(name="bench-proxy-peers", python=PYTHON)
def bench_proxy_peers(session: nox.Session) -> None:
    """k3 and LiteLLM's proxy side by side in front of the same engine (args go to the runner)."""
    runner(session, "proxy-peers", packages=(LITELLM,))


@nox.session(name="proxy-gate", python=PYTHON)
def proxy_gate(session: nox.Session) -> None:
    """CI gate: a short proxy measurement and a short run of the k3 microbenchmarks, each compared with
    the committed receipts; fails on a regression beyond the measured noise (docs/METHODS.md)."""
    install(session, "test")
    session.run("python", "-m", "runners", "proxy-gate", *session.posargs)
    session.run("python", "-m", "runners", "micro-gate")


@nox.session(python=PYTHON)
def accuracy(session: nox.Session) -> None:
    """Quantised against unquantised model: KL, top-1, perplexity, greedy identity (args go to the runner)."""
    runner(session, "accuracy")


@nox.session(name="bench-llamacpp", python=PYTHON)
def bench_llamacpp(session: nox.Session) -> None:
    """Our engine against llama.cpp on the same model and machine (args go to the runner)."""
    install(session)
    for threads in THREAD_RUNS:  # one thread, then all cores
        session.run("python", "-m", "runners", "llamacpp", *threads, *session.posargs)


@nox.session(name="bench-serve", python=PYTHON)
def bench_serve(session: nox.Session) -> None:
    """Serving benchmark. No args: the side-by-side run here (kimi-engine and llama-server on the same
    synthetic weights, each directly and through k3). With args: `python -m runners serve ARGS`, e.g.
    `nox -s bench-serve -- --endpoint http://gpu-box:8000 --concurrency 1,4,16`."""
    install(session)
    session.run("python", "-m", "runners", "serve", *(session.posargs or ["--side-by-side"]))


@nox.session(python=PYTHON)
def selfcheck(session: nox.Session) -> None:
    """A small real measurement through the whole evidence path (receipt, report, figures)."""
    harness(session, "selfcheck")
    regenerate(session)


def harness_session(command: str, description: str) -> None:
    """Register `nox -s COMMAND`: install the project and run `kimi-harness COMMAND`."""

    def session(session: nox.Session) -> None:
        harness(session, command)

    session.__doc__ = description
    nox.session(name=command, python=PYTHON)(session)


for _command, _description in (
    ("report", "Regenerate results/RESULTS.md from the receipts."),
    (
        "claims",
        "Regenerate docs/CLAIMS.md: published claims against the ceilings `kimi-harness plan` computes.",
    ),
    ("figures", "Regenerate docs/figures/ (PNG + PDF + data) from the receipts."),
    (
        "audit",
        "Fail when a receipt, RESULTS.md, a figure or a number in the docs does not match the evidence.",
    ),
):
    harness_session(_command, _description)
