"""Shared test fixtures."""

import os

import pytest
import torch

# training loops keep their thread count (vitscope.threads.CoreShare adapts it to other processes' load, which
# would make bit-for-bit comparisons depend on the machine's load); test_core_share.py checks the adapting
os.environ.setdefault("VITSCOPE_THREADS", "fixed")


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run fastest on one thread, and far faster than on two when the cores are shared."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
