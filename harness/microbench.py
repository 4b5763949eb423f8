"""pytest-benchmark JSON -> receipts: suite `micro`, one receipt per benchmark case.

Each case's raw per-call times (pytest-benchmark's `stats.data`, written with `--benchmark-save-data`)
become the samples `call_us`; its `extra_info` becomes the configuration (the `case` key names the
receipt); `machine_info` gives the hardware descriptor (the project's own, when the benchmarks'
conftest recorded it under `local_kimi`, else one mapped from pytest-benchmark's fields) and
`commit_info` the commit. A case with `deltas` in its extra_info also gets `per_delta_us`.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from harness.hardware import hardware_id
from harness.receipt import build_receipt, save_receipt, summarize

SUITE = "micro"
METRIC = "call_us"


class BenchmarkJSONError(ValueError):
    """A file that is not pytest-benchmark JSON with raw data: says what is missing and how to fix it."""


def _hardware(machine: dict[str, Any], commit: dict[str, Any]) -> dict[str, Any]:
    if isinstance(machine.get("local_kimi"), dict):
        desc = dict(machine["local_kimi"])
    else:
        cpu = machine.get("cpu") if isinstance(machine.get("cpu"), dict) else {}
        desc = {
            "gpus": [],
            "gpu_note": "not recorded: imported from pytest-benchmark's machine_info",
            "cpu": {
                "model": cpu.get("brand_raw") or machine.get("processor") or machine.get("machine") or "unknown",
                "arch": machine.get("machine"),
                "physical_cores": None,
                "logical_cores": cpu.get("count"),
                "ram_bytes": None,
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


def receipts_from_json(data: Any, source: str, command: list[str] | None = None) -> list[dict[str, Any]]:
    """Every case of one pytest-benchmark JSON document as a built (validated, hashed) receipt."""
    if not isinstance(data, dict) or not isinstance(data.get("benchmarks"), list):
        raise BenchmarkJSONError(f"{source}: not pytest-benchmark JSON (no 'benchmarks' list)")
    machine, commit = data.get("machine_info") or {}, data.get("commit_info") or {}
    hardware = _hardware(machine, commit)
    created = _created(data.get("datetime"))
    receipts, seen = [], set()
    for bench in data["benchmarks"]:
        stats = bench.get("stats") or {}
        raw = stats.get("data")
        name = _case_name(bench)
        if not raw:
            raise BenchmarkJSONError(
                f"{source}: case {name} has no raw round times; run pytest with --benchmark-save-data "
                "(`nox -s bench-micro` does)"
            )
        if name in seen:
            raise BenchmarkJSONError(f"{source}: two cases are named {name}")
        seen.add(name)
        extra = {k: v for k, v in (bench.get("extra_info") or {}).items() if k != "case"}
        samples = [t * 1e6 for t in raw]
        derived, units = {}, {METRIC: "µs"}
        if isinstance(extra.get("deltas"), int) and extra["deltas"] > 0:
            derived["per_delta_us"] = summarize(samples)["median"] / extra["deltas"]
            units["per_delta_us"] = "µs"
        options = bench.get("options") or {}
        config = extra | {
            "pytest_benchmark": {
                "fullname": bench.get("fullname"),
                "rounds": stats.get("rounds"),
                "iterations": stats.get("iterations"),
                "timer": options.get("timer"),
                "version": data.get("version"),
            }
        }
        receipts.append(build_receipt(
            SUITE, name, config=config, samples={METRIC: samples}, units=units, derived=derived,
            hardware=hardware, created=created, command=command or ["kimi-harness", "import-benchmark", source],
            notes=f"pytest-benchmark {bench.get('fullname')}: {stats.get('rounds')} rounds of "
            f"{stats.get('iterations')} call(s); each sample is one round's time per call",
        ))  # fmt: skip
    if not receipts:
        raise BenchmarkJSONError(f"{source}: the file holds no benchmark cases")
    return receipts


def import_benchmark(path: Path, results_dir: Path | None = None) -> list[Path]:
    """Write one `micro` receipt per case of the pytest-benchmark JSON file at `path`."""
    try:
        data = orjson.loads(Path(path).read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise BenchmarkJSONError(f"{path}: not readable JSON ({exc})") from None
    return [save_receipt(r, results_dir) for r in receipts_from_json(data, str(path))]
