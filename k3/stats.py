"""The counters a k3 server keeps: turns by status, dialect and preset, errors, disconnects, where
replies carried reasoning; served as JSON at /k3/stats and in Prometheus' text format at /metrics."""

from __future__ import annotations

from collections import Counter
from typing import Any


class Stats:
    def __init__(self) -> None:
        self.counters: Counter[str] = Counter()
        self.by_preset: Counter[str] = Counter()
        self.by_dialect: Counter[str] = Counter()
        self.by_status: Counter[int] = Counter()  # finished turns by the status the client got
        self.turn_seconds = 0.0  # summed over finished turns, for /metrics' average
        self.reasoning_fields: dict[str, Counter[str]] = {}  # preset -> where replies carried reasoning

    def finished(self, status: int, seconds: float) -> None:
        self.by_status[status] += 1
        self.turn_seconds += seconds

    def prometheus(self, connections: dict[str, int] | None) -> str:
        """The counters in Prometheus' text format (0.0.4)."""
        lines = []

        def metric(name: str, kind: str, text: str, samples: list[tuple[str, float]]) -> None:
            lines.extend([f"# HELP {name} {text}", f"# TYPE {name} {kind}"])
            lines.extend(f"{name}{labels} {value:g}" for labels, value in samples)

        metric("k3_turns_total", "counter", "Finished turns by the status the client got.",
               [(f'{{status="{s}"}}', n) for s, n in sorted(self.by_status.items())])  # fmt: skip
        metric("k3_turn_seconds", "summary", "Time from a turn's upstream call to its last byte.",
               [("_sum", self.turn_seconds), ("_count", sum(self.by_status.values()))])  # fmt: skip
        metric("k3_turns_by_dialect_total", "counter", "Turns per client dialect.",
               [(f'{{dialect="{d}"}}', n) for d, n in sorted(self.by_dialect.items())])  # fmt: skip
        metric("k3_turns_by_preset_total", "counter", "Turns per detected client preset.",
               [(f'{{preset="{p}"}}', n) for p, n in sorted(self.by_preset.items())])  # fmt: skip
        for key in ("streamed", "errors", "disconnects", "count_tokens"):
            metric(
                f"k3_{key}_total", "counter", f"Count of {key.replace('_', ' ')}.", [("", self.counters[key])]
            )
        if connections is not None:
            metric("k3_upstream_connections", "gauge", "Engine connections, open and idle.",
                   [(f'{{state="{k}"}}', v) for k, v in sorted(connections.items())])  # fmt: skip
        return "\n".join(lines) + "\n"

    def saw_reasoning(self, preset: str, field: str) -> None:
        self.reasoning_fields.setdefault(preset, Counter())[field] += 1

    def json(self) -> dict[str, Any]:
        counters = {
            k: self.counters[k] for k in ("requests", "streamed", "errors", "disconnects", "count_tokens")
        }
        return {
            "counters": counters,
            "by_preset": dict(self.by_preset),
            "by_dialect": dict(self.by_dialect),
            "reasoning_fields": {p: dict(c) for p, c in self.reasoning_fields.items()},
        }
