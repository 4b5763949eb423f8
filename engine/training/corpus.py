"""The training corpus: the running interpreter's standard-library `.py` files, every machine has them.

Files are taken in sorted order of their path relative to the stdlib root (test packages and
site-packages left out: the tests are mostly generated data); a file is held out when the sha256 of that
relative path falls in the held-out slice (1 in 20), so the split does not depend on file contents or on
the order files are found. Each file is encoded with the checkpoint tokenizer and preceded by the BOS
token. The encoded corpus is cached under `.cache/training/` keyed by its sha256 and the tokenizer.
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.model.tokenizer import TIKTOKEN_FILE, Tokenizer

HELDOUT_ONE_IN = 20
_SKIPPED_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def corpus_files(root: Path) -> list[str]:
    """Relative paths (POSIX form) of the corpus's `.py` files, sorted."""
    paths = (p.relative_to(root) for p in root.rglob("*.py"))
    return sorted(p.as_posix() for p in paths if not _SKIPPED_DIRS & set(p.parts[:-1]))


def is_heldout(relative_path: str) -> bool:
    digest = hashlib.sha256(relative_path.encode()).digest()
    return int.from_bytes(digest[:8], "little") % HELDOUT_ONE_IN == 0


@dataclass
class Corpus:
    train_ids: torch.Tensor  # int32 [n], files concatenated, each after a BOS token
    heldout_ids: torch.Tensor  # int32 [m], the same for the held-out files
    heldout_text: str  # the held-out files concatenated (for runners that tokenise text themselves)
    sha256: str  # of every (relative path, contents) pair in order
    train_files: int
    heldout_files: int

    def describe(self) -> dict:
        return {
            "source": "the running interpreter's standard-library .py files (tests excluded)",
            "sha256": self.sha256,
            "files": self.train_files + self.heldout_files,
            "train_files": self.train_files,
            "heldout_files": self.heldout_files,
            "train_tokens": int(self.train_ids.numel()),
            "heldout_tokens": int(self.heldout_ids.numel()),
            "heldout_split": f"sha256(relative path) % {HELDOUT_ONE_IN} == 0",
        }


def build_corpus(tokenizer_dir: Path, cache_dir: Path, root: Path | None = None) -> Corpus:
    """Read, split, encode with the tokenizer in `tokenizer_dir` (or load the cached encoding of) the
    corpus under `root` (default: the stdlib)."""
    root = root or stdlib_root()
    tokenizer = Tokenizer.from_dir(tokenizer_dir)
    tokenizer_sha = hashlib.sha256((tokenizer_dir / TIKTOKEN_FILE).read_bytes()).hexdigest()
    files = corpus_files(root)
    if not files:
        raise ValueError(f"no .py files under {root}")
    digest = hashlib.sha256()
    texts: dict[str, str] = {}
    for rel in files:
        data = (root / rel).read_bytes()
        digest.update(rel.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
        texts[rel] = data.decode("utf-8", errors="replace")
    sha = digest.hexdigest()
    heldout = [rel for rel in files if is_heldout(rel)]
    train = [rel for rel in files if not is_heldout(rel)]
    if not heldout or not train:
        raise ValueError(f"{len(files)} files under {root} are too few to hold some out")
    heldout_text = "".join(texts[rel] for rel in heldout)
    cached = cache_dir / f"corpus-{sha[:16]}-{tokenizer_sha[:12]}.pt"
    if cached.exists():
        ids = torch.load(cached)
    else:
        ids = {
            "train": _encode(tokenizer, [texts[r] for r in train]),
            "heldout": _encode(tokenizer, [texts[r] for r in heldout]),
        }
        cache_dir.mkdir(parents=True, exist_ok=True)
        partial = cached.with_suffix(".partial")
        torch.save(ids, partial)
        partial.replace(cached)
    return Corpus(ids["train"], ids["heldout"], heldout_text, sha, len(train), len(heldout))


def _encode(tokenizer: Tokenizer, texts: list[str]) -> torch.Tensor:
    ids: list[int] = []
    for text in texts:
        ids.append(tokenizer.bos_id)
        ids += tokenizer.encode(text, allow_special=False)
    return torch.tensor(ids, dtype=torch.int32)
