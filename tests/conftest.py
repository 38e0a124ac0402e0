"""Shared fixtures (helpers live in tests/helpers.py)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest


@pytest.fixture
def rng(request) -> np.random.Generator:
    """A reproducible, per-test random stream (seeded from the test id)."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def pytest_configure(config):
    # Triton decides at import whether it interprets kernels; without a GPU, the tests run the
    # generated kernels in its interpreter (set before anything imports Triton).
    import os

    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if not has_cuda:
        os.environ.setdefault("TRITON_INTERPRET", "1")
