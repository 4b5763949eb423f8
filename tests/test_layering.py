"""The layers import only downwards: common < engine, k3 < harness < runners.

Every import statement is read with `ast` (function-level ones too), so a lazy import that crosses a
layer fails here as well. Inside the engine: engine.kernels and engine.quant share the weight codec
(engine.codec); quant calls the kernels through the registry, the kernels import nothing of quant, so the
kernels load on their own. The kernel tooling (engine.kernel_tools: shapes, cases, traffic, equivalence,
aot, kernel count, `kimi-engine kernels`) sits above both; nothing the engine serves with imports it.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# package -> top-level project packages it must not import
FORBIDDEN = {
    "common": {"engine", "k3", "harness", "runners"},
    "engine": {"k3", "harness", "runners"},
    "k3": {"engine", "harness", "runners"},
    "harness": {"runners"},
}


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, dotted module name) of every absolute import in a file."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.extend((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)
    return out


def crossings(package: str, forbidden: set[str], root: Path = ROOT) -> list[str]:
    """Each import in `package` (a folder below root) of a module named by or below one in `forbidden`."""
    found = []
    for path in sorted((root / package).rglob("*.py")):
        for line, module in imported_modules(path):
            if any(module == name or module.startswith(name + ".") for name in forbidden):
                found.append(f"{path.relative_to(root)}:{line} imports {module}")
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_import_from_a_layer_above(package):
    assert crossings(package, FORBIDDEN[package]) == []


# engine package -> engine modules it must not import (the tooling is for benchmarks and the CLI only)
ENGINE_FORBIDDEN = {
    "engine/kernels": {"engine.quant", "engine.kernel_tools", "engine.runtime"},
    "engine/quant": {"engine.kernel_tools", "engine.runtime"},
    "engine/model": {"engine.quant", "engine.kernel_tools", "engine.runtime"},
    "engine/runtime": {"engine.kernel_tools"},
    "engine/server": {"engine.kernel_tools"},
}


@pytest.mark.parametrize("package", sorted(ENGINE_FORBIDDEN))
def test_engine_packages_import_only_downwards(package):
    assert crossings(package, ENGINE_FORBIDDEN[package]) == []


def test_the_kernel_tooling_lives_outside_the_kernels_package():
    tools = {"shapes", "cases", "traffic", "equivalence", "aot", "cli", "kernel_count"}
    kernels = {p.stem for p in (ROOT / "engine" / "kernels").glob("*.py")}
    assert kernels & tools == set()
    assert tools <= {p.stem for p in (ROOT / "engine" / "kernel_tools").glob("*.py")}


def test_the_memory_cap_has_no_harness_shim():
    assert not (ROOT / "harness" / "caps.py").exists()


@pytest.mark.parametrize(
    ("module", "absent"),
    [
        ("engine.kernels", ("engine.quant", "engine.kernel_tools", "engine.runtime")),
        ("engine.codec", ("engine.quant", "engine.kernels")),
        ("engine.quant", ("engine.kernel_tools", "engine.runtime")),
    ],
)
def test_a_package_loads_without_the_ones_above_it(module, absent):
    """Importing the package itself (its __init__ and everything that pulls in) loads none of `absent`:
    the static check above sees imports, this one sees what an import really loads."""
    code = f"import sys, {module}; print(sorted(m for m in sys.modules if m.startswith({absent!r})))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_check_sees_a_crossing(tmp_path):
    """The rule can fail: a lazy import of the harness inside a function is found, a name that only
    starts alike (harnessing) is not."""
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "bad.py").write_text(
        "import harnessing\n\n\ndef f():\n    from harness.receipt import GIB\n\n    return GIB\n"
    )
    assert crossings("engine", {"harness"}, tmp_path) == ["engine/bad.py:5 imports harness.receipt.GIB"]
