"""`<think>…</think>` in streamed model text: which pieces are reasoning and which are the answer.

`ThinkTags.feed(chunk)` returns the (is_reasoning, text) pieces that can be shown now. The tags are
never shown, even when split across chunks (a possible start of a tag is held until it is decided);
a stray `</think>` (or a nested `<think>`) is dropped. A prompt that already opened the block (a
template ending in `<think>`) starts with `start_in_think=True`.
"""

from __future__ import annotations

from common.scan import find_first, held_suffix

OPEN, CLOSE = "<think>", "</think>"
TAGS = (OPEN, CLOSE)


class ThinkTags:
    def __init__(self, start_in_think: bool = False) -> None:
        self.thinking = start_in_think
        self._buf = ""

    def feed(self, chunk: str) -> list[tuple[bool, str]]:
        self._buf += chunk
        out: list[tuple[bool, str]] = []
        while True:
            pos, tag = find_first(self._buf, TAGS)
            if pos == -1:
                cut = len(self._buf) - held_suffix(self._buf, TAGS)
                self._piece(out, self._buf[:cut])
                self._buf = self._buf[cut:]
                return out
            self._piece(out, self._buf[:pos])
            self._buf = self._buf[pos + len(tag) :]
            self.thinking = tag == OPEN

    def finish(self) -> list[tuple[bool, str]]:
        """What was held back (an unfinished tag is text), at the end of the stream."""
        out: list[tuple[bool, str]] = []
        self._piece(out, self._buf)
        self._buf = ""
        return out

    def _piece(self, out: list[tuple[bool, str]], text: str) -> None:
        if text:
            out.append((self.thinking, text))
