"""Delimiter search in streamed text, shared by k3's parsers and the engine's output text.

The parsers' delimiter sets are overlap-free (no proper suffix of one delimiter is a prefix of
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
    if not tokens:
        return 0
    start = max(0, len(buf) - max(len(t) for t in tokens) + 1)
    held = 0
    for first in {t[0] for t in tokens}:
        pos = buf.find(first, start)
        while pos != -1 and len(buf) - pos > held:
            suffix = buf[pos:]
            if any(len(t) > len(suffix) and t.startswith(suffix) for t in tokens):
                held = len(suffix)  # the leftmost fitting start is the longest for this first char
                break
            pos = buf.find(first, pos + 1)
    return held
