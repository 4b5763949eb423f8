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


def detect(
    dialect: str | None,
    headers: dict[str, str],
    body: dict[str, Any] | None = None,
    forced: str | None = None,
) -> Detection:
    """`dialect` is None for dialect-free routes (/v1/models): every preset is then eligible.

    `headers` must have lower-cased names.
    """
    if forced is not None:
        return Detection(presets.get(forced), 10_000, f"--client {forced}", forced=True)
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
