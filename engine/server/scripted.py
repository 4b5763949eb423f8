"""TEST HOOK: scripted replies (`kimi-engine serve --scripted-replies FILE`).

A synthetic model writes random text, so an end-to-end test cannot wait for it to call a tool. A script
makes it write a chosen reply: the request still goes through the chat template, the tokenizer, the
queue, prefill and every decode step of the real model, and only the sampler is overruled, by a logits
processor that leaves one allowed token per step (the reply's tokens, then `<|im_end|>`).

The file is a JSON list of {"match": "...", "reply": "..."}; a request whose last message's content
contains `match` gets the first such entry's `reply`; other requests are not touched. Never use this
to produce results: a scripted reply measures nothing about the model.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from engine.model import Tokenizer
from engine.model.generate import LogitsProcessor


class ScriptError(ValueError):
    pass


def force_tokens(token_ids: list[int]) -> LogitsProcessor:
    """A processor that makes step i pick token_ids[i]; after them the model's own logits are kept."""

    def processor(generated, logits: torch.Tensor) -> torch.Tensor:
        step = len(generated)
        if step >= len(token_ids):
            return logits
        forced = torch.full_like(logits, float("-inf"))
        forced[token_ids[step]] = 0.0
        return forced

    return processor


class ScriptedReplies:
    def __init__(self, entries: list[tuple[str, str]], tokenizer: Tokenizer, end_token: str = "<|im_end|>"):
        self.entries = entries
        self.tokenizer = tokenizer
        self.end_id = tokenizer.token_id(end_token)

    @classmethod
    def from_file(cls, path: str | Path, tokenizer: Tokenizer) -> ScriptedReplies:
        try:
            raw = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ScriptError(f"cannot read scripted replies from {path}: {e}") from e
        ok = isinstance(raw, list) and all(
            isinstance(x, dict) and isinstance(x.get("match"), str) and isinstance(x.get("reply"), str)
            for x in raw
        )
        if not ok:
            raise ScriptError(f'{path}: expected a JSON list of {{"match": str, "reply": str}}')
        return cls([(x["match"], x["reply"]) for x in raw], tokenizer)

    def processor_for(self, messages: list[dict]) -> LogitsProcessor | None:
        last = messages[-1].get("content") or ""
        for match, reply in self.entries:
            if match in last:
                return force_tokens(self.tokenizer.encode(reply, allow_special=True) + [self.end_id])
        return None
