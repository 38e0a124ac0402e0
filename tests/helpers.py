"""Helpers shared by the tests."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph.testing import compare, random_pack, reference_outputs  # noqa: F401


def run_reference(g: og.Graph, rng: np.random.Generator, **kw):
    """Validate g, run it on the reference engine over random inputs with poisoned outputs.
    Returns (pack, {uid: output array})."""
    final = g.final
    pack = random_pack(final, rng, **kw)
    g.build(device="cpu").execute(pack)
    return pack, {u: pack[u] for u in final.outputs}


def torch_or_skip():
    return pytest.importorskip("torch")


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


requires_cuda = pytest.mark.skipif(not cuda_available(), reason="needs a CUDA GPU")
