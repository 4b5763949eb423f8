"""The tiktoken-based tokenizer: the synthetic BPE file (trained here), and a real-style BPE file with merges."""

from __future__ import annotations

import base64
import json

import pytest

from engine.model import Tokenizer
from engine.model.synthetic_tokenizer import write_synthetic_tokenizer
from engine.model.tokenizer import TokenizerError


@pytest.fixture(scope="module")
def synthetic(tiny_dir):
    return Tokenizer.from_dir(tiny_dir)


def test_bpe_round_trip(synthetic):
    text = "def f(x):\n    return x * 2  # café 世界 🙂"
    ids = synthetic.encode(text)
    code = "    def __init__(self, name):\n        return self.name"
    assert len(synthetic.encode(code)) < len(code) / 3  # merges: far fewer ids than bytes
    assert synthetic.decode(ids) == text


def test_special_tokens_match_the_model_config(synthetic, tiny_model):
    cfg = tiny_model.config
    assert synthetic.bos_id == cfg.bos_token_id == cfg.vocab_size - 256  # special tokens after the ranks
    assert synthetic.token_id("<|im_end|>") == cfg.eos_token_id
    assert synthetic.token_id("[PAD]") == cfg.pad_token_id
    assert synthetic.eos_id == synthetic.token_id("[EOS]")
    ids = synthetic.encode("<|im_user|>hi<|im_end|>")
    assert ids[0] == synthetic.token_id("<|im_user|>") and ids[-1] == synthetic.token_id("<|im_end|>")
    assert synthetic.decode(ids[1:-1]) == "hi"
    as_text = synthetic.encode("<|im_end|>", allow_special=False)
    assert synthetic.decode(as_text) == "<|im_end|>" and max(as_text) < cfg.bos_token_id
    assert synthetic.decode(ids) == "<|im_user|>hi<|im_end|>"
    assert synthetic.token_id("<think>") != synthetic.token_id("</think>")
    with pytest.raises(TokenizerError, match="not a special token"):
        synthetic.token_id("<|nope|>")


def test_incremental_bytes_for_streaming(synthetic):
    ids = synthetic.encode("🙂")  # rare in the corpus: split across byte tokens
    assert len(ids) > 1
    assert b"".join(synthetic.decode_bytes([i]) for i in ids) == "🙂".encode()


def test_real_style_tiktoken_file_with_merges(tmp_path):
    """A file shaped like Moonshot's: byte ranks, then merges; special tokens from tokenizer_config.json,
    the unnamed ones reserved."""
    ranks = [bytes([b]) for b in range(256)] + [b"he", b"ll", b"hell", b"hello", b" w", b"or", b" wor"]
    (tmp_path / "tiktoken.model").write_text(
        "".join(f"{base64.b64encode(tok).decode()} {rank}\n" for rank, tok in enumerate(ranks))
    )
    base = len(ranks)
    config = {
        "added_tokens_decoder": {str(base): {"content": "[BOS]"}, str(base + 2): {"content": "<|im_end|>"}},
        "bos_token": {"content": "[BOS]"},
        "eos_token": "<|im_end|>",
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tok = Tokenizer.from_dir(tmp_path)
    assert tok.encode("hello world") == [ranks.index(b"hello"), ranks.index(b" wor"), *b"ld"]
    assert tok.decode(tok.encode("hello world")) == "hello world"
    assert tok.bos_id == base and tok.eos_id == base + 2
    assert tok.token_id(f"<|reserved_token_{base + 1}|>") == base + 1
    assert tok.vocab_size == base + 258


def test_very_long_runs_are_encoded(synthetic):
    text = "a" * 60_000 + " " + "b" * 10
    assert synthetic.decode(synthetic.encode(text)) == text


def test_missing_tokenizer_file(tmp_path):
    with pytest.raises(TokenizerError, match="tiktoken.model"):
        Tokenizer.from_dir(tmp_path)


def test_a_tokenizer_rewritten_in_place_loads_its_new_ranks(tmp_path):
    # tiktoken's loader caches a file by its path: a cached synthetic checkpoint rebuilt in place with a
    # bigger tokenizer (byte-level -> BPE) loaded the old 256 ranks and lost its special tokens.
    write_synthetic_tokenizer(tmp_path, 256)
    assert Tokenizer.from_dir(tmp_path).bos_id == 256
    write_synthetic_tokenizer(tmp_path, 3840)
    assert Tokenizer.from_dir(tmp_path).bos_id == 3840
