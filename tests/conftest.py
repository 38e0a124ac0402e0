"""Shared fixtures (helpers live in tests/helpers.py)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest


@pytest.fixture
def rng(request) -> np.random.Generator:
    """A reproducible, per-test random stream (seeded from the test id)."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
