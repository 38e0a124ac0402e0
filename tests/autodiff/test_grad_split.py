"""The gradient of a split (slices tiling a tensor along one axis) is one concatenate of the slices'
gradients, not a sum of zero-padded slice_backward tensors; other slicings keep slice_backward."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og

DT = og.DataType


def _split_graph(bounds):
    g = og.Graph("split", io_data_type=DT.DOUBLE, intermediate_data_type=DT.DOUBLE, compute_data_type=DT.DOUBLE)
    x = g.tensor(dim=[3, 9], name="x")
    w = g.tensor(dim=[3, 9], name="w")
    h = g.mul(x, w)
    total = None
    for i, (a, b) in enumerate(bounds):
        part = g.slice(h, [slice(None), slice(a, b)])
        v = g.reduction(g.mul(part, float(i + 1)), "add").set_dim([1, 1]).set_data_type(DT.DOUBLE)
        total = v if total is None else g.add(total, v)
    total.set_output(True).set_name("loss")
    return g, x, w, total


def _grad_x(res, x, w, loss, xv, wv):
    """The gradient of `loss` w.r.t. x at (xv, wv), run on the CPU (its output poisoned first)."""
    pack = {u: v for u, v in ((x.uid, xv), (w.uid, wv)) if u in res.graph.final.inputs}
    pack[res.grad_inputs[loss.uid].uid] = np.ones((1, 1))
    gx = res.grads[x.uid]
    pack[gx.uid] = np.full(xv.shape, np.nan)
    res.graph.build(device="cpu").execute(pack)
    return pack[gx.uid]


@pytest.mark.parametrize(
    "bounds,joined",
    [([(0, 3), (3, 7), (7, 9)], True), ([(0, 3), (5, 9)], False), ([(0, 4), (2, 9)], False)],
    ids=["tiling", "gap", "overlap"],
)
def test_split_gradient_is_a_concatenate(bounds, joined, rng):
    g, x, w, loss = _split_graph(bounds)
    res = og.grad(g, [loss], [x])
    kinds = [n.kind for n in res.graph.final.nodes]
    assert ("concatenate" in kinds) == joined and ("slice_backward" in kinds) == (not joined), kinds
    xv, wv = rng.standard_normal((3, 9)), rng.standard_normal((3, 9))
    coef = np.zeros(9)
    for i, (a, b) in enumerate(bounds):
        coef[a:b] += i + 1
    np.testing.assert_allclose(_grad_x(res, x, w, loss, xv, wv), wv * coef, rtol=1e-15)


def test_split_read_through_a_shared_view_chain_is_one_concatenate(rng):
    """q, k and v of a fused projection as an imported `qkv.reshape(...).permute(...).unbind(0)`: the
    graph gives each slice a copy of the reshape-transpose chain (graph/placement.py), so each slice's
    gradient comes back through a chain of its own. Their sum is still one concatenate, under one
    chain, with no slice_backward (an H200 ran those three zero-fills and copies in 461 us per ViT-B/16
    layer)."""
    g = og.Graph("qkv", io_data_type=DT.DOUBLE, intermediate_data_type=DT.DOUBLE, compute_data_type=DT.DOUBLE)
    x = g.tensor(dim=[2, 12], name="x")
    w = g.tensor(dim=[2, 12], name="w")
    heads = g.transpose(g.reshape(g.mul(x, w), [2, 3, 4]), [1, 0, 2])  # [3, 2, 4]
    total = None
    for i in range(3):
        part = g.reshape(g.slice(heads, [slice(i, i + 1), slice(None), slice(None)]), [2, 4])
        v = g.reduction(g.mul(part, float(i + 1)), "add").set_dim([1, 1]).set_data_type(DT.DOUBLE)
        total = v if total is None else g.add(total, v)
    total.set_output(True).set_name("loss")
    res = og.grad(g, [total], [x])
    kinds = [n.kind for n in res.graph.final.nodes]
    assert "slice_backward" not in kinds and kinds.count("concatenate") == 1, kinds
    xv, wv = rng.standard_normal((2, 12)), rng.standard_normal((2, 12))
    coef = np.repeat([1.0, 2.0, 3.0], 4)  # column c of h is head c // 4
    np.testing.assert_allclose(_grad_x(res, x, w, total, xv, wv), wv * coef, rtol=1e-15)
