"""Fixtures of the notebook-UI tests."""
import pytest
import torch


@pytest.fixture(scope="module")
def char(shipped_char):
    return shipped_char


@pytest.fixture(autouse=True)
def global_rng_untouched():
    """Every widget draws from its own generator: the global RNG must not move."""
    before = torch.get_rng_state()
    yield
    assert torch.equal(before, torch.get_rng_state())
