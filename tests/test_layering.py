"""The layers import only downwards: common < engine, k3 < harness < runners.

Every import statement is read with `ast` (function-level ones too), so a lazy import that crosses a
layer fails here as well. engine.kernels and engine.quant share the weight codec (engine.codec) and the
kernels do not import the quantisation package, so either can be read and loaded on its own.
"""

from __future__ import annotations

import ast
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


def test_kernels_do_not_import_the_quantisation_package():
    assert crossings("engine/kernels", {"engine.quant"}) == []


def test_the_check_sees_a_crossing(tmp_path):
    """The rule can fail: a lazy import of the harness inside a function is found, a name that only
    starts alike (harnessing) is not."""
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "bad.py").write_text(
        "import harnessing\n\n\ndef f():\n    from harness.caps import GIB\n\n    return GIB\n"
    )
    assert crossings("engine", {"harness"}, tmp_path) == ["engine/bad.py:5 imports harness.caps.GIB"]
