"""Receipts: the machine-readable record behind every number the project shows.

A receipt is one JSON file under `results/<suite>/<hardware_id>/<timestamp>-<name>.json` holding the raw
samples, their summary, the configuration, the hardware descriptor and a sha256 over its canonical
content. Receipts are written only by code and never edited: `load_receipt` refuses one whose hash, schema
or fields are wrong, naming the file and the field. The format is documented in docs/RECEIPTS.md.
"""

from __future__ import annotations

import hashlib
import math
import re
import statistics
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness import json_bytes
from harness.hardware import REPO_ROOT, describe

SCHEMA = "local-kimi.receipt/1"
KNOWN_SCHEMAS = (SCHEMA,)
RESULTS_DIR = REPO_ROOT / "results"

# field -> accepted type(s); `None` values are allowed where the tuple includes type(None).
FIELDS: dict[str, tuple[type, ...]] = {
    "schema": (str,),
    "id": (str,),
    "suite": (str,),
    "name": (str,),
    "created": (str,),
    "command": (list,),
    "config": (dict,),
    "hardware": (dict,),
    "memory_cap": (dict, type(None)),
    "samples": (dict,),
    "units": (dict,),
    "summary": (dict,),
    "derived": (dict,),
    "notes": (str,),
    "sha256": (str,),
}
SUMMARY_KEYS = ("n", "median", "mean", "min", "max", "p10", "p90", "stdev")


class ReceiptError(ValueError):
    """A receipt that cannot be trusted: names the file and the field."""

    def __init__(self, path: Path | str, field: str, message: str):
        super().__init__(f"{path}: field '{field}': {message}")
        self.path, self.field = str(path), field


def summarize(values: list[float]) -> dict:
    """Median, spread and count of one metric's raw samples."""
    data = sorted(float(v) for v in values)
    n = len(data)
    if n == 0:
        raise ValueError("a metric needs at least one sample")
    return {
        "n": n,
        "median": statistics.median(data),
        "mean": statistics.fmean(data),
        "min": data[0],
        "max": data[-1],
        "p10": _percentile(data, 0.10),
        "p90": _percentile(data, 0.90),
        "stdev": statistics.stdev(data) if n > 1 else 0.0,
    }


def _percentile(sorted_data: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default method)."""
    pos = q * (len(sorted_data) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_data) - 1)
    return sorted_data[lo] + (sorted_data[hi] - sorted_data[lo]) * (pos - lo)


def canonical_bytes(receipt: dict) -> bytes:
    """The bytes the hash covers: every field but `sha256`, keys sorted."""
    body = {k: v for k, v in receipt.items() if k != "sha256"}
    return json_bytes.dumps(body)


def content_hash(receipt: dict) -> str:
    return hashlib.sha256(canonical_bytes(receipt)).hexdigest()


def build_receipt(
    suite: str,
    name: str,
    *,
    config: dict,
    samples: dict[str, list[float]],
    units: dict[str, str],
    derived: dict[str, float] | None = None,
    notes: str = "",
    memory: dict | None = None,
    command: list[str] | None = None,
    hardware: dict | None = None,
    created: datetime | None = None,
) -> dict:
    """Assemble a complete receipt in memory (validated, hashed)."""
    created = created or datetime.now(UTC)
    hardware = hardware or describe()
    stamp = created.strftime("%Y%m%dT%H%M%S%fZ")
    receipt = {
        "schema": SCHEMA,
        "id": f"{suite}/{hardware['hardware_id']}/{stamp}-{_safe(name)}",
        "suite": suite,
        "name": name,
        "created": created.isoformat().replace("+00:00", "Z"),
        "command": list(command if command is not None else sys.argv),
        "config": config,
        "hardware": hardware,
        "memory_cap": memory,
        "samples": {k: [float(v) for v in vals] for k, vals in samples.items()},
        "units": dict(units),
        "summary": {k: summarize(vals) for k, vals in samples.items()},
        "derived": {k: float(v) for k, v in (derived or {}).items()},
        "notes": notes,
    }
    # Round-trip through JSON so the hash covers exactly what will be read back (tuples, numpy scalars).
    receipt = json_bytes.loads(json_bytes.dumps(receipt))
    receipt["sha256"] = content_hash(receipt)
    validate(receipt, "<new receipt>")
    return receipt


def write_receipt(suite: str, name: str, *, results_dir: Path | None = None, **fields) -> Path:
    """Build a receipt (`build_receipt`'s fields: config, samples, units, derived, notes, memory, command,
    hardware) and write it under `results_dir` (default: the repository's results/)."""
    return save_receipt(build_receipt(suite, name, **fields), results_dir)


def save_receipt(receipt: dict, results_dir: Path | None = None) -> Path:
    """Write a receipt from `build_receipt` at its place under `results_dir` (default: results/)."""
    path = Path(results_dir or RESULTS_DIR) / f"{receipt['id']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(json_bytes.dumps(receipt, indent=True) + b"\n")
    return path


def _safe(name: str) -> str:
    # Letters, digits, '.', '_' and '-' only: what a device transfer (and most tools) accept in a file name.
    # Receipts written earlier with '@' or '=' in their ids still load: nothing checks an id's spelling.
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_")[:120] or "receipt"


def load_receipt(path: Path | str) -> dict:
    """Read and validate one receipt; raises ReceiptError naming the file and field on any defect."""
    path = Path(path)
    try:
        receipt = json_bytes.loads(path.read_bytes())
    except (OSError, json_bytes.DecodeError) as exc:
        raise ReceiptError(path, "<file>", f"not readable JSON ({exc})") from None
    validate(receipt, path)
    return receipt


def validate(receipt: object, path: Path | str) -> None:
    if not isinstance(receipt, dict):
        raise ReceiptError(path, "<root>", "a receipt is a JSON object")
    if receipt.get("schema") not in KNOWN_SCHEMAS:
        raise ReceiptError(path, "schema", f"unknown schema version {receipt.get('schema')!r}")
    for field, types in FIELDS.items():
        if field not in receipt:
            raise ReceiptError(path, field, "missing")
        if not isinstance(receipt[field], types):
            wanted = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            raise ReceiptError(path, field, f"expected {wanted}, got {type(receipt[field]).__name__}")
    if "hardware_id" not in receipt["hardware"]:
        raise ReceiptError(path, "hardware.hardware_id", "missing")
    for metric, values in receipt["samples"].items():
        if not isinstance(values, list) or not values or not all(_is_number(v) for v in values):
            raise ReceiptError(path, f"samples.{metric}", "expected a non-empty list of numbers")
        if metric not in receipt["units"]:
            raise ReceiptError(path, f"units.{metric}", "every sampled metric needs a unit")
        if receipt["summary"].get(metric) != summarize(values):
            raise ReceiptError(path, f"summary.{metric}", "does not match the raw samples")
    for metric, value in receipt["derived"].items():
        if not _is_number(value):
            raise ReceiptError(path, f"derived.{metric}", "expected a number")
    if receipt["sha256"] != content_hash(receipt):
        raise ReceiptError(path, "sha256", "does not match the content (the receipt was edited)")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def receipt_paths(results_dir: Path | None = None) -> list[Path]:
    return sorted(Path(results_dir or RESULTS_DIR).glob("*/*/*.json"))


def is_dirty(receipt: dict) -> bool:
    """Measured on a tree with uncommitted changes, or one whose state was not recorded: no reader can
    rebuild the number from a commit."""
    return receipt["hardware"].get("git", {}).get("dirty") is not False


def short_id(receipt: dict) -> str:
    """Seven hex digits of the receipt's hash: how the Summary and figure captions name it."""
    return receipt["sha256"][:7]


def resolve_field(receipt: dict, dotted: str) -> Any:
    """`summary.tok_s.median` -> the value; raises KeyError naming the missing part."""
    value: Any = receipt
    for part in dotted.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            raise KeyError(f"no field '{part}' in '{dotted}'")
    return value
