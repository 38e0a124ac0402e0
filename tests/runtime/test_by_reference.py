"""By-reference tensors on the CPU (Triton's interpreter): kernels read addresses from the plan's
address table, so new buffers need no rebuild and a table write redirects the next run."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph.tools.samples import nhwc
from opgraph.testing import empty_like_desc, poison, random_values

pytestmark = pytest.mark.interpreter
DT = og.DataType


def _graph(by_reference=True):
    dims = [2, 8, 3, 4]
    g = og.Graph("ref", io_data_type=DT.FLOAT)
    x = g.tensor(dim=dims, stride=nhwc(dims), name="x", is_by_reference=by_reference)
    b = g.tensor(dim=[1, 8, 1, 1], name="b")
    y = g.relu(g.bias(x, b)).set_output(True).set_name("y").set_is_by_reference(by_reference)
    g.validate()
    return g, x, b, y


def _want(xv, bv):
    return np.maximum(xv + bv, 0)


def test_kernels_read_addresses_from_the_table(rng):
    g, x, b, y = _graph()
    plan = g.build(device="cpu", engines=["triton"])
    src = plan.source(0)
    assert "og_table" in src and "tl.pointer_type" in src
    assert plan.address_table is not None and plan.address_table.numel() == 2
    bv = random_values(g.final.tensors[b.uid], rng)
    for _ in range(3):  # new buffers every run, same plan
        xv = random_values(g.final.tensors[x.uid], rng)
        yv = poison(empty_like_desc(g.final.tensors[y.uid]))
        plan.execute({x: xv, b: bv, y: yv})
        np.testing.assert_allclose(yv, _want(xv, bv), rtol=1e-6)
        assert plan.address_table[plan.table_slot(x)] == xv.__array_interface__["data"][0]


def test_set_address_redirects_without_a_pack(rng):
    g, x, b, y = _graph()
    plan = g.build(device="cpu", engines=["triton"])
    d = g.final.tensors
    xa, xb = random_values(d[x.uid], rng), random_values(d[x.uid], rng)
    bv, yv = random_values(d[b.uid], rng), poison(empty_like_desc(d[y.uid]))
    plan.execute({x: xa, b: bv, y: yv})
    np.testing.assert_allclose(yv, _want(xa, bv), rtol=1e-6)
    plan.set_address(x, xb)
    step = plan.steps[0]
    from opgraph.memory.addresses import TABLE_KEY

    step.kernel.run({b.uid: bv, TABLE_KEY: plan.address_table}, None, None)  # what a graph replay does
    np.testing.assert_allclose(yv, _want(xb, bv), rtol=1e-6)
    with pytest.raises(og.VariantPackError):
        plan.set_address(x, np.zeros((2, 8, 3, 4), np.float32))  # NCHW strides: does not fit
    with pytest.raises(og.GraphError):
        plan.set_address(b, bv)  # not by reference


def test_build_option_makes_every_tensor_by_reference(rng):
    g, *_ = _graph(by_reference=False)
    plan = g.build(device="cpu", engines=["triton"], by_reference=True)
    assert plan.address_table.numel() == 3
    assert not og.testing.check_plan(plan, rng)


def test_by_reference_survives_serialization(rng):
    g, *_ = _graph()
    plan = g.build(device="cpu", engines=["triton"])
    loaded = og.ExecutionPlan.from_bytes(plan.to_bytes())
    assert "og_table" in loaded.source(0)
    assert not og.testing.check_plan(loaded, rng)
    assert og.Graph.from_json(g.to_json()).final.tensors[g.final.tensor("x").uid].is_by_reference


def test_reference_engine_ignores_the_flag(rng):
    g, *_ = _graph()
    assert not og.testing.check_plan(g.build(device="cpu"), rng)
