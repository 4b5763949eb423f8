"""Verify an artifact: shard and tensor hashes, headers against the manifest, and round-trip error bounds.

Every problem names where it is (a shard, a tensor, a bank slot), so a flipped byte or two swapped
tensors are reported by name, not only as "hash mismatch".
"""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open

from engine.codec import (
    LinearWeight,
    dequantize,
    group_squared_error,
    integer_codes,
    quantize,
    roundtrip_error_bound,
)
from engine.progress import ProgressFactory, no_progress
from engine.quant.manifest import (
    ArtifactError,
    read_manifest,
    sha256_file,
    sha256_files,
    sha256_tensor,
)
from engine.quant.source import SourceCheckpoint


@dataclass(frozen=True)
class Problem:
    where: str
    what: str

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


@dataclass(frozen=True)
class RoundTrip:
    """One sampled source tensor: worst ``|stored - source| / bound`` (<= 1 passes; kept tensors: 0 or inf)."""

    tensor: str
    source: str
    worst_ratio: float


@dataclass
class VerifyReport:
    directory: Path
    problems: list[Problem] = field(default_factory=list)
    shards_checked: int = 0
    roundtrips: list[RoundTrip] = field(default_factory=list)
    source_used: Path | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        lines = [f"{self.shards_checked} shards re-hashed"]
        if self.source_used is None:
            lines.append(
                f"{len(self.roundtrips)} sampled tensors checked for internal consistency (no source)"
            )
        else:
            worst = max((r.worst_ratio for r in self.roundtrips), default=0.0)
            lines.append(
                f"{len(self.roundtrips)} sampled tensors round-tripped against {self.source_used} "
                f"(worst error / bound = {worst:.6g}; at most 1 passes)"
            )
        lines += [f"PROBLEM {p}" for p in self.problems]
        lines.append("OK" if self.ok else f"FAILED: {len(self.problems)} problem(s)")
        return "\n".join(lines)


def _check_shards(directory: Path, manifest: dict, report: VerifyReport, progress: ProgressFactory) -> None:
    parts_by_shard: dict[str, dict[str, tuple[str, dict]]] = {}
    for name, entry in manifest["tensors"].items():
        for part, record in entry["parts"].items():
            parts_by_shard.setdefault(record["shard"], {})[record["key"]] = (f"{name} [{part}]", record)
    key_of_hash = {rec["sha256"]: key for parts in parts_by_shard.values() for key, (_, rec) in parts.items()}

    unknown = {p.name for p in directory.glob("*.safetensors")} - set(manifest["shards"])
    report.problems += [Problem(name, "shard not listed in the manifest") for name in sorted(unknown)]

    present = [shard for shard in manifest["shards"] if (directory / shard).is_file()]
    report.problems += [Problem(s, "shard file is missing") for s in manifest["shards"] if s not in present]
    with progress("hashing shards", sum((directory / s).stat().st_size for s in present)) as bar:
        digests = sha256_files([directory / s for s in present], bar.update)
    for shard in present:
        report.shards_checked += 1
        hash_ok = digests[directory / shard] == manifest["shards"][shard]["sha256"]
        if not hash_ok:
            report.problems.append(Problem(shard, "sha256 differs from the manifest"))
        _check_shard_contents(directory / shard, parts_by_shard.get(shard, {}), key_of_hash, hash_ok, report)


def _check_shard_contents(
    path: Path, expected: dict[str, tuple[str, dict]], key_of_hash: dict[str, str], hash_ok: bool, report
) -> None:
    """Compare the header with the manifest; on a hash mismatch, hash each tensor to name the damaged ones."""
    try:
        with safe_open(path, "pt") as f:
            present = set(f.keys())
            for key in sorted(present - set(expected)):
                report.problems.append(Problem(f"{path.name}:{key}", "tensor not listed in the manifest"))
            for key, (label, record) in expected.items():
                if key not in present:
                    report.problems.append(Problem(label, f"missing from {path.name}"))
                    continue
                sliced = f.get_slice(key)
                if sliced.get_dtype() != record["dtype"] or list(sliced.get_shape()) != record["shape"]:
                    report.problems.append(
                        Problem(
                            label,
                            f"stored as {sliced.get_dtype()} {sliced.get_shape()}, "
                            f"manifest says {record['dtype']} {record['shape']}",
                        )
                    )
                    continue
                if hash_ok:
                    continue
                actual = sha256_tensor(f.get_tensor(key))
                if actual != record["sha256"]:
                    other = key_of_hash.get(actual)
                    hint = f"; it holds the data recorded for {other} (swapped)" if other else ""
                    report.problems.append(Problem(label, f"tensor bytes differ from the manifest{hint}"))
    except (OSError, ValueError, RuntimeError) as error:  # safetensors raises these on a damaged header
        report.problems.append(Problem(path.name, f"cannot be read as safetensors: {error}"))


def _load_part(directory: Path, record: dict, slot: int | None) -> torch.Tensor:
    with safe_open(directory / record["shard"], "pt") as f:
        if slot is None:
            return f.get_tensor(record["key"])
        return f.get_slice(record["key"])[slot]  # reads one bank slot only


def _stored_slot(directory: Path, entry: dict, slot: int | None) -> LinearWeight | torch.Tensor:
    parts = {name: _load_part(directory, rec, slot) for name, rec in entry["parts"].items()}
    if "tensor" in parts:
        return parts["tensor"]
    return LinearWeight(entry["precision"], parts["codes"], parts["scales"], entry["group_size"])


# A searched ("mse") group may not exceed the absmax encoding's squared error; the slack covers summation order.
_MSE_SLACK = 1 + 2**-12


def _roundtrip(stored, original: torch.Tensor, precision: str, rounding: str) -> float:
    if isinstance(stored, torch.Tensor):
        expected = original.to(torch.bfloat16) if precision == "bf16" else original
        return 0.0 if torch.equal(stored, expected) else float("inf")
    if rounding == "mse":
        assert stored.scales is not None and stored.group_size is not None  # quantised
        absmax = quantize(original, precision, stored.group_size, stored.scales.dtype)
        bound = group_squared_error(absmax, original) * _MSE_SLACK + torch.finfo(torch.float32).tiny
        return float((group_squared_error(stored, original) / bound).max())
    error = (dequantize(stored) - original.float()).abs()
    return float((error / roundtrip_error_bound(stored, rounding)).max())


def _self_consistent(stored, precision: str, rounding: str) -> str | None:
    """Checks possible without the source: finite scales (positive unless ``signed``), codes in the encoder's
    range."""
    if isinstance(stored, torch.Tensor):
        finite = not stored.is_floating_point() or bool(torch.isfinite(stored).all())
        return None if finite else "non-finite values"
    signed = rounding == "signed"
    if not torch.isfinite(stored.scales.float()).all():
        return "scales are not all finite"
    allowed = stored.scales != 0 if signed else stored.scales > 0
    if not allowed.all():
        return "scales are not all nonzero" if signed else "scales are not all positive"
    qmax = 7 if precision == "int4" else 127
    low = -qmax - (rounding != "absmax")
    codes = integer_codes(stored)
    if codes.max() > qmax or codes.min() < low:
        return f"codes outside [{low}, {qmax}]"
    return None


def _sample(manifest: dict, sample: int | None, seed: int) -> list[tuple[str, int | None]]:
    pairs = [
        (name, slot if entry["kind"] == "expert_bank" else None)
        for name, entry in manifest["tensors"].items()
        for slot in range(len(entry["sources"]))
    ]
    if sample is None or sample >= len(pairs):
        return pairs
    return sorted(random.Random(seed).sample(pairs, sample), key=pairs.index)


def verify_artifact(
    directory: Path,
    *,
    source: Path | None = None,
    use_recorded_source: bool = True,
    sample: int | None = 16,
    seed: int = 0,
    progress: ProgressFactory = no_progress,
) -> VerifyReport:
    """Re-hash every shard and check ``sample`` source tensors (all when None) against their bounds.

    The round trip runs against ``source``, or the checkpoint recorded in the manifest when it still
    exists and ``use_recorded_source``; otherwise only self-consistency of the sample is checked.
    """
    directory = Path(directory)
    report = VerifyReport(directory)
    try:
        manifest = read_manifest(directory)
    except ArtifactError as error:
        report.problems.append(Problem(str(directory), str(error)))
        return report

    _check_shards(directory, manifest, report, progress)
    for name, digest in manifest["auxiliary_files"].items():
        path = directory / name
        if not path.is_file() or sha256_file(path) != digest:
            report.problems.append(Problem(name, "auxiliary file missing or changed"))
    if report.problems:  # Decoding damaged shards would only repeat what the hashes said.
        return report

    recorded = Path(manifest["source"]["path"])
    if source is None and use_recorded_source and recorded.is_dir():
        source = recorded
    rounding = manifest["plan"].get("rounding", "absmax")  # absent before the option: absmax
    pairs = _sample(manifest, sample, seed)
    checkpoint = SourceCheckpoint(source) if source is not None else None
    report.source_used = source
    with checkpoint or contextlib.nullcontext(), progress("round trip", len(pairs)) as bar:
        for name, slot in pairs:
            entry = manifest["tensors"][name]
            index = slot or 0
            source_name = entry["sources"][index]
            label = name if slot is None else f"{name} slot {slot} ({source_name})"
            stored = _stored_slot(directory, entry, slot)
            if checkpoint is None:
                issue = _self_consistent(stored, entry["precision"], rounding)
                report.roundtrips.append(RoundTrip(name, source_name, 0.0 if issue is None else float("inf")))
                if issue:
                    report.problems.append(Problem(label, issue))
            else:
                original = checkpoint.tensor(source_name)
                if sha256_tensor(original) != entry["source_sha256"][index]:
                    report.problems.append(
                        Problem(label, f"{source_name} in {source} is not the tensor quantised")
                    )
                    continue
                ratio = _roundtrip(stored, original, entry["precision"], rounding)
                report.roundtrips.append(RoundTrip(name, source_name, ratio))
                if ratio > 1.0:
                    report.problems.append(
                        Problem(
                            label, f"round-trip error exceeds its bound (worst error / bound = {ratio:.3g})"
                        )
                    )
            bar.update(1)
    return report
