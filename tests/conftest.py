"""Shared test configuration.

- GPU-only tests (marked `gpu`) skip cleanly on a machine without CUDA.
- Without CUDA, Triton kernels run in the interpreter. TRITON_INTERPRET must be set before triton is
  first imported anywhere, so it is set here, before any test module is collected.
- The eager decode step (KIMI_DECODE_STEP=eager, inherited by servers the tests start): compiling takes
  tens of seconds per cache size; tests/runtime/test_runtime_compiled.py asks for the compiled step.
- One torch thread: the tests' tiny shapes are dominated by per-op overhead, which a second thread only
  makes worse on a small shared machine (a 70-token tiny forward: 0.02 s with one thread, over a second
  with two under load).
"""

import os
from collections.abc import Iterator

import pytest
import torch

from k3.testing.fake_upstream import FakeUpstream, serve_in_thread

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("KIMI_DECODE_STEP", "eager")
torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def engine_server() -> Iterator[tuple[FakeUpstream, str]]:
    """One scripted fake engine on a real socket for the whole session: (the fake, its base URL).
    Per-test fixtures reset it (`fake.reset()`) before use."""
    fake = FakeUpstream()
    with serve_in_thread(fake) as base_url:
        yield fake, base_url
