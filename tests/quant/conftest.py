from pathlib import Path

import pytest

from tests.quant.tiny_checkpoint import write_checkpoint
from tests.runners.conftest import one_thread  # noqa: F401  (autouse: one intra-op thread for tiny models)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("checkpoint") / "tiny")
