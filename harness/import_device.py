"""Put the receipts a GPU run brought back (`python -m runners gpu-check`'s tar) under results/.

Each JSON file in the tar is loaded and checked like any receipt (schema, fields, hash) before anything is
written; its place under results/ comes from its own id (suite/hardware/stamp-name), never from the
member's path in the tar, so an archive cannot write outside results/. Receipts already there (same id,
same bytes) are left as they are; a different receipt under an existing id is refused.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

from harness import json_bytes
from harness.receipt import ReceiptError, validate


def import_device_tar(tar_path: Path, results: Path) -> tuple[list[Path], list[Path]]:
    """(written, already present) receipt paths; raises ReceiptError naming the first bad member."""
    receipts = []
    with tarfile.open(tar_path) as tar:
        for member in tar.getmembers():
            source = tar.extractfile(member) if member.isfile() and member.name.endswith(".json") else None
            if source is None:
                continue
            data = source.read()
            where = f"{tar_path}:{member.name}"
            try:
                receipt = json_bytes.loads(data)
            except json_bytes.DecodeError as exc:
                raise ReceiptError(where, "<file>", f"not readable JSON ({exc})") from None
            validate(receipt, where)
            parts = receipt["id"].split("/")
            if len(parts) != 3 or any(p in ("", ".", "..") or "\\" in p for p in parts):
                raise ReceiptError(where, "id", f"not SUITE/HARDWARE/NAME: {receipt['id']!r}")
            receipts.append((results.joinpath(*parts[:-1], f"{parts[-1]}.json"), data, where))
    written, present = [], []
    for path, data, where in receipts:
        if path.exists():
            if path.read_bytes() != data:
                raise ReceiptError(where, "id", f"{path} exists with different content")
            present.append(path)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        written.append(path)
    return written, present
