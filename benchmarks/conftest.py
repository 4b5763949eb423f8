"""pytest-benchmark setup shared by the microbenchmarks.

Every case names itself with `case(benchmark, name, **config)`: `name` becomes the receipt's name
(`kimi-harness import-benchmark`) and `config` its configuration (what the case measures, on which
capture). The JSON's machine_info carries this project's hardware descriptor, so imported receipts
group with the other runners' receipts of the same machine.
"""

from __future__ import annotations

from typing import Any

import torch

from harness.hardware import describe

torch.set_num_threads(1)  # per-token host work runs on one thread beside the engine's


def pytest_benchmark_update_machine_info(config: Any, machine_info: dict[str, Any]) -> None:
    machine_info["local_kimi"] = {k: v for k, v in describe().items() if k != "git"}


def case(benchmark: Any, name: str, **config: Any) -> Any:
    """Label a benchmark for its receipt; returns the fixture for chaining."""
    benchmark.extra_info["case"] = name
    benchmark.extra_info.update(config)
    return benchmark
