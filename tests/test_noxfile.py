"""The noxfile's CPU torch pin must stay inside the project's own torch range, or every session on a
machine with no GPU would install a second, CUDA build of torch over it."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def noxfile_constant(name: str) -> str:
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"noxfile.py has no {name}")


def test_the_cpu_torch_pin_is_inside_the_projects_torch_range() -> None:
    pin = Requirement(noxfile_constant("CPU_TORCH"))
    (version,) = [spec.version for spec in pin.specifier]
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (torch_range,) = [Requirement(d) for d in deps if Requirement(d).name == "torch"]
    assert pin.name == "torch"
    assert torch_range.specifier.contains(version), f"{pin} is outside pyproject's {torch_range}"
