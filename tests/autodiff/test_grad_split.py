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
    f = res.graph.final
    pack = {u: v for u, v in ((x.uid, xv), (w.uid, wv)) if u in f.inputs}
    pack[res.grad_inputs[loss.uid].uid] = np.ones((1, 1))
    gx = res.grads[x.uid]
    pack[gx.uid] = np.full((3, 9), np.nan)
    res.graph.build(device="cpu").execute(pack)
    coef = np.zeros(9)
    for i, (a, b) in enumerate(bounds):
        coef[a:b] += i + 1
    np.testing.assert_allclose(pack[gx.uid], wv * coef, rtol=1e-15)
