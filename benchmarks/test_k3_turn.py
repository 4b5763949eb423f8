"""Each step of one proxied streamed turn, per dialect, on the captured client requests
(benchmarks/k3_turns.py says what each step covers)."""

from __future__ import annotations

import pytest

from benchmarks.conftest import case
from benchmarks.k3_turns import STEP_NAMES, STEPS, prepare

DIALECTS = ("anthropic", "responses", "chat")
_PREPARED = {}


def _turn(dialect: str):
    if dialect not in _PREPARED:
        _PREPARED[dialect] = prepare(dialect)
    return _PREPARED[dialect]


@pytest.mark.parametrize("step", STEP_NAMES)
@pytest.mark.parametrize("dialect", DIALECTS)
def test_turn_step(benchmark, dialect, step):
    turn = _turn(dialect)
    case(benchmark, f"k3.turn.{dialect}.{step}", area="k3", dialect=dialect, step=step,
         step_index=STEP_NAMES.index(step),
         capture=turn.capture, preset=turn.found.preset.name, request_bytes=len(turn.raw),
         upstream_chunks=len(turn.chunks), client_bytes=len(turn.output))  # fmt: skip
    result = benchmark(STEPS[step], turn)
    assert result  # every step produces something (a parsed body, events, bytes ...)
