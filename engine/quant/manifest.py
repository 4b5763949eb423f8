"""The artifact manifest (``manifest.json``) and the hashing it relies on; layout documented in docs/INT4.md."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

MANIFEST_NAME = "manifest.json"
ARTIFACT_FORMAT = "kimi-engine-quantized"
FORMAT_VERSION = 1
NIBBLE_ORDER = "byte j of a row holds input 2j in the low nibble and input 2j+1 in the high nibble"

# safetensors dtype names <-> torch dtypes.
SAFETENSORS_DTYPES = {
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "F64": torch.float64,
    "U8": torch.uint8,
    "I8": torch.int8,
    "I16": torch.int16,
    "I32": torch.int32,
    "I64": torch.int64,
    "BOOL": torch.bool,
}
DTYPE_NAMES = {v: k for k, v in SAFETENSORS_DTYPES.items()}

_HASH_CHUNK = 16 * 2**20


class ArtifactError(RuntimeError):
    """An artifact is missing, malformed or does not match its manifest."""


def sha256_tensor(tensor: torch.Tensor) -> str:
    """SHA-256 of a tensor's bytes as safetensors stores them (C order, little endian)."""
    flat = tensor.detach().contiguous().reshape(-1)
    return hashlib.sha256(flat.view(torch.uint8).cpu().numpy().data).hexdigest()


def sha256_file(path: Path, on_bytes=None) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
            if on_bytes is not None:
                on_bytes(len(chunk))
    return digest.hexdigest()


def sha256_files(paths: list[Path], on_bytes=None, workers: int | None = None) -> dict[Path, str]:
    """SHA-256 of several files, hashed in parallel (hashlib releases the GIL); ``on_bytes`` is serialised."""
    lock = threading.Lock()

    def report(n: int) -> None:
        if on_bytes is not None:
            with lock:
                on_bytes(n)

    workers = workers or min(8, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        digests = pool.map(lambda p: sha256_file(p, report), paths)
        return dict(zip(paths, digests, strict=True))


def bank_name(layer: int, projection: str) -> str:
    """Logical name of a layer's stacked expert bank for ``w1`` (gate), ``w3`` (up) or ``w2`` (down)."""
    return f"model.layers.{layer}.block_sparse_moe.expert_bank.{projection}"


def part_keys(logical_name: str, precision: str) -> dict[str, str]:
    """The safetensors keys holding a logical tensor: ``codes`` + ``scales``, or one ``tensor``."""
    if precision in ("int4", "int8"):
        return {"codes": f"{logical_name}.{precision}_codes", "scales": f"{logical_name}.{precision}_scales"}
    return {"tensor": logical_name}


def part_nbytes(record: dict) -> int:
    """Bytes of one stored part, from its manifest record."""
    count = 1
    for dim in record["shape"]:
        count *= dim
    return count * SAFETENSORS_DTYPES[record["dtype"]].itemsize


def read_manifest(directory: Path) -> dict:
    path = Path(directory) / MANIFEST_NAME
    if not path.is_file():
        raise ArtifactError(f"{directory} is not an artifact: {MANIFEST_NAME} is missing")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ArtifactError(f"{path} is not valid JSON: {error}") from error
    if manifest.get("format") != ARTIFACT_FORMAT or manifest.get("format_version") != FORMAT_VERSION:
        raise ArtifactError(
            f"{path} is not a {ARTIFACT_FORMAT} v{FORMAT_VERSION} manifest "
            f"(format {manifest.get('format')!r}, version {manifest.get('format_version')!r})"
        )
    return manifest


def write_manifest(directory: Path, manifest: dict) -> Path:
    path = Path(directory) / MANIFEST_NAME
    path.write_text(json.dumps(manifest, indent=1) + "\n")
    return path
