"""llama.cpp's own `llama-bench` and `llama-server`, built once from the llama-cpp-python source distribution.

The llama-cpp-python wheel ships only shared libraries, so the executables are built from the llama.cpp
tree vendored in its sdist (same commit as the Python package) and cached under
`~/.cache/local-kimi/llamacpp/` (or `$KIMI_CACHE_DIR/llamacpp/`).
With an NVIDIA GPU visible the build adds CUDA.

On x86 the build is native minus AMX: the project's CPU machine advertises AMX, but its VM faults on tile
instructions (`tilezero` raises SIGILL in ggml's AMX Q4_0 matmul), so quantised models would crash.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import click

VERSION = "0.3.36"
# Outside the checkout, so every clone on a machine (CI's included) reuses one build.
CACHE = Path(os.environ.get("KIMI_CACHE_DIR", Path.home() / ".cache" / "local-kimi")) / "llamacpp"
TARGETS = ("llama-bench", "llama-server")
# GCC's explicit -mno-* flags win over -march=native whatever their order on the command line.
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


@dataclass(frozen=True)
class Tools:
    bench: Path
    server: Path
    build_dir: Path
    cuda: bool

    def version(self) -> str:
        """llama.cpp's own version line, e.g. 'version: 1 (0c1e570)'."""
        out = subprocess.run([str(self.bench), "--version"], capture_output=True, text=True, timeout=30)
        return "; ".join(line for line in (out.stdout + out.stderr).splitlines() if line.strip())


def has_cuda() -> bool:
    return shutil.which("nvidia-smi") is not None and shutil.which("nvcc") is not None


def _x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def build_dir(cache: Path = CACHE, cuda: bool = False) -> Path:
    """Where the tools for this configuration are built (the name changes with the flags that matter)."""
    return cache / f"build-{VERSION}-{'cuda' if cuda else 'cpu'}{'-noamx' if _x86() else ''}"


def ensure_tools(cache: Path = CACHE, cuda: bool | None = None) -> Tools:
    """Return the built tools, building them first when the cache does not hold them (minutes on 2 cores)."""
    cuda = has_cuda() if cuda is None else cuda
    build = build_dir(cache, cuda)
    tools = Tools(build / "bin" / TARGETS[0], build / "bin" / TARGETS[1], build, cuda)
    if tools.bench.exists() and tools.server.exists():
        return tools
    source = _source_tree(cache)
    flags = [
        "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF",
        "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_SERVER=ON", f"-DGGML_CUDA={'ON' if cuda else 'OFF'}",
    ]  # fmt: skip
    if _x86():
        flags += [f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}"]
    _run(["cmake", "-S", str(source), "-B", str(build), *flags], "configuring llama.cpp")
    _run(
        ["cmake", "--build", str(build), "--target", *TARGETS, "-j"], "building llama-bench and llama-server"
    )
    if not (tools.bench.exists() and tools.server.exists()):
        raise click.ClickException(
            f"the llama.cpp build finished but {build / 'bin'} lacks {', '.join(TARGETS)}"
        )
    return tools


def _source_tree(cache: Path) -> Path:
    tree = cache / f"llama_cpp_python-{VERSION}" / "vendor" / "llama.cpp"
    if tree.exists():
        return tree
    cache.mkdir(parents=True, exist_ok=True)
    sdist = cache / f"llama_cpp_python-{VERSION}.tar.gz"
    if not sdist.exists():
        _run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
             f"llama-cpp-python=={VERSION}", "-d", str(cache)],
            "downloading the llama-cpp-python sdist",
        )  # fmt: skip
    with tarfile.open(sdist) as archive:
        archive.extractall(cache, filter="data")
    return tree


def _run(cmd: list[str], label: str) -> None:
    """Run a build step, echoing its progress lines; on failure show the tail of its output."""
    click.echo(f"{label} ...", err=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tail: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        tail = (tail + [line.rstrip()])[-40:]
        if line.startswith("["):  # ninja's "[12/220] Building ..." progress lines
            click.echo(f"  {line.rstrip()[:100]}", err=True)
    if proc.wait() != 0:
        raise click.ClickException(f"{label} failed ({' '.join(cmd[:3])} ...):\n" + "\n".join(tail))
