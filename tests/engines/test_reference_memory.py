"""The reference engine computes on float64 arrays of logical dims: an input expanded by stride-0 axes
is materialised whole. A tensor too big for this machine is refused before anything is allocated, naming
the tensor and its logical size (issue 38: 2**40 logical elements reduced to one value raised a bare
MemoryError after trying for 8 TiB)."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph.engines.shared.evaluate import run_node

D = og.DataType


def _expanded_sum(n: int = 2**20) -> tuple[og.Graph, og.Tensor, og.Tensor]:
    g = og.Graph("big", io_data_type=D.FLOAT)
    x = g.tensor(dim=[n, n], stride=[0, 0], name="x")
    y = g.reduction(x, mode="ADD").set_output(True).set_dim([1, 1]).set_name("y")
    return g, x, y


def test_a_huge_expanded_input_is_refused_at_build():
    g, _, _ = _expanded_sum()
    with pytest.raises(og.UnsupportedGraphError) as ei:
        g.build(device="cpu", engines=["reference"])
    text = str(ei.value)
    assert "'x' (uid" in text and "1,099,511,627,776 logical elements" in text and "GiB" in text


def test_and_refused_before_allocating_when_run_directly():
    g, _, _ = _expanded_sum()
    node = g.final.nodes[0]
    read = pytest.fail  # never reached: nothing is read or allocated
    with pytest.raises(og.ExecutionError) as ei:
        run_node(node, g.final.tensors, read)
    assert ei.value.rule == "reference.memory" and "OPGRAPH_REFERENCE_MAX_GB" in str(ei.value)


def test_the_limit_follows_the_environment(monkeypatch, rng):
    g, x, y = _expanded_sum(64)
    plan = g.build(device="cpu", engines=["reference"])
    out = np.zeros((1, 1), np.float32)
    plan.execute({x: np.lib.stride_tricks.as_strided(np.full(1, 0.5, np.float32), (64, 64), (0, 0)), y: out})
    assert out[0, 0] == 0.5 * 64 * 64
    monkeypatch.setenv("OPGRAPH_REFERENCE_MAX_GB", str(64 * 64 * 8 / 2**30 / 2))
    with pytest.raises(og.UnsupportedGraphError, match="4,096 logical elements"):
        _expanded_sum(64)[0].build(device="cpu", engines=["reference"])
