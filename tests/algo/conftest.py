import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    """The statistical tests run 10⁵ requests of V = 8 tokens: many tiny rows, where extra threads
    only add synchronization (and contend with whatever else the box runs)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
