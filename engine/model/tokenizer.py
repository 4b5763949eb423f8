"""The checkpoint's tokenizer: a tiktoken BPE (`tiktoken.model`) plus special tokens (`tokenizer_config.json`).

Real checkpoints ship Moonshot's 163,584-token BPE; synthetic and trained checkpoints ship a smaller BPE
trained here (engine/model/synthetic_tokenizer.py) with the same pattern and special-token layout, so one
class serves both. Special tokens occupy the 256 ids after the BPE ranks; ids named in `added_tokens_decoder`
get those names, the rest are `<|reserved_token_{id}|>` (as in Moonshot's tokenization_kimi.py).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import tiktoken

TIKTOKEN_FILE = "tiktoken.model"
CONFIG_FILE = "tokenizer_config.json"
NUM_RESERVED_SPECIAL_TOKENS = 256

# The pre-tokenisation pattern of Moonshot's tokenizer (tokenization_kimi.py).
KIMI_PATTERN = "|".join(
    [
        r"""[\p{Han}]+""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)

# tiktoken's regex engine recurses on very long runs; split text before encoding (as tokenization_kimi.py does).
_MAX_ENCODE_CHARS = 400_000
_MAX_RUN_CHARS = 25_000

# Named special tokens of synthetic checkpoints, as offsets after the BPE ranks. [BOS], [EOS], <|im_end|>,
# [UNK] and [PAD] sit at the real tokenizer's offsets (ids 163584, 163585, 163586, 163838, 163839).
SYNTHETIC_SPECIAL_TOKENS = {
    0: "[BOS]",
    1: "[EOS]",
    2: "<|im_end|>",
    3: "<|im_user|>",
    4: "<|im_assistant|>",
    5: "<|im_system|>",
    6: "<|im_middle|>",
    7: "[EOT]",
    8: "<|tool_calls_section_begin|>",
    9: "<|tool_calls_section_end|>",
    10: "<|tool_call_begin|>",
    11: "<|tool_call_argument_begin|>",
    12: "<|tool_call_end|>",
    13: "<think>",
    14: "</think>",
    254: "[UNK]",
    255: "[PAD]",
}


class TokenizerError(ValueError):
    pass


class Tokenizer:
    def __init__(
        self, ranks: dict[bytes, int], special_tokens: dict[str, int], *, bos: str, eos: str, name: str
    ):
        self._ranks = ranks
        self.special_tokens = special_tokens
        self.encoding = tiktoken.Encoding(
            name=name, pat_str=KIMI_PATTERN, mergeable_ranks=ranks, special_tokens=special_tokens
        )
        self.bos_id = self.token_id(bos)
        self.eos_id = self.token_id(eos)

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        path = Path(path)
        model_file, config_file = path / TIKTOKEN_FILE, path / CONFIG_FILE
        if not model_file.exists():
            raise TokenizerError(f"{path} has no {TIKTOKEN_FILE}")
        config = json.loads(config_file.read_text()) if config_file.exists() else {}
        ranks = read_tiktoken_ranks(model_file)
        named = {int(i): _content(t) for i, t in config.get("added_tokens_decoder", {}).items()}
        base = len(ranks)
        # Moonshot's code reserves 256 + 2 ids after the ranks.
        special = {
            named.get(i, f"<|reserved_token_{i}|>"): i
            for i in range(base, base + NUM_RESERVED_SPECIAL_TOKENS + 2)
        }
        return cls(
            ranks,
            special,
            bos=_content(config.get("bos_token", "[BOS]")),
            eos=_content(config.get("eos_token", "[EOS]")),
            name=str(model_file),
        )

    @property
    def vocab_size(self) -> int:
        return self.encoding.n_vocab

    @property
    def ranks(self) -> dict[bytes, int]:
        """The BPE ranks (token bytes -> id), without the special tokens."""
        return dict(self._ranks)

    def token_id(self, special: str) -> int:
        try:
            return self.special_tokens[special]
        except KeyError:
            raise TokenizerError(f"{special!r} is not a special token of this tokenizer") from None

    def encode(self, text: str, *, allow_special: bool = True) -> list[int]:
        """Special-token text becomes special ids when `allow_special`, otherwise it is encoded as text."""
        ids: list[int] = []
        for piece in _pieces(text):
            if allow_special:
                ids += self.encoding.encode(piece, allowed_special="all")
            else:
                ids += self.encoding.encode(piece, disallowed_special=())
        return ids

    def decode(self, ids: list[int]) -> str:
        return self.encoding.decode(ids, errors="replace")

    def decode_bytes(self, ids: list[int]) -> bytes:
        """Raw bytes, for incremental detokenisation (a UTF-8 character may span tokens)."""
        return self.encoding.decode_bytes(ids)


def read_tiktoken_ranks(path: Path) -> dict[bytes, int]:
    """The ranks of a `tiktoken.model` file (base64 token, space, rank per line), read from disk every time:
    tiktoken's own loader caches a file's contents by its path, so a checkpoint rewritten in place (a
    cached synthetic model rebuilt with another tokenizer) would load the old ranks."""
    ranks = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _content(token: str | dict) -> str:
    return token["content"] if isinstance(token, dict) else token


def _pieces(text: str):
    for i in range(0, len(text), _MAX_ENCODE_CHARS):
        yield from _split_long_runs(text[i : i + _MAX_ENCODE_CHARS])


def _split_long_runs(s: str):
    """Split so no piece has more than _MAX_RUN_CHARS consecutive whitespace or non-whitespace chars."""
    start, run, in_space = 0, 0, s[:1].isspace()
    for i, ch in enumerate(s):
        if ch.isspace() != in_space:
            in_space, run = ch.isspace(), 1
        else:
            run += 1
            if run > _MAX_RUN_CHARS:
                yield s[start:i]
                start, run = i, 1
    yield s[start:]
