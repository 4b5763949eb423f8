import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    # Tiny models are dominated by per-op overhead; extra threads only add contention on 2 shared cores.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
