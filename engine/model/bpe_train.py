"""A byte-pair-encoding trainer whose output tiktoken loads (`tiktoken.model`: base64 token, rank per line).

tiktoken has no trainer. This one follows the usual scheme: split the text into words with the
tokenizer's own pre-tokenisation pattern (Moonshot's `KIMI_PATTERN`), count each distinct word once, then
repeatedly merge the most frequent adjacent pair of tokens, updating only the pair counts of the words that
contain it (an index pair -> words, and a max-heap with lazy deletion). Ranks 0-255 are the single bytes
(rank = byte value, as in the byte-level file); rank 256 onwards are merges in the order learned.

Deterministic: ties between equally frequent pairs go to the pair whose tokens' bytes sort first, so the
result depends only on the word counts and the rank count, not on dict or file order.
"""

from __future__ import annotations

import base64
import heapq
from collections import Counter
from collections.abc import Iterable
from itertools import pairwise

import regex

from engine.model.tokenizer import KIMI_PATTERN

# KIMI_PATTERN is written for tiktoken's regex engine (fancy-regex: `&&` intersects classes); the regex
# module reads that syntax in its VERSION1 mode.
_PRETOKENIZER = regex.compile(KIMI_PATTERN, regex.VERSION1)


def count_words(texts: Iterable[str]) -> Counter[str]:
    """How often each pre-tokenised word occurs in `texts`."""
    counts: Counter[str] = Counter()
    for text in texts:
        counts.update(_PRETOKENIZER.findall(text))
    return counts


def train_bpe(word_counts: dict[str, int], num_ranks: int) -> list[bytes]:
    """The token bytes of ranks 0..num_ranks-1 (fewer if the words run out of pairs occurring twice)."""
    if num_ranks < 256:
        raise ValueError(f"a byte-level BPE needs at least 256 ranks, not {num_ranks}")
    vocab = [bytes([b]) for b in range(256)]
    known = {t: i for i, t in enumerate(vocab)}
    words = [list(w.encode()) for w in word_counts]
    freqs = list(word_counts.values())
    pair_counts: Counter[tuple[int, int]] = Counter()
    pair_words: dict[tuple[int, int], set[int]] = {}
    for i, (word, n) in enumerate(zip(words, freqs, strict=True)):
        for pair in pairwise(word):
            pair_counts[pair] += n
            pair_words.setdefault(pair, set()).add(i)
    heap = [(-n, vocab[a], vocab[b], a, b) for (a, b), n in pair_counts.items()]
    heapq.heapify(heap)
    while len(vocab) < num_ranks and heap:
        neg, _, _, a, b = heapq.heappop(heap)
        current = pair_counts.get((a, b), 0)
        if current != -neg:  # stale: counts only fall, so re-queue at the true count
            if current > 0:
                heapq.heappush(heap, (-current, vocab[a], vocab[b], a, b))
            continue
        if current < 2:
            break
        merged = vocab[a] + vocab[b]
        new = known.get(merged)
        if new is None:
            new = len(vocab)
            vocab.append(merged)
            known[merged] = new
        changed: Counter[tuple[int, int]] = Counter()
        for i in pair_words.pop((a, b)):
            word, n = words[i], freqs[i]
            out = _merge(word, a, b, new)
            if len(out) == len(word):
                continue  # a stale index entry: the pair left this word in an earlier merge
            for pair in pairwise(word):
                changed[pair] -= n
            for pair in pairwise(out):
                changed[pair] += n
                if new in pair:
                    pair_words.setdefault(pair, set()).add(i)
            words[i] = out
        for pair, delta in changed.items():
            if delta:
                pair_counts[pair] += delta
                if new in pair and pair_counts[pair] > 0:
                    heapq.heappush(heap, (-pair_counts[pair], vocab[pair[0]], vocab[pair[1]], *pair))
        del pair_counts[(a, b)]
    return vocab


def _merge(word: list[int], a: int, b: int, new: int) -> list[int]:
    out: list[int] = []
    i, n = 0, len(word)
    while i < n:
        if i + 1 < n and word[i] == a and word[i + 1] == b:
            out.append(new)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out


def tiktoken_file_text(ranks: list[bytes]) -> str:
    return "".join(f"{base64.b64encode(token).decode()} {rank}\n" for rank, token in enumerate(ranks))
