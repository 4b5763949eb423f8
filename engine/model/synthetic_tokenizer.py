"""The tokenizer synthetic and trained checkpoints ship: a BPE trained here, on text every machine has.

Recipe: the training split of the training corpus (engine/training/corpus.py: the running interpreter's
standard-library `.py` files, whose docstrings and comments are also much of English; held-out files left
out so held-out bits per byte stay honest), pre-tokenised with Moonshot's pattern, trained by
engine/model/bpe_train.py to `MAX_RANKS` ranks once and cached under `.cache/tokenizer/` keyed by the
recipe. A checkpoint of a preset takes the first `config.bos_token_id` ranks (a prefix of a BPE merge list is
the BPE of that size), then the special tokens (as in the real tokenizer, right after the ranks). A config
whose special tokens start at 256 gets the plain byte-level file.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from pathlib import Path

from engine.model.bpe_train import count_words, tiktoken_file_text, train_bpe
from engine.model.tokenizer import (
    CONFIG_FILE,
    KIMI_PATTERN,
    SYNTHETIC_SPECIAL_TOKENS,
    TIKTOKEN_FILE,
    Tokenizer,
    read_tiktoken_ranks,
)

MAX_RANKS = 16_128  # the `small` preset's 16,384 ids less 256 special tokens
BPE_VERSION = 1  # bump when the trainer or its corpus selection changes
CACHE_DIR = Path(__file__).resolve().parents[2] / ".cache" / "tokenizer"


def recipe(root: Path | None = None) -> dict:
    """What the trained ranks depend on; its hash names the cache entry."""
    from engine.training.corpus import corpus_files, is_heldout, stdlib_root

    root = root or stdlib_root()
    digest = hashlib.sha256()
    files = [rel for rel in corpus_files(root) if not is_heldout(rel)]
    for rel in files:
        data = (root / rel).read_bytes()
        digest.update(rel.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    return {
        "version": BPE_VERSION,
        "corpus": "training split of the standard-library .py files",
        "corpus_sha256": digest.hexdigest(),
        "files": len(files),
        "pattern": KIMI_PATTERN,
        "ranks": MAX_RANKS,
    }


def recipe_key(spec: dict) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def trained_ranks_file(cache_dir: Path = CACHE_DIR, root: Path | None = None) -> Path:
    """The cached `tiktoken.model` of MAX_RANKS ranks for this machine's corpus, trained first if absent."""
    spec = recipe(root)
    path = cache_dir / f"bpe-{recipe_key(spec)}.tiktoken"
    if path.exists():
        return path
    from engine.training.corpus import corpus_files, is_heldout, stdlib_root

    base = root or stdlib_root()
    texts = (
        (base / rel).read_bytes().decode("utf-8", errors="replace")
        for rel in corpus_files(base)
        if not is_heldout(rel)
    )
    ranks = train_bpe(count_words(texts), MAX_RANKS)
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=cache_dir, delete=False, suffix=".partial") as f:
        f.write(tiktoken_file_text(ranks))
    os.replace(f.name, path)  # atomic: concurrent starts see a whole file or none
    path.with_suffix(".json").write_text(json.dumps(spec, indent=2) + "\n")
    return path


@functools.cache
def _cached_ranks() -> list[bytes]:
    ranks = read_tiktoken_ranks(trained_ranks_file())
    return sorted(ranks, key=ranks.__getitem__)


def synthetic_ranks(num_ranks: int) -> list[bytes]:
    """The first `num_ranks` token byte strings of the synthetic BPE (256: the bytes alone)."""
    if num_ranks <= 256:
        return [bytes([b]) for b in range(256)]
    return _cached_ranks()[:num_ranks]


def special_base(vocab_size: int) -> int:
    """Where a synthetic preset of `vocab_size` ids puts its special tokens (the ranks come first)."""
    return max(256, min(vocab_size - 256, MAX_RANKS))


def write_synthetic_tokenizer(path: str | Path, num_ranks: int = 256) -> None:
    """Write `tiktoken.model` (the first `num_ranks` ranks) + `tokenizer_config.json` into `path`; pass a
    config's `bos_token_id` (its special tokens start right after the ranks)."""
    path = Path(path)
    ranks = synthetic_ranks(num_ranks)
    (path / TIKTOKEN_FILE).write_text(tiktoken_file_text(ranks))
    base = len(ranks)
    decoder = {
        str(base + off): {"content": name, "special": True} for off, name in SYNTHETIC_SPECIAL_TOKENS.items()
    }
    config = {
        "tokenizer_class": "TikTokenTokenizer",
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
        "unk_token": "[UNK]",
        "pad_token": "[PAD]",
        "added_tokens_decoder": decoder,
        "model_max_length": 1048576,
    }
    (path / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")


def synthetic_tokenizer(num_ranks: int = 256) -> Tokenizer:
    with tempfile.TemporaryDirectory() as tmp:
        write_synthetic_tokenizer(tmp, num_ranks)
        return Tokenizer.from_dir(tmp)
