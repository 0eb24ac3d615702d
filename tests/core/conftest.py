"""Fixtures shared by the training-core tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def one_torch_thread():
    """torch on one intra-op thread for a module's tests, restored after: on the two shared
    cores more threads only add spin-waiting (and compiled CPU kernels' OpenMP stalls)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
