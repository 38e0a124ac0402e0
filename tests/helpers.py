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


def interpreter_available() -> bool:
    """Triton and PyTorch installed, and Triton in interpreter mode (set by conftest without a GPU)."""
    import os

    try:
        import torch  # noqa: F401
        import triton  # noqa: F401
    except ImportError:
        return False
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


requires_interpreter = pytest.mark.skipif(not interpreter_available(), reason="needs Triton and PyTorch")


def assert_engine_matches(g: og.Graph, rng: np.random.Generator, *, engines=("triton",), device: str = "cpu",
                          expect_steps: int | None = None, prepare=None, rtol=None, atol=None, **kw):
    """Build g for `engines` on `device` (the CPU means Triton's interpreter), run it on random
    inputs with poisoned outputs and assert every output matches the reference engine.
    Returns the plan (so tests can look at its steps)."""
    plan = g.build(device=device, engines=list(engines))
    if expect_steps is not None:
        assert len(plan.steps) == expect_steps, plan.describe()
    bad = og.testing.check_plan(plan, rng, prepare=prepare, rtol=rtol, atol=atol, **kw)
    assert not bad, "\n".join(str(m) for m in bad) + "\n" + plan.describe()
    return plan
