from pathlib import Path

import pytest

from tests.quant.tiny_checkpoint import write_checkpoint


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("checkpoint") / "tiny")
