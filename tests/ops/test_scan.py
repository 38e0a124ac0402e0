"""The running sum (cumsum): reference and torch engine against PyTorch (float64), reverse scans,
integer and bool inputs, the gradient rule against torch.autograd, and the axis check."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og

torch = pytest.importorskip("torch")
DT = og.DataType


def _graph(dims, axis, reverse=False, dtype=DT.DOUBLE, out_type=None):
    g = og.Graph("scan", io_data_type=DT.DOUBLE, intermediate_data_type=DT.DOUBLE, compute_data_type=DT.DOUBLE)
    x = g.tensor(dim=dims, data_type=dtype, name="x")
    y = g.cumsum(x, axis, reverse=reverse).set_output(True).set_name("y")
    if out_type is not None:
        y.set_data_type(out_type)
    return g, x, y


def _poisoned(g, y):
    d = g.final.tensors[y.uid]
    return np.full(d.dim, -7, dtype=d.data_type.numpy)


@pytest.mark.parametrize("engine", ["reference", "torch"])
@pytest.mark.parametrize("axis,reverse", [(0, False), (1, False), (2, True), (1, True)])
def test_cumsum_vs_torch(engine, axis, reverse, rng):
    g, x, y = _graph([3, 5, 4], axis, reverse)
    xv = rng.standard_normal((3, 5, 4))
    pack = {x: xv, y: _poisoned(g, y)}
    g.build(device="cpu", engines=[engine]).execute(pack)
    t = torch.from_numpy(xv)
    want = t.flip(axis).cumsum(axis).flip(axis) if reverse else t.cumsum(axis)
    np.testing.assert_allclose(pack[y], want.numpy(), rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("engine", ["reference", "torch"])
def test_cumsum_of_a_bool_mask_counts_in_int64(engine, rng):
    g, x, y = _graph([2, 9], 1, dtype=DT.BOOLEAN, out_type=DT.INT64)
    mv = rng.random((2, 9)) > 0.4
    pack = {x: mv, y: _poisoned(g, y)}
    g.build(device="cpu", engines=[engine]).execute(pack)
    np.testing.assert_array_equal(pack[y], np.cumsum(mv, axis=1))


def test_cumsum_gradient_is_the_reverse_scan(rng):
    g, x, y = _graph([4, 6], 1)
    res = og.grad(g, [y], [x])
    f = res.graph.final
    assert [n.op.reverse for n in f.nodes if n.kind == "cumsum"] == [True]
    xv, dy = rng.standard_normal((4, 6)), rng.standard_normal((4, 6))
    pack = {uid: None for uid in f.inputs}
    pack = {res.grad_inputs[y.uid].uid: dy}
    for uid in f.inputs:
        if uid == x.uid:
            pack[uid] = xv
    for uid in f.outputs:
        pack[uid] = np.full(f.tensors[uid].dim, np.nan)
    res.graph.build(device="cpu").execute(pack)
    t = torch.from_numpy(xv).requires_grad_(True)
    t.cumsum(1).backward(torch.from_numpy(dy))
    np.testing.assert_allclose(pack[res.grads[x.uid].uid], t.grad.numpy(), rtol=1e-13, atol=1e-13)


def test_cumsum_axis_outside_the_rank_is_refused():
    g = og.Graph("bad")
    x = g.tensor(dim=[2, 3], name="x")
    g.cumsum(x, 2).set_output(True)
    with pytest.raises(og.AttributeValueError, match="cumsum.axis"):
        g.validate()
