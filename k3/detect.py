"""Per-request client detection: route, user-agent, vendor headers and body hints give a preset.

Every preset that speaks the request's dialect is scored: each matching rule adds its weight.
The highest score wins (ties go to the earlier preset in the table). With no signal at all the
dialect's generic preset answers (`anthropic` for /v1/messages, `openai` for Chat and
Responses). `--client` pins one preset and skips scoring.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from k3 import presets
from k3.presets import Preset

ROUTE_DIALECT = {
    "/v1/messages": "anthropic",
    "/v1/messages/count_tokens": "anthropic",
    "/v1/chat/completions": "chat",
    "/v1/responses": "responses",
}


@dataclass(frozen=True, slots=True)
class Detection:
    preset: Preset
    score: int
    reason: str
    forced: bool = False
    fallback: bool = False


_HEADERS = tuple(
    sorted({"user-agent"} | {r.header for p in presets.PRESETS for r in p.rules if r.kind == "header"})
)
_BODY_RULES = tuple(r for p in presets.PRESETS for r in p.rules if r.kind == "body")
_CACHE_SIZE = 4096
_cache: dict[tuple[Any, ...], Detection] = {}


def detect(
    dialect: str | None,
    headers: dict[str, str],
    body: dict[str, Any] | None = None,
    forced: str | None = None,
) -> Detection:
    """`dialect` is None for dialect-free routes (/v1/models): every preset is then eligible.

    `headers` must have lower-cased names. The outcome depends only on the dialect, the values
    of the headers the rules read and the body rules' verdicts, so it is memoised on those.
    """
    if forced is not None:
        return Detection(presets.get(forced), 10_000, f"--client {forced}", forced=True)
    key = (
        dialect,
        tuple([headers.get(name) for name in _HEADERS]),
        None if body is None else tuple([rule.matches(headers, body) for rule in _BODY_RULES]),
    )
    found = _cache.get(key)
    if found is None:
        found = _score(dialect, headers, body)
        if len(_cache) >= _CACHE_SIZE:
            _cache.clear()
        _cache[key] = found
    return found


def _score(dialect: str | None, headers: dict[str, str], body: dict[str, Any] | None) -> Detection:
    best: Preset | None = None
    best_score = 0
    best_labels: list[str] = []
    for preset in presets.PRESETS:
        if dialect is not None and dialect not in preset.dialects:
            continue
        score = 0
        labels = []
        for rule in preset.rules:
            if rule.matches(headers, body):
                score += rule.weight
                labels.append(rule.label)
        if score > best_score:
            best, best_score, best_labels = preset, score, labels
    if best is None:
        fallback = presets.DEFAULT_FOR_DIALECT.get(dialect or "chat", presets.BY_NAME["openai"])
        return Detection(
            fallback, 0, f"no client signal; default for the {dialect or 'models'} route", fallback=True
        )
    return Detection(best, best_score, ", ".join(best_labels))
