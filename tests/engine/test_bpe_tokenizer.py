"""The BPE trainer and the synthetic tokenizer it makes: correct merges, deterministic, reproducible from its
recipe, consistent with tiktoken's own pre-tokenisation, and compact on what coding agents send."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import tiktoken

from engine.model.bpe_train import _PRETOKENIZER, count_words, tiktoken_file_text, train_bpe
from engine.model.presets import SMALL, TINY
from engine.model.synthetic_tokenizer import (
    recipe,
    recipe_key,
    synthetic_ranks,
    synthetic_tokenizer,
    trained_ranks_file,
)
from engine.model.tokenizer import KIMI_PATTERN
from engine.training.corpus import corpus_files, stdlib_root

CAPTURES = Path(__file__).parents[1] / "k3" / "fixtures" / "client_requests.jsonl"


def test_merges_follow_pair_frequency():
    ranks = train_bpe({"aaab": 3, "ab": 5, "b": 1}, 259)
    # (a,b) 3+5 beats (a,a) 6; then (a,a) and (a,ab) tie at 3 and the bytes decide; then (aa,ab)
    assert ranks[256:] == [b"ab", b"aa", b"aaab"]
    assert ranks[:256] == [bytes([b]) for b in range(256)]


def test_stops_when_no_pair_repeats():
    assert train_bpe({"xy": 1}, 1000) == [bytes([b]) for b in range(256)]


def test_training_ignores_word_order():
    words = count_words(["def spam(eggs):\n    return eggs + 'spam'\n" * 3, "The quick brown fox. " * 4])
    shuffled = list(words.items())
    random.Random(0).shuffle(shuffled)
    assert train_bpe(dict(shuffled), 300) == train_bpe(dict(words), 300)


def test_pre_tokenisation_matches_tiktoken():
    """Words split by the trainer's regex are the pieces tiktoken encodes separately: encoding the words
    one by one gives the ids of encoding the text at once."""
    text = (stdlib_root() / "json" / "decoder.py").read_text()[:20_000] + " Ünïcode 世界 don't 12345\r\n"
    enc = tiktoken.Encoding(
        "t", pat_str=KIMI_PATTERN, mergeable_ranks=_ranks_dict(synthetic_ranks(2000)), special_tokens={}
    )
    pieces = _PRETOKENIZER.findall(text)
    assert "".join(pieces) == text
    assert [i for p in pieces for i in enc.encode_ordinary(p)] == enc.encode_ordinary(text)


def test_reproducible_from_its_recipe(tmp_path):
    """Training twice from the same corpus gives the same file byte for byte (here on a small copy of the
    corpus, so the test takes a second); the cache entry is named by the recipe's hash."""
    root = tmp_path / "lib"
    small = [rel for rel in corpus_files(stdlib_root()) if (stdlib_root() / rel).stat().st_size < 8000]
    for rel in small[:30]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(stdlib_root() / rel, root / rel)
    first = trained_ranks_file(tmp_path / "a", root)
    second = trained_ranks_file(tmp_path / "b", root)
    assert first.read_bytes() == second.read_bytes()
    assert first.name == f"bpe-{recipe_key(recipe(root))}.tiktoken"
    assert json.loads(first.with_suffix(".json").read_text()) == recipe(root)
    (root / corpus_files(root)[0]).write_text("changed = 1\n")
    assert trained_ranks_file(tmp_path / "a", root).name != first.name  # a new corpus, a new entry


def test_presets_get_a_prefix_of_one_merge_list():
    tiny, small = synthetic_ranks(TINY.bos_token_id), synthetic_ranks(SMALL.bos_token_id)
    assert len(tiny) == TINY.vocab_size - 256 and len(small) == SMALL.vocab_size - 256
    assert small[: len(tiny)] == tiny and len(set(small)) == len(small)
    assert tiktoken_file_text(small).count("\n") == len(small)


@pytest.mark.parametrize(("config", "bound"), [(TINY, 0.5), (SMALL, 0.4)])
def test_agent_requests_are_compact(config, bound):
    """Tokens per byte of every captured client request (its JSON body, as the template renders tool
    declarations): byte-level is 1.0; Claude Code's real 25-tool first request (~86k bytes) scales with it."""
    tokenizer = synthetic_tokenizer(config.bos_token_id)
    bodies = [r["body"] for r in map(json.loads, CAPTURES.read_text().splitlines()) if r.get("body")]
    text = "".join(json.dumps(b, ensure_ascii=False) for b in bodies)
    ratio = len(tokenizer.encode(text, allow_special=False)) / len(text.encode())
    assert ratio < bound, f"{ratio:.3f} tokens per byte"


def _ranks_dict(ranks: list[bytes]) -> dict[bytes, int]:
    return {t: i for i, t in enumerate(ranks)}
