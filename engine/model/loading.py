"""Open a Hugging Face checkpoint directory and load it into the model, shard by shard.

A checkpoint is `config.json` plus either `model.safetensors.index.json` with its shards or a single
`model.safetensors`. Every tensor the configuration needs is checked (present, right shape) from the
shard headers before anything is read; tensors are then read memory-mapped, one at a time, and copied
straight into the model's parameters on the target device.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from engine.model.checkpoint_spec import TensorSpec, checkpoint_tensors
from engine.model.config import KimiLinearConfig
from engine.model.kda import ChunkedKernel
from engine.model.model import KimiLinearForCausalLM
from engine.progress import progress_bar

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
SYNTHETIC_MARKER = "synthetic.json"  # written by `kimi-engine synth`; absent from real checkpoints
TRAINING_RECORD = "training.json"  # written by `kimi-engine train`: the weights were trained here

_EXPERT = re.compile(r"^(model\.layers\.\d+\.block_sparse_moe\.experts)\.(\d+)\.(w[123])\.weight$")


class CheckpointError(ValueError):
    """A checkpoint that does not match its config (missing, unexpected, mis-shaped or mis-typed
    tensors) or a shard that cannot be read (empty, truncated, a bad header)."""


FLOAT_DTYPES = ("F16", "BF16", "F32")  # what safetensors headers call the dtypes a float weight may have


@contextmanager
def open_shard(shard: Path):
    """`safe_open` of one shard, with a one-line error naming the file when it is not safetensors."""
    try:
        with safe_open(str(shard), framework="pt", device="cpu") as f:
            yield f
    except SafetensorError as e:
        size = shard.stat().st_size if shard.exists() else 0
        raise CheckpointError(
            f"{shard} ({size} bytes) is not a readable safetensors file ({e}); it may be truncated, empty or "
            "still being copied: copy it again"
        ) from None
    except OSError as e:
        raise CheckpointError(f"cannot read {shard}: {e.strerror or e}") from None


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    path: Path
    config: KimiLinearConfig
    weight_map: dict[str, str]  # tensor name -> shard file name
    specs: dict[str, TensorSpec]
    synthetic: dict | None  # the synthetic marker's contents, or None for a real checkpoint

    @classmethod
    def open(cls, path: str | Path) -> Checkpoint:
        path = Path(path)
        if not path.is_dir():
            raise CheckpointError(f"checkpoint directory {path} does not exist")
        config = KimiLinearConfig.from_file(path)
        weight_map = _weight_map(path)
        specs = {s.name: s for s in checkpoint_tensors(config)}
        missing = sorted(set(specs) - set(weight_map))
        if missing:
            raise CheckpointError(f"{path}: {len(missing)} tensor(s) missing, e.g. {', '.join(missing[:5])}")
        unexpected = sorted(set(weight_map) - set(specs))
        if unexpected:
            raise CheckpointError(
                f"{path}: {len(unexpected)} unexpected tensor(s) for this config, e.g. {', '.join(unexpected[:5])}"
            )
        checkpoint = cls(path=path, config=config, weight_map=weight_map, specs=specs, synthetic=None)
        for shard, names in checkpoint.shards.items():
            _check_shard(path / shard, names, specs)
        marker = path / SYNTHETIC_MARKER
        if marker.exists():
            return dataclasses.replace(checkpoint, synthetic=json.loads(marker.read_text()))
        return checkpoint

    @property
    def weights_kind(self) -> str:
        """ "synthetic" (random values), "trained" (by `kimi-engine train`) or "real" (anything else)."""
        if self.synthetic is not None:
            return "synthetic"
        return "trained" if (self.path / TRAINING_RECORD).exists() else "real"

    @property
    def shards(self) -> dict[str, list[str]]:
        """Shard file name -> the tensor names it holds."""
        out: dict[str, list[str]] = {}
        for name, shard in self.weight_map.items():
            out.setdefault(shard, []).append(name)
        return out

    def weights_sha256(self) -> str:
        """sha256 over the shard files' bytes in name order: which exact weights a receipt measured (two
        trainings of one recipe can differ in the last bit, docs/ENGINE.md)."""
        digest = hashlib.sha256()
        for shard in sorted(self.shards):
            with open(self.path / shard, "rb") as f:
                while block := f.read(1 << 24):
                    digest.update(block)
        return digest.hexdigest()

    @property
    def total_bytes(self) -> int:
        return sum(s.nbytes for s in self.specs.values())

    def read(self, name: str) -> torch.Tensor:
        """One tensor by name (CPU, checkpoint dtype), for random access."""
        with open_shard(self.path / self.weight_map[name]) as f:
            return f.get_tensor(name)

    def tensors(self, *, progress: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield (name, CPU tensor in its checkpoint dtype), one shard open at a time."""
        with progress_bar(length=self.total_bytes, label=f"loading {self.path.name}", show=progress) as bar:
            for shard, names in self.shards.items():
                with open_shard(self.path / shard) as f:
                    for name in names:
                        yield name, f.get_tensor(name)
                        bar.update(self.specs[name].nbytes)


def load_model(
    path: str | Path,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    progress: bool = False,
    kda_chunked_kernel: ChunkedKernel | None = None,
) -> KimiLinearForCausalLM:
    """Build the model on `device` (parameters allocated there, not on the CPU first) and fill it."""
    checkpoint = Checkpoint.open(path)
    model = KimiLinearForCausalLM(
        checkpoint.config, dtype=dtype, device="meta", kda_chunked_kernel=kda_chunked_kernel
    ).to_empty(device=device)
    load_weights(model, checkpoint, progress=progress)
    model.eval()
    return model


def load_weights(model: KimiLinearForCausalLM, checkpoint: Checkpoint, *, progress: bool = False) -> None:
    for name, tensor in checkpoint.tensors(progress=progress):
        parameter_for(model, name).copy_(tensor)


def parameter_for(model: torch.nn.Module, name: str) -> torch.Tensor:
    """The model tensor a checkpoint tensor is loaded into: the parameter of the same name, or for a
    routed expert `...experts.{e}.{w}.weight` the slice [e] of the stacked `...experts.{w}`."""
    expert = _EXPERT.match(name)
    if expert:
        bank, index, projection = expert.groups()
        return model.get_parameter(f"{bank}.{projection}")[int(index)]
    return model.get_parameter(name)


def _weight_map(path: Path) -> dict[str, str]:
    index = path / INDEX_FILE
    if index.exists():
        try:
            return json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise CheckpointError(f"{index} is not a safetensors index (no weight_map)") from e
    single = path / SINGLE_FILE
    if single.exists():
        with open_shard(single) as f:
            return dict.fromkeys(f.keys(), SINGLE_FILE)
    raise CheckpointError(f"{path} has neither {INDEX_FILE} nor {SINGLE_FILE}")


def _check_shard(shard: Path, names: list[str], specs: dict[str, TensorSpec]) -> None:
    if not shard.exists():
        raise CheckpointError(f"shard {shard} listed in the index does not exist")
    with open_shard(shard) as f:
        present = set(f.keys())
        for name in names:
            if name not in present:
                raise CheckpointError(f"tensor {name} is indexed to {shard.name} but is not in that file")
            piece = f.get_slice(name)
            if specs[name].dtype.is_floating_point and piece.get_dtype() not in FLOAT_DTYPES:
                raise CheckpointError(
                    f"tensor {name} in {shard} has dtype {piece.get_dtype()}, expected a float type "
                    f"({', '.join(FLOAT_DTYPES)}; the real checkpoint stores BF16)"
                )
            shape = tuple(piece.get_shape())
            if shape != specs[name].shape:
                raise CheckpointError(
                    f"tensor {name} in {shard.name} has shape {list(shape)}, expected {list(specs[name].shape)}"
                )
