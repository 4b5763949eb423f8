"""Load a quantised artifact for the model: verified first, tensors read on demand.

Typical use by a model loader::

    art = Artifact.open(path)                          # refuses an artifact that fails verification
    wq = art.linear("model.layers.0.self_attn.q_proj.weight", device)   # LinearWeight (int4/int8/dense)
    bank = art.expert_bank(1, "w1", device)            # StoredExpertBank: [slots, N, K/2] codes + scales
    norm = art.tensor("model.norm.weight", device)
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from engine.codec import LinearWeight
from engine.progress import ProgressFactory, no_progress
from engine.quant.build import Unit
from engine.quant.manifest import ArtifactError, bank_name, read_manifest
from engine.quant.plan import Plan
from engine.quant.verify import verify_artifact


class ArtifactVerificationError(ArtifactError):
    """The artifact failed verification; the message lists every problem."""


@dataclass(frozen=True)
class StoredExpertBank:
    """A layer's stacked expert projection as stored (the module is `engine.model.moe.ExpertBank`): slots
    ``0..routed-1`` are routed experts, then the shared one."""

    weight: LinearWeight  # [slots, N, ...]
    routed: int
    shared_slot: int | None  # index of the shared expert in the bank, or None when stored separately


class Artifact:
    def __init__(self, directory: Path, manifest: dict) -> None:
        self.directory = Path(directory)
        self.manifest = manifest
        self.plan = Plan.from_json(manifest["plan"])

    @classmethod
    def open(
        cls, directory: Path, *, verify: bool = True, sample: int = 8, progress: ProgressFactory = no_progress
    ) -> Artifact:
        """Open ``directory``; with ``verify`` (default) re-hash every shard and self-check a sample first.

        ``verify=False`` is the explicit override for an artifact known to be good (or deliberately
        damaged); it warns.
        """
        directory = Path(directory)
        if verify:
            report = verify_artifact(directory, use_recorded_source=False, sample=sample, progress=progress)
            if not report.ok:
                raise ArtifactVerificationError(
                    f"refusing to load {directory}; it failed verification:\n{report.summary()}"
                )
        else:
            warnings.warn(f"loading {directory} without verification", stacklevel=2)
        return cls(directory, read_manifest(directory))

    @property
    def config(self) -> dict | None:
        path = self.directory / "config.json"
        return json.loads(path.read_text()) if path.is_file() else None

    @property
    def names(self) -> list[str]:
        return list(self.manifest["tensors"])

    def entry(self, name: str) -> dict:
        try:
            return self.manifest["tensors"][name]
        except KeyError:
            raise ArtifactError(f"artifact has no tensor {name!r}") from None

    def units(self) -> list[Unit]:
        """Every logical tensor with the source tensors it was made from, in storage order."""
        return [self.unit(name) for name in self.manifest["tensors"]]

    def unit(self, name: str) -> Unit:
        entry = self.entry(name)
        return Unit(name, entry["kind"], entry["class"], entry["precision"], tuple(entry["sources"]))

    def parts(self, unit: Unit, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
        """The stored parts of a unit: ``codes`` + ``scales``, or one ``tensor``."""
        parts = {}
        for part, record in self.entry(unit.name)["parts"].items():
            with safe_open(self.directory / record["shard"], "pt", device=str(device)) as f:
                parts[part] = f.get_tensor(record["key"])
        return parts

    def tensor(self, name: str, device: torch.device | str = "cpu") -> torch.Tensor:
        """A tensor stored unquantised (norms, router, KDA controls, embedding, a BF16 head, ...)."""
        unit = self.unit(name)
        parts = self.parts(unit, device)
        if "tensor" not in parts:
            raise ArtifactError(f"{name} is stored as {unit.precision}; use linear()")
        return parts["tensor"]

    def linear(self, name: str, device: torch.device | str = "cpu") -> LinearWeight:
        """A 2-D weight in its stored format: ``int4``/``int8`` codes + scales, or ``dense``."""
        unit = self.unit(name)
        if unit.kind == "expert_bank":
            raise ArtifactError(f"{name} is an expert bank; use expert_bank()")
        return stored_weight(unit, self.parts(unit, device), self.plan)

    def expert_bank(
        self, layer: int, projection: str, device: torch.device | str = "cpu"
    ) -> StoredExpertBank:
        """The stacked ``w1`` (gate), ``w3`` (up) or ``w2`` (down) bank of an MoE layer."""
        unit = self.unit(bank_name(layer, projection))
        weight = stored_weight(unit, self.parts(unit, device), self.plan)
        shared = unit.shared_slot
        return StoredExpertBank(weight, len(unit.sources) - (shared is not None), shared)


def stored_weight(unit: Unit, parts: dict[str, torch.Tensor], plan: Plan) -> LinearWeight:
    """A unit's stored parts as a weight: ``dense`` for a stored tensor, else codes + scales."""
    if "tensor" in parts:
        return LinearWeight("dense", parts["tensor"])
    return LinearWeight(unit.precision, parts["codes"], parts["scales"], plan.group_size)
