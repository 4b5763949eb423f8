"""pytest-benchmark JSON -> receipts: suite `micro`, one receipt per benchmark case.

Each case's raw per-call times (pytest-benchmark's `stats.data`, written with `--benchmark-save-data`)
become the samples `call_us`; its `extra_info` becomes the configuration (the `case` key names the
receipt); `machine_info` gives the hardware descriptor (the project's own, when the benchmarks'
conftest recorded it under `local_kimi`, else one mapped from pytest-benchmark's fields) and
`commit_info` the commit. A case with `deltas` in its extra_info also gets `per_delta_us`. Several
files (repeated runs of the same cases) make one receipt per case; see `receipts_from_runs`.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from harness.hardware import hardware_id, vector_flags
from harness.receipt import build_receipt, save_receipt, summarize

SUITE = "micro"
METRIC = "call_us"


class BenchmarkJSONError(ValueError):
    """A file that is not pytest-benchmark JSON with raw data: says what is missing and how to fix it."""


def _hardware(machine: dict[str, Any], commit: dict[str, Any]) -> dict[str, Any]:
    if isinstance(machine.get("local_kimi"), dict):
        desc = dict(machine["local_kimi"])
    else:
        cpu = given if isinstance(given := machine.get("cpu"), dict) else {}
        desc = {
            "gpus": [],
            "gpu_note": "not recorded: imported from pytest-benchmark's machine_info",
            "cpu": {
                "model": cpu.get("brand_raw")
                or machine.get("processor")
                or machine.get("machine")
                or "unknown",
                "arch": machine.get("machine"),
                "physical_cores": None,
                "logical_cores": cpu.get("count"),
                "ram_bytes": None,
                # py-cpuinfo's flags are /proc/cpuinfo's: with them the id names the vector tier
                **({"vector_flags": vector_flags(cpu["flags"])} if "flags" in cpu else {}),
            },
            "os": {"system": machine.get("system"), "release": machine.get("release"), "platform": None},
            "software": {
                "python": machine.get("python_version"),
                "implementation": str(machine.get("python_implementation", "")).lower() or None,
            },
        }
    desc["git"] = {"commit": commit.get("id"), "dirty": commit.get("dirty")}
    desc["hardware_id"] = desc.get("hardware_id") or hardware_id(desc)
    return desc


def _created(stamp: Any) -> datetime | None:
    """When the benchmarks ran (pytest-benchmark writes UTC), so a re-import gives the same receipts."""
    if not isinstance(stamp, str):
        return None
    created = datetime.fromisoformat(stamp)
    return created if created.tzinfo else created.replace(tzinfo=UTC)


def _case_name(bench: dict[str, Any]) -> str:
    name = (bench.get("extra_info") or {}).get("case")
    if isinstance(name, str) and name:
        return name
    return re.sub(r"[^A-Za-z0-9.=@-]+", ".", bench["fullname"].split("::", 1)[-1]).strip(".")


def _cases(data: Any, source: str) -> dict[str, dict[str, Any]]:
    """Case name -> its benchmark entry, for one pytest-benchmark JSON document."""
    if not isinstance(data, dict) or not isinstance(data.get("benchmarks"), list):
        raise BenchmarkJSONError(f"{source}: not pytest-benchmark JSON (no 'benchmarks' list)")
    cases: dict[str, dict[str, Any]] = {}
    for bench in data["benchmarks"]:
        name = _case_name(bench)
        if not (bench.get("stats") or {}).get("data"):
            raise BenchmarkJSONError(
                f"{source}: case {name} has no raw round times; run pytest with --benchmark-save-data "
                "(`nox -s bench-micro` does)"
            )
        if name in cases:
            raise BenchmarkJSONError(f"{source}: two cases are named {name}")
        cases[name] = bench
    if not cases:
        raise BenchmarkJSONError(f"{source}: the file holds no benchmark cases")
    return cases


def receipts_from_runs(runs: list[tuple[Any, str]], command: list[str] | None = None) -> list[dict[str, Any]]:
    """Built (validated, hashed) receipts, one per case, from one or more pytest-benchmark JSON documents
    (`(data, source)` pairs) of the same cases on the same machine and commit. Several runs are one
    receipt per case: their samples joined, `best_run_median_us`, the smallest of the runs' medians (other
    work on the machine only ever adds time), and `run_spread_pct`, how far apart the runs' medians lie
    (100 × (largest / smallest − 1)): the run-to-run noise of that machine, which the CI gate allows for."""
    if not runs:
        raise BenchmarkJSONError("no pytest-benchmark JSON given")
    (first, first_source), cases = runs[0], [_cases(data, source) for data, source in runs]
    hardware = _hardware(first.get("machine_info") or {}, first.get("commit_info") or {})
    for (data, source), run_cases in zip(runs[1:], cases[1:], strict=True):
        other = _hardware(data.get("machine_info") or {}, data.get("commit_info") or {})
        if (other["hardware_id"], other["git"]) != (hardware["hardware_id"], hardware["git"]):
            raise BenchmarkJSONError(f"{source}: another machine or commit than {first_source}")
        if set(run_cases) != set(cases[0]):
            raise BenchmarkJSONError(f"{source}: other cases than {first_source}")
    sources = [source for _, source in runs]
    receipts = []
    for name, bench in cases[0].items():
        benches = [run_cases[name] for run_cases in cases]
        extra = {k: v for k, v in (bench.get("extra_info") or {}).items() if k != "case"}
        per_run = [[t * 1e6 for t in b["stats"]["data"]] for b in benches]
        samples = [t for run in per_run for t in run]
        medians = [summarize(run)["median"] for run in per_run]
        derived = {"best_run_median_us": min(medians)}
        units = {METRIC: "µs", "best_run_median_us": "µs"}
        if len(per_run) > 1:
            derived["run_spread_pct"] = 100 * (max(medians) / min(medians) - 1)
            units["run_spread_pct"] = "%"
        if isinstance(extra.get("deltas"), int) and extra["deltas"] > 0:
            derived["per_delta_us"] = summarize(samples)["median"] / extra["deltas"]
            units["per_delta_us"] = "µs"
        rounds = [b["stats"].get("rounds") for b in benches]
        iterations = [b["stats"].get("iterations") for b in benches]
        config = extra | {
            "pytest_benchmark": {
                "fullname": bench.get("fullname"),
                "runs": len(benches),
                "rounds": rounds,
                "iterations": iterations,
                "timer": (bench.get("options") or {}).get("timer"),
                "version": first.get("version"),
            }
        }
        receipts.append(build_receipt(
            SUITE, name, config=config, samples={METRIC: samples}, units=units, derived=derived,
            hardware=hardware, created=_created(first.get("datetime")),
            command=command or ["kimi-harness", "import-benchmark", *sources],
            notes=f"pytest-benchmark {bench.get('fullname')}: {len(benches)} run(s) of {'+'.join(map(str, rounds))} "
            "rounds; each sample is one round's time per call",
        ))  # fmt: skip
    return receipts


def read_runs(paths: list[Path]) -> list[tuple[Any, str]]:
    runs = []
    for path in paths:
        try:
            runs.append((orjson.loads(Path(path).read_bytes()), str(path)))
        except (OSError, orjson.JSONDecodeError) as exc:
            raise BenchmarkJSONError(f"{path}: not readable JSON ({exc})") from None
    return runs


def import_benchmark(paths: list[Path], results_dir: Path | None = None) -> list[Path]:
    """Write one `micro` receipt per case of the pytest-benchmark JSON file(s) at `paths`."""
    return [save_receipt(r, results_dir) for r in receipts_from_runs(read_runs(paths))]
