"""Generated token ids to response text: incremental UTF-8, stop strings, and `<think>` as reasoning.

Token by token, `OutputText.add(id)` returns what can be shown now: bytes of a character split across
tokens wait for the rest; text that may be the start of a stop string or of a think tag is held back
until it is decided. Everything between `<think>` and `</think>` is reasoning (`reasoning_content`),
the rest is content; the tags are split as k3 splits them (`common.think`). A stop string ends the
output before it (OpenAI semantics).
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass

from common.scan import held_suffix
from common.think import ThinkTags
from engine.model import Tokenizer


@dataclass
class Delta:
    reasoning: str = ""
    content: str = ""
    stopped: bool = False  # a stop string was generated: nothing follows

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content)


class StopStrings:
    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self._held = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """(text that is safe to show, whether a stop string was reached)."""
        text = self._held + text
        hits = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if hits:
            self._held = ""
            return text[: min(hits)], True
        keep = held_suffix(text, self.stops)
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep], False

    def flush(self) -> str:
        out, self._held = self._held, ""
        return out


class OutputText:
    def __init__(self, tokenizer: Tokenizer, stops: list[str], *, in_reasoning: bool = False):
        self.tokenizer = tokenizer
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = StopStrings(stops)
        self._think = ThinkTags(start_in_think=in_reasoning)
        self.stopped = False

    def _split(self, pieces: list[tuple[bool, str]], delta: Delta) -> None:
        for reasoning, text in pieces:
            if reasoning:
                delta.reasoning += text
            else:
                delta.content += text

    def add(self, token_id: int) -> Delta:
        delta = Delta()
        if self.stopped:
            return delta
        text, delta.stopped = self._stops.feed(self._utf8.decode(self.tokenizer.decode_bytes([token_id])))
        self._split(self._think.feed(text), delta)
        if delta.stopped:
            self.stopped = True
            self._split(self._think.finish(), delta)
        return delta

    def finish(self) -> Delta:
        """Whatever was held back, at the end of generation."""
        delta = Delta()
        if not self.stopped:
            self._split(self._think.feed(self._stops.flush() + self._utf8.decode(b"", final=True)), delta)
            self._split(self._think.finish(), delta)
        return delta
