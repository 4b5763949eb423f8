"""Stream a checkpoint into a quantised artifact: safetensors shards + ``manifest.json`` (docs/INT4.md).

Memory stays bounded by one output shard plus one expert bank: source shards are memory-mapped and read
one tensor at a time, and output shards are flushed as soon as they reach ``max_shard_bytes``.
"""

from __future__ import annotations

import contextlib
import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine.codec import INT4_MAX, INT8_MAX, group_scales, quantize
from engine.model.checkpoint_spec import TensorSpec, checkpoint_tensors
from engine.model.config import ConfigError, KimiLinearConfig
from engine.progress import ProgressFactory, no_progress
from engine.quant.budget import stored_nbytes
from engine.quant.manifest import (
    ARTIFACT_FORMAT,
    DTYPE_NAMES,
    FORMAT_VERSION,
    MANIFEST_NAME,
    NIBBLE_ORDER,
    ArtifactError,
    bank_name,
    part_keys,
    part_nbytes,
    sha256_file,
    sha256_files,
    sha256_tensor,
    write_manifest,
)
from engine.quant.plan import Plan
from engine.quant.source import INDEX_NAME, SourceCheckpoint

# Expert projections in bank order, and the shared-expert tensor that joins each bank as its last slot.
BANK_PROJECTIONS = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
_EXPERT = re.compile(r"^model\.layers\.(\d+)\.block_sparse_moe\.experts\.(\d+)\.(w[123])\.weight$")
_SHARED = re.compile(r"^model\.layers\.(\d+)\.block_sparse_moe\.shared_experts\.(gate|up|down)_proj\.weight$")


@dataclass(frozen=True)
class Unit:
    """One logical tensor of the artifact and the source tensors it is made from."""

    name: str
    kind: str  # "expert_bank" | "linear" | "tensor"
    tensor_class: str
    precision: str
    sources: tuple[str, ...]

    @property
    def shared_slot(self) -> int | None:
        """For an expert bank: the slot holding the layer's shared expert (the last one), or None."""
        routed = sum(bool(_EXPERT.match(s)) for s in self.sources)
        return routed if len(self.sources) > routed else None


def plan_units(specs: dict[str, TensorSpec], plan: Plan) -> list[Unit]:
    """Decide every tensor of ``specs`` (refusing unknown names) and group routed experts into per-layer
    banks; units come in the order of ``specs`` (storage order, so reads stay sequential).

    A layer's shared expert joins its banks as the last slot when it has the routed experts' shape and
    precision, so one grouped GEMV over a route table covers both.
    """
    decisions = {name: plan.decide(name, spec.shape) for name, spec in specs.items()}
    experts: dict[tuple[int, str], dict[int, str]] = {}
    shared: dict[tuple[int, str], str] = {}
    for name in specs:
        if match := _EXPERT.match(name):
            experts.setdefault((int(match[1]), match[3]), {})[int(match[2])] = name
        elif match := _SHARED.match(name):
            projection = {v: k for k, v in BANK_PROJECTIONS.items()}[f"{match[2]}_proj"]
            shared[(int(match[1]), projection)] = name

    banked: set[str] = set()
    banks: dict[int, dict[str, Unit]] = {}
    for (layer, projection), by_index in sorted(experts.items()):
        if sorted(by_index) != list(range(len(by_index))):
            raise ArtifactError(f"layer {layer} {projection}: expert indices are not 0..{len(by_index) - 1}")
        slots = [by_index[e] for e in range(len(by_index))]
        first = decisions[slots[0]]
        shapes = {specs[s].shape for s in slots}
        if len(shapes) != 1 or len({decisions[s].precision for s in slots}) != 1:
            raise ArtifactError(f"layer {layer} {projection}: experts differ in shape or precision")
        extra = shared.get((layer, projection))
        if extra and decisions[extra].precision == first.precision and specs[extra].shape in shapes:
            slots.append(extra)
        banked.update(slots)
        unit = Unit(
            bank_name(layer, projection), "expert_bank", first.tensor_class, first.precision, tuple(slots)
        )
        banks.setdefault(layer, {})[projection] = unit

    units: list[Unit] = []
    for name in specs:
        if name in banked:
            # A layer's banks are emitted where its first expert tensor is stored.
            match = _EXPERT.match(name) or _SHARED.match(name)
            assert match is not None  # banked names are expert tensors
            layer = int(match[1])
            layer_banks = banks.pop(layer, {})
            units.extend(layer_banks[p] for p in BANK_PROJECTIONS if p in layer_banks)
            continue
        decision = decisions[name]
        kind = "linear" if decision.quantized else "tensor"
        units.append(Unit(name, kind, decision.tensor_class, decision.precision, (name,)))
    return units


class _ShardWriter:
    """Accumulates tensors and writes a safetensors shard whenever the next one would overflow it."""

    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.directory, self.max_bytes = directory, max_bytes
        self.pending: dict[str, torch.Tensor] = {}
        self.pending_bytes = 0
        self.shards: dict[str, dict] = {}

    @property
    def current_name(self) -> str:
        return f"model-{len(self.shards) + 1:05d}.safetensors"

    def add(self, key: str, tensor: torch.Tensor) -> str:
        size = tensor.numel() * tensor.element_size()
        if self.pending and self.pending_bytes + size > self.max_bytes:
            self.flush()
        self.pending[key] = tensor.contiguous()
        self.pending_bytes += size
        return self.current_name

    def flush(self) -> None:
        if not self.pending:
            return
        name = self.current_name
        path = self.directory / name
        save_file(self.pending, str(path), metadata={"format": "pt"})
        self.shards[name] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
        self.pending, self.pending_bytes = {}, 0


def _encode(tensor: torch.Tensor, precision: str, plan: Plan) -> dict[str, torch.Tensor]:
    """The stored parts (``codes``/``scales`` or ``tensor``) of one source tensor, on its device."""
    if precision in ("int4", "int8"):
        weight = quantize(tensor, precision, plan.group_size, plan.scale_torch_dtype, plan.rounding)
        return {"codes": weight.data, "scales": group_scales(weight)[1]}
    if precision == "bf16":
        return {"tensor": tensor.to(torch.bfloat16)}
    return {"tensor": tensor}


def encode_unit(
    unit: Unit,
    fetch: Callable[[str], torch.Tensor],
    plan: Plan,
    device: torch.device | str,
    on_source: Callable[[torch.Tensor], None] | None = None,
) -> dict[str, torch.Tensor]:
    """Stored parts of a unit, encoded on ``device`` from the source tensors ``fetch(name)`` returns; an
    expert bank's slots are stacked along a new leading axis. ``on_source`` sees each source tensor."""
    stacked: dict[str, torch.Tensor] = {}
    for slot, name in enumerate(unit.sources):
        tensor = fetch(name)
        if on_source is not None:
            on_source(tensor)
        parts = _encode(tensor.to(device), unit.precision, plan)
        if unit.kind != "expert_bank":
            return parts
        for key, part in parts.items():
            if key not in stacked:
                stacked[key] = part.new_empty((len(unit.sources), *part.shape))
            stacked[key][slot] = part
    return stacked


def _materialise(unit: Unit, source: SourceCheckpoint, plan: Plan, device: str) -> tuple[dict, list[str]]:
    """Stored parts of a unit, on the CPU for writing, and the hashes of its source tensors."""
    hashes: list[str] = []
    parts = encode_unit(unit, source.tensor, plan, device, lambda t: hashes.append(sha256_tensor(t)))
    return {key: part.cpu() for key, part in parts.items()}, hashes


def _check_layout(source: SourceCheckpoint) -> bool:
    """Compare the checkpoint with the tensors its ``config.json`` implies; False when there is no config."""
    config = source.config()
    if config is None:
        return False
    try:
        expected = {spec.name: spec for spec in checkpoint_tensors(KimiLinearConfig.from_hf_dict(config))}
    except ConfigError as error:
        raise ArtifactError(f"{source.directory / 'config.json'}: {error}") from error
    problems = [f"missing {n}" for n in expected if n not in source.specs]
    problems += [f"unexpected {n}" for n in source.specs if n not in expected]
    problems += [
        f"{n}: {tuple(s.shape)} {s.dtype} in the checkpoint, {expected[n].shape} {expected[n].dtype} expected"
        for n, s in source.specs.items()
        if n in expected and (s.shape != expected[n].shape or s.dtype != expected[n].dtype)
    ]
    if problems:
        shown = "; ".join(problems[:5])
        raise ArtifactError(f"checkpoint does not match its config.json ({len(problems)} problems): {shown}")
    return True


def _codec_json(plan: Plan) -> dict:
    full_range = plan.rounding != "absmax"  # codes may use the decoders' full range
    scale_rules = {
        "absmax": "scale = absmax(group) / qmax rounded to scale_dtype; 1.0 for an all-zero group",
        "signed": "scale = the group's extreme value (sign kept) / -(qmax + 1) rounded to scale_dtype, so it "
        "may be negative (as llama.cpp's Q4_0); 1.0 for an all-zero group",
        "mse": "per group, the smallest squared error of absmax / qmax and least-squares scales searched "
        "around it (engine/codec.py), rounded to scale_dtype",
    }
    return {
        "name": "symmetric-grouped",
        "group_axis": "input (last) axis",
        "group_size": plan.group_size,
        "scale_dtype": plan.scale_dtype,
        "rounding": plan.rounding,
        "scale_rule": scale_rules[plan.rounding],
        "int4": {
            "code_range": [-INT4_MAX - full_range, INT4_MAX],
            "packing": NIBBLE_ORDER,
            "nibbles": "two's complement",
        },
        "int8": {"code_range": [-INT8_MAX - full_range, INT8_MAX]},
        "dequantize": "code * scale in FP32",
    }


@contextlib.contextmanager
def _staging_directory(destination: Path, overwrite: bool) -> Iterator[Path]:
    """A sibling ``.partial`` directory renamed onto ``destination`` only when the build succeeds."""
    if destination.exists():
        if not overwrite:
            raise ArtifactError(f"{destination} exists; pass overwrite (--force) to replace it")
        if not (destination / MANIFEST_NAME).is_file():
            raise ArtifactError(f"refusing to replace {destination}: it is not an artifact directory")
    staging = destination.with_name(destination.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if destination.exists():
        shutil.rmtree(destination)
    staging.rename(destination)


def build_artifact(
    source_dir: Path,
    destination: Path,
    plan: Plan,
    *,
    max_shard_bytes: int = 2 * 2**30,
    device: str = "cpu",
    overwrite: bool = False,
    progress: ProgressFactory = no_progress,
) -> dict:
    """Quantise ``source_dir`` into ``destination`` following ``plan``; returns the manifest written."""
    source_dir, destination = Path(source_dir), Path(destination)
    with SourceCheckpoint(source_dir) as source, _staging_directory(destination, overwrite) as staging:
        layout_checked = _check_layout(source)
        units = plan_units(source.specs, plan)

        hashed_files = [source_dir / s for s in source.shards]
        if (source_dir / INDEX_NAME).is_file():
            hashed_files.append(source_dir / INDEX_NAME)
        with progress("hashing source", sum(p.stat().st_size for p in hashed_files)) as bar:
            source_hashes = {
                path.name: digest for path, digest in sha256_files(hashed_files, bar.update).items()
            }

        writer = _ShardWriter(staging, max_shard_bytes)
        entries: dict[str, dict] = {}
        planned_bytes = 0
        with progress("quantising", source.total_bytes) as bar:
            for unit in units:
                parts, hashes = _materialise(unit, source, plan, device)
                planned_bytes += sum(
                    stored_nbytes(source.specs[s], unit.precision, plan) for s in unit.sources
                )
                records = {}
                for part, key in part_keys(unit.name, unit.precision).items():
                    tensor = parts[part]
                    records[part] = {
                        "key": key,
                        "shard": writer.add(key, tensor),
                        "dtype": DTYPE_NAMES[tensor.dtype],
                        "shape": list(tensor.shape),
                        "sha256": sha256_tensor(tensor),
                    }
                first = source.specs[unit.sources[0]]
                shape = list(first.shape) if unit.kind != "expert_bank" else [len(unit.sources), *first.shape]
                entries[unit.name] = {
                    "kind": unit.kind,
                    "class": unit.tensor_class,
                    "precision": unit.precision,
                    "shape": shape,
                    "group_size": plan.group_size if unit.precision in ("int4", "int8") else None,
                    "parts": records,
                    "sources": list(unit.sources),
                    "source_sha256": hashes,
                }
                bar.update(sum(source.specs[s].nbytes for s in unit.sources))
            writer.flush()

        stored_bytes = sum(part_nbytes(rec) for entry in entries.values() for rec in entry["parts"].values())
        if stored_bytes != planned_bytes:
            raise ArtifactError(f"wrote {stored_bytes} tensor bytes but the plan predicts {planned_bytes}")

        auxiliary = {}
        for path in source.auxiliary_files():
            shutil.copy2(path, staging / path.name)
            auxiliary[path.name] = sha256_file(path)

        manifest = {
            "format": ARTIFACT_FORMAT,
            "format_version": FORMAT_VERSION,
            "created_utc": datetime.now(UTC).isoformat(timespec="seconds"),
            "plan": plan.to_json(),
            "codec": _codec_json(plan),
            "source": {
                "path": str(source_dir.resolve()),
                "files_sha256": source_hashes,
                "tensor_count": len(source.specs),
                "tensor_bytes": source.total_bytes,
                "layout_checked_against_config": layout_checked,
            },
            "stored_tensor_bytes": stored_bytes,
            "shards": writer.shards,
            "auxiliary_files": auxiliary,
            "tensors": entries,
        }
        write_manifest(staging, manifest)
    return manifest
