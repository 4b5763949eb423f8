import random

import pytest

from harness.receipt import write_receipt

HARDWARE = {
    "hardware_id": "cpu-2c-Test-CPU",
    "gpus": [],
    "gpu_note": "test",
    "cpu": {"model": "Test CPU", "logical_cores": 2},
    "git": {"commit": "0123456789abcdef", "dirty": False},
}


@pytest.fixture
def make_receipt(tmp_path):
    """Write a receipt with fresh random samples into tmp_path/results; returns its path."""
    results = tmp_path / "results"

    def make(suite="harness", name="probe", samples=None, units=None, **kwargs):
        samples = samples or {"encode_us": [random.uniform(1, 2) for _ in range(9)]}
        units = units or {metric: "µs" for metric in samples}
        return write_receipt(
            suite, name, config={"seed": random.random()}, samples=samples, units=units,
            results_dir=results, hardware=kwargs.pop("hardware", HARDWARE), command=["test"], **kwargs,
        )  # fmt: skip

    make.results = results
    return make
