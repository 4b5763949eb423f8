"""Microbenchmarks (pytest-benchmark) of k3's per-turn steps and the engine's per-token host work.

Not part of the test suite: run them with `nox -s bench-micro` (docs/METHODS.md, "Microbenchmarks").
"""
