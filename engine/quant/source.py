"""Read a HF safetensors checkpoint lazily: tensor headers up front, tensor data one at a time."""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path

import torch
from safetensors import safe_open

from engine.model.checkpoint_spec import TensorSpec
from engine.quant.manifest import SAFETENSORS_DTYPES, ArtifactError

INDEX_NAME = "model.safetensors.index.json"


class SourceCheckpoint:
    """A sharded (``model.safetensors.index.json``) or single-file safetensors checkpoint directory.

    Use as a context manager; shard files are memory-mapped, so only the tensors read are paged in.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise ArtifactError(f"checkpoint directory {self.directory} does not exist")
        index = self.directory / INDEX_NAME
        if index.is_file():
            weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        else:
            files = sorted(p.name for p in self.directory.glob("*.safetensors"))
            if not files:
                raise ArtifactError(f"{self.directory} has neither {INDEX_NAME} nor *.safetensors files")
            weight_map = {}
            for file in files:
                with safe_open(self.directory / file, "pt") as f:
                    weight_map.update(dict.fromkeys(f.keys(), file))
        self.weight_map = weight_map
        self.shards = sorted(set(weight_map.values()))
        self._stack = ExitStack()
        self._handles: dict[str, object] = {}
        # In storage order (shard, then offset), so reading in this order stays sequential.
        self.specs: dict[str, TensorSpec] = {}
        for shard in self.shards:
            handle = self._handle(shard)
            wanted = {n for n, s in weight_map.items() if s == shard}
            missing = wanted - set(handle.keys())
            if missing:
                raise ArtifactError(
                    f"index maps {sorted(missing)[:3]} to {shard}, which does not contain them"
                )
            for name in handle.offset_keys():
                if name in wanted:
                    sliced = handle.get_slice(name)
                    self.specs[name] = TensorSpec(
                        name, tuple(sliced.get_shape()), SAFETENSORS_DTYPES[sliced.get_dtype()]
                    )

    def _handle(self, shard: str):
        if shard not in self._handles:
            path = self.directory / shard
            if not path.is_file():
                raise ArtifactError(f"checkpoint shard {path} is missing")
            self._handles[shard] = self._stack.enter_context(safe_open(path, "pt"))
        return self._handles[shard]

    def __enter__(self) -> SourceCheckpoint:
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def tensor(self, name: str) -> torch.Tensor:
        if name not in self.weight_map:
            raise ArtifactError(f"checkpoint has no tensor {name!r}")
        return self._handle(self.weight_map[name]).get_tensor(name)

    def config(self) -> dict | None:
        path = self.directory / "config.json"
        return json.loads(path.read_text()) if path.is_file() else None

    def auxiliary_files(self) -> list[Path]:
        """Files to carry into an artifact (config, tokenizer, ...): everything but weights and index."""
        return sorted(
            p
            for p in self.directory.iterdir()
            if p.is_file()
            and p.suffix != ".safetensors"
            and p.name != INDEX_NAME
            and not p.name.startswith(".")
        )

    @property
    def total_bytes(self) -> int:
        return sum(spec.nbytes for spec in self.specs.values())
