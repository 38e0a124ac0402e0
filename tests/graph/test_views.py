"""graph/views.py: views read by several ops are duplicated per reader, and every view sits right before
the first op that depends on it; the values never change (the reference engine, op by op, against NumPy)."""

from __future__ import annotations

import numpy as np

import opgraph as og
from opgraph.testing import random_pack

DT = og.DataType


def _order(g: og.Graph) -> list[str]:
    return [n.name for n in g.final.nodes]


def test_a_view_moves_next_to_its_reader():
    g = og.Graph("sink", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[4, 6], name="x")
    w = g.tensor(dim=[6, 5], name="w")
    t = g.transpose(x, [1, 0], name="t")
    c = g.mul(w, 2.0, name="unrelated")
    g.matmul(g.transpose(t, [1, 0], name="t2"), c, name="mm").set_output(True)
    assert _order(g) == ["unrelated", "t", "t2", "mm"]


def test_a_shared_view_is_duplicated_per_reader_and_values_hold(rng):
    g = og.Graph("dup", io_data_type=DT.FLOAT)
    qkv = g.tensor(dim=[2, 3, 12], name="qkv")
    part = g.slice(qkv, [slice(None), slice(None), slice(4, 8)], name="part")
    r = g.reshape(part, [2, 3, 2, 2], name="r")
    a = g.exp(r, name="a")
    b = g.mul(r, 3.0, name="b")
    a.set_output(True)
    b.set_output(True)
    final = g.final
    names = _order(g)
    assert names.count("part") == 1 and names.count("r") == 1 and "part~1" in names and "r~1" in names, names
    # each copy right before its reader; each view read once
    assert names.index("r") == names.index("a") - 1 and names.index("r~1") == names.index("b") - 1, names
    readers = {}
    for n in final.nodes:
        for u in n.input_uids():
            readers.setdefault(u, []).append(n.name)
    assert all(len(readers[n.output_uids()[0]]) == 1 for n in final.nodes if n.kind in ("slice", "reshape"))
    pack = random_pack(final, rng)
    x = pack[final.tensor("qkv").uid].copy()
    g.build(device="cpu", engines=["reference"]).execute(pack)
    view = x[:, :, 4:8].reshape(2, 3, 2, 2)
    np.testing.assert_allclose(pack[final.tensor("a::output").uid], np.exp(view), rtol=1e-6)
    np.testing.assert_allclose(pack[final.tensor("b::output").uid], 3 * view, rtol=1e-6)


def test_a_view_of_a_tensor_updated_in_place_stays_before_the_update(rng):
    """W = W - 0.5 * dW in place, and a transpose of the old W read by an op placed after the update
    in recording order: the transpose must read the old W (it depends on nothing the update makes, but
    the update depends on it)."""
    g2 = og.Graph("inplace", io_data_type=DT.FLOAT)
    w = g2.tensor(dim=[3, 4], name="W", uid=1)
    dw = g2.tensor(dim=[3, 4], name="dW", uid=2)
    wt = g2.transpose(w, [1, 0], name="wt")
    upd = g2.sub(w, g2.mul(dw, 0.5, name="step"), name="update")
    upd.set_uid(1).set_output(True)
    g2.exp(wt, name="late").set_output(True)
    names = _order(g2)
    assert names.index("wt") < names.index("update"), names
    final = g2.final
    pack = random_pack(final, rng)
    old = pack[1].copy()
    g2.build(device="cpu", engines=["reference"]).execute(pack)
    np.testing.assert_allclose(pack[final.tensor("late::output").uid], np.exp(old.T), rtol=1e-6)
    np.testing.assert_allclose(pack[1], old - 0.5 * pack[2], rtol=1e-6)
