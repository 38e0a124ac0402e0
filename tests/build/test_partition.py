"""Partitioning with real engines: preferences, pending pieces, in-place races."""

from __future__ import annotations

import pytest

import opgraph as og

from ..helpers import assert_engine_matches

DT = og.DataType


@pytest.mark.interpreter
def test_an_op_no_engine_runs_alone_waits_for_the_op_that_folds_it_in(rng):
    g = og.Graph("t_mm", io_data_type=DT.FLOAT)
    a = g.tensor(dim=[1, 16, 8], name="a")
    b = g.tensor(dim=[1, 16, 12], name="b")
    g.matmul(g.transpose(a, [0, 2, 1]), b).set_output(True)  # a^T b: the transpose is a view of a
    plan = assert_engine_matches(g, rng, engines=("triton",), expect_steps=1)
    assert plan.steps[0].piece.kinds == ("transpose", "matmul")


def test_an_op_no_engine_runs_at_all_is_refused_with_reasons():
    g = og.Graph("lonely", io_data_type=DT.FLOAT)
    a = g.tensor(dim=[4, 4], name="a")
    g.transpose(a, [1, 0]).set_output(True)
    with pytest.raises(og.UnsupportedGraphError) as err:
        g.build(device="cpu", engines=["triton"])
    assert err.value.rule == "engine.no_support" and "transpose" in str(err.value)
