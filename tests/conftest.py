"""Shared fixtures (helpers live in tests/helpers.py)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

# the shared helpers assert for the tests: pytest explains their failures as it does the tests' own
pytest.register_assert_rewrite("tests.helpers", "tests.engines.hopper_compile")


@pytest.fixture
def rng(request) -> np.random.Generator:
    """A reproducible, per-test random stream (seeded from the test id)."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture
def custom_ops_restored():
    """The custom-op registry as it was before the test (what the test registers is dropped after it)."""
    from opgraph.ops.custom import CUSTOM_OPS

    saved = dict(CUSTOM_OPS)
    yield
    CUSTOM_OPS.clear()
    CUSTOM_OPS.update(saved)


def pytest_configure(config):
    # Triton decides at import whether it interprets kernels; without a GPU, the tests run the
    # generated kernels in its interpreter (set before anything imports Triton).
    import os

    # OPGRAPH_TEST_GPUS="0,1": xdist worker gwN runs on the (N mod 2)-th GPU listed (set before CUDA starts)
    gpus = [g for g in os.environ.get("OPGRAPH_TEST_GPUS", "").split(",") if g.strip()]
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if gpus and worker.startswith("gw") and worker[2:].isdigit():
        os.environ["CUDA_VISIBLE_DEVICES"] = gpus[int(worker[2:]) % len(gpus)].strip()
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if not has_cuda:
        os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` run only with CUDA; other tests marked `interpreter` (the generated kernels
    on the CPU) run only when Triton interprets. A module can mark all its tests `interpreter` and
    still hold GPU tests: the `gpu` mark wins."""
    import os

    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    try:
        import triton  # noqa: F401

        interpreting = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    except ImportError:
        interpreting = False
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            if not has_cuda:
                item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        elif item.get_closest_marker("interpreter") is not None and not interpreting:
            item.add_marker(pytest.mark.skip(reason="needs Triton's interpreter (set when there is no GPU)"))


def pytest_runtest_logreport(report):
    """With OPGRAPH_FAILURE_LOG set, each failure's report is appended to that file as it happens, so a
    run stopped by an outer time limit (the GPU machine's) still leaves its tracebacks behind."""
    import os

    path = os.environ.get("OPGRAPH_FAILURE_LOG")
    if path and report.failed and "PYTEST_XDIST_WORKER" not in os.environ:  # (xdist: the controller writes)
        with open(path, "a") as f:
            f.write(f"===== {report.nodeid} ({report.when})\n{report.longreprtext[-6000:]}\n")
