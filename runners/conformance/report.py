"""The conformance receipt, and docs/CLIENTS.md rendered from the newest one.

The receipt (suite `conformance`) holds the wall seconds of every case as a sample keyed
`client.scenario`, and in `config` the verdict of each case, the pinned client versions, their
dialects and the k3 checkout that served. docs/CLIENTS.md is rendered from that receipt alone, with
the setup each client was run with (from `clients.py`), so the page cannot drift from what ran.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from harness.hardware import REPO_ROOT
from harness.receipt import RESULTS_DIR, load_receipt, receipt_paths, write_receipt
from harness.report import templates
from runners.conformance.clients import CLIENTS, ENGINE_MODEL, Request
from runners.conformance.install import PINS
from runners.conformance.scenarios import CASES, MATRIX, Result

SUITE = "conformance"
NAME = "clients"
DOC = REPO_ROOT / "docs" / "CLIENTS.md"
TEMPLATES = Path(__file__).parent / "templates"
DOC_BASE = "http://127.0.0.1:8080"  # what `k3 serve` listens on by default
DOC_TOKEN = "local"
DOC_PROMPT = "your prompt"


def _commit(repo: Path) -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10, check=True
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        return out.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def write(results: list[Result], k3_repo: Path, timeout: float, results_dir: Path | None = None) -> Path:
    """One receipt for one run of the suite."""
    cases = {
        r.case.key: {
            "client": r.case.client.name,
            "title": r.case.client.title,
            "dialect": r.case.client.dialect,
            "scenario": r.case.scenario.name,
            "summary": r.case.scenario.summary,
            "streamed": r.case.scenario.streams(r.case.client),
            "passed": r.passed,
            "problem": r.problem or "",
            "traffic": r.traffic,
            "engine": r.engine,
        }
        for r in results
    }
    used = {r.case.client.pin for r in results}
    config = {
        "k3": {"checkout": str(k3_repo), "commit": _commit(k3_repo)},
        "engine": "scripted upstream (runners/conformance/upstream.py), not a model",
        "client_timeout_s": timeout,
        "clients": {
            name: {"package": p.package, "version": p.version} for name, p in PINS.items() if name in used
        },
        "cases": cases,
    }
    passed = sum(r.passed for r in results)
    return write_receipt(
        SUITE,
        NAME,
        config=config,
        samples={r.case.key: [r.seconds] for r in results},
        units={r.case.key: "s" for r in results},
        derived={"cases": len(results), "passed": passed, "failed": len(results) - passed},
        notes="wall seconds of one client run per case, including the client's own start-up",
        results_dir=results_dir,
    )


def newest_receipt(results_dir: Path | None = None) -> tuple[Path, dict] | None:
    found = []
    for path in receipt_paths(results_dir):
        if path.relative_to(Path(results_dir or RESULTS_DIR)).parts[0] == SUITE:
            receipt = load_receipt(path)
            if receipt["name"] == NAME:
                found.append((receipt["created"], path, receipt))
    if not found:
        return None
    _, path, receipt = max(found)
    return path, receipt


def _setups() -> list[dict]:
    out = []
    for name in MATRIX:
        client = CLIENTS[name]
        setup = client.setup(DOC_BASE, DOC_TOKEN, Request(DOC_PROMPT))
        pin = PINS[client.pin]
        out.append(
            {
                "name": name,
                "title": client.title,
                "dialect": client.dialect,
                "install": f"npm install -g {pin.package}@{pin.version}"
                if pin.group == "npm"
                else f"pip install {pin.package}=={pin.version}",
                "env": setup.env,
                "files": setup.files,
                "command": " ".join(_quote(a) for a in setup.command),
                "note": client.docs_note,
            }
        )
    return out


def _scenarios() -> list[dict]:
    seen: dict[str, str] = {}
    for scenarios in MATRIX.values():
        for scenario in scenarios:
            seen.setdefault(scenario.name, scenario.summary)
    return [{"name": name, "summary": summary} for name, summary in seen.items()]


def _quote(arg: str) -> str:
    return (
        arg
        if arg and all(c.isalnum() or c in "-_./=:@" for c in arg)
        else "'" + arg.replace("'", "'\\''") + "'"
    )


def _code(text: str) -> str:
    """A Markdown code span, so spaces and quotes in the evidence survive rendering."""
    return "`` " + text.replace("\n", " ") + " ``"


def render(results_dir: Path | None = None) -> str:
    newest = newest_receipt(results_dir)
    run = None
    if newest is not None:
        path, receipt = newest
        rows = []
        order = {case.key: i for i, case in enumerate(CASES)}
        cases = sorted(
            receipt["config"]["cases"].items(), key=lambda item: (order.get(item[0], len(order)), item[0])
        )
        for key, case in cases:
            version = receipt["config"]["clients"][CLIENTS[case["client"]].pin]["version"]
            rows.append(
                case
                | {
                    "version": version,
                    "seconds": f"{receipt['samples'][key][0]:.1f}",
                    "problem": _code(case["problem"]),
                }
            )
        root = Path(results_dir or RESULTS_DIR)
        traffic: dict[str, dict[str, set[str]]] = {}
        for _, case in cases:
            seen = traffic.setdefault(case["title"], {"k3": set(), "engine": set()})
            seen["k3"].update(case["traffic"])
            seen["engine"].update(case["engine"])
        run = {
            "path": path.relative_to(root).as_posix(),
            "created": receipt["created"],
            "k3_commit": receipt["config"]["k3"]["commit"],
            "hardware_id": receipt["hardware"]["hardware_id"],
            "rows": rows,
            "traffic": {title: {k: sorted(v) for k, v in seen.items()} for title, seen in traffic.items()},
            "passed": int(receipt["derived"]["passed"]),
            "total": int(receipt["derived"]["cases"]),
        }
    return (
        templates(TEMPLATES)
        .get_template("CLIENTS.md.j2")
        .render(
            run=run,
            setups=_setups(),
            scenarios=_scenarios(),
            base=DOC_BASE,
            token=DOC_TOKEN,
            model=ENGINE_MODEL,
        )
    )


def write_doc(results_dir: Path | None = None, doc: Path = DOC) -> Path:
    doc.write_text(render(results_dir))
    return doc
