"""Custom ops: registered once, used in graphs, JSON and plans like built-in ops."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph.ops.custom import CUSTOM_OPS

from ..helpers import run_reference

pytestmark = pytest.mark.usefixtures("custom_ops_restored")


def _swiglu():
    og.register_custom_op(
        "swiglu", num_inputs=2, pointwise=True, reference=lambda x, g, beta=1.0: x * g / (1 + np.exp(-beta * g))
    )


def test_pointwise_custom_op_in_a_graph(rng):
    _swiglu()
    g = og.Graph("c", io_data_type=og.DataType.FLOAT)
    x, gate = g.tensor(dim=[3, 8], name="x"), g.tensor(dim=[3, 8], name="gate")
    y = g.relu(g.custom("swiglu", x, gate, params={"beta": 2.0})).set_output(True)
    pack, outs = run_reference(g, rng)
    xv, gv = pack[x.uid].astype(np.float64), pack[gate.uid].astype(np.float64)
    want = np.maximum(xv * gv / (1 + np.exp(-2.0 * gv)), 0)
    np.testing.assert_allclose(outs[y.uid], want, rtol=1e-6)


def test_custom_op_with_infer_and_two_outputs(rng):
    og.register_custom_op(
        "row_stats",
        num_inputs=1,
        num_outputs=2,
        infer=lambda x: [(x.dim[0], 1), ((x.dim[0], 1), og.DataType.DOUBLE)],
        reference=lambda x: (x.sum(axis=1, keepdims=True), x.max(axis=1, keepdims=True)),
    )
    g = og.Graph("c", io_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[5, 7], name="x")
    s, m = g.custom("row_stats", x)
    s.set_output(True)
    m.set_output(True)
    pack, outs = run_reference(g, rng)
    assert g.final.tensors[m.uid].data_type is og.DataType.DOUBLE
    np.testing.assert_allclose(outs[s.uid][:, 0], pack[x.uid].astype(np.float64).sum(1), rtol=1e-6)
    np.testing.assert_allclose(outs[m.uid][:, 0], pack[x.uid].max(1))


def test_json_round_trip_and_unregistered_load():
    _swiglu()
    g = og.Graph("c", io_data_type=og.DataType.FLOAT)
    x, gate = g.tensor(dim=[2, 2], name="x"), g.tensor(dim=[2, 2], name="gate")
    g.custom("swiglu", x, gate, params={"beta": 1.5}).set_output(True)
    text = g.to_json()
    assert og.Graph.from_json(text).key() == g.key()
    CUSTOM_OPS.clear()
    with pytest.raises(og.GraphError) as err:
        og.Graph.from_json(text)
    assert "swiglu" in str(err.value) and "register_custom_op" in str(err.value)


def test_bad_registrations_and_failing_infer():
    with pytest.raises(og.AttributeValueError):
        og.register_custom_op("not a name", num_inputs=1, reference=lambda x: x, pointwise=True)
    with pytest.raises(og.AttributeValueError):
        og.register_custom_op("noinfer", num_inputs=1, reference=lambda x: x)
    og.register_custom_op("broken", num_inputs=1, reference=lambda x: x, infer=lambda x: 1 / 0)
    g = og.Graph("c", io_data_type=og.DataType.FLOAT)
    g.custom("broken", g.tensor(dim=[2], name="x"), name="b").set_output(True)
    with pytest.raises(og.ShapeError) as err:
        g.validate()
    assert "ZeroDivisionError" in str(err.value) and "custom 'b'" in str(err.value)
    with pytest.raises(og.AttributeValueError):
        g.custom("broken")


def test_custom_op_on_the_torch_engine_uses_its_torch_implementation(rng):
    torch = pytest.importorskip("torch")
    calls = []

    def torch_impl(x, g, beta=1.0):
        calls.append(1)
        return x * g * torch.sigmoid(beta * g)

    og.register_custom_op(
        "swiglu_t",
        num_inputs=2,
        pointwise=True,
        torch=torch_impl,
        reference=lambda x, g, beta=1.0: x * g / (1 + np.exp(-beta * g)),
    )
    g = og.Graph("c", io_data_type=og.DataType.FLOAT)
    x, gate = g.tensor(dim=[3, 8], name="x"), g.tensor(dim=[3, 8], name="gate")
    g.custom("swiglu_t", x, gate, params={"beta": 2.0}).set_output(True)
    plan = g.build(device="cpu", engines=["torch"])
    assert og.BehaviorNote.HOST_EXECUTION in plan.steps[0].config.behavior_notes  # the CPU is the host
    assert not og.testing.check_plan(plan, rng) and calls
