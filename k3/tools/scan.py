"""Delimiter search shared by the text parsers.

Every delimiter set used here is overlap-free (no proper suffix of one delimiter is a prefix of
another), so the first complete match in a buffer is the same however the buffer was chunked.
"""

from __future__ import annotations

from collections.abc import Sequence


def find_first(buf: str, tokens: Sequence[str], start: int = 0) -> tuple[int, str]:
    """Position and value of the earliest complete token in `buf[start:]`, or (-1, "")."""
    best_pos, best_tok = -1, ""
    for tok in tokens:
        pos = buf.find(tok, start)
        if pos != -1 and (best_pos == -1 or pos < best_pos):
            best_pos, best_tok = pos, tok
    return best_pos, best_tok


def held_suffix(buf: str, tokens: Sequence[str]) -> int:
    """Length of the longest suffix of `buf` that is a proper prefix of some token.

    That suffix may still grow into a delimiter, so it must not be shown yet; everything before it
    can be emitted now.
    """
    held = 0
    for tok in tokens:
        for size in range(min(len(tok) - 1, len(buf)), held, -1):
            if buf.endswith(tok[:size]):
                held = size
                break
    return held


def rescan_from(previous_len: int, tokens: Sequence[str]) -> int:
    """Where a search may restart after appending to a buffer already searched up to `previous_len`."""
    return max(0, previous_len - max(len(t) for t in tokens) + 1)


def strip_tokens(text: str, tokens: Sequence[str]) -> str:
    """Remove every occurrence of the control tokens (degraded output must never show them)."""
    for tok in tokens:
        text = text.replace(tok, "")
    return text
