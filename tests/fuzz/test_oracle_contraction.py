"""The oracle's contraction rule (docs/concepts.md, "Contraction"): a product may reach a sum that reads
it unrounded (one FMA), so the sensitivity runs nudge it there, and only there: an exact op that is no
sum (floor, a compare) reads the rounded product in every engine, and its result must stay exact."""

from __future__ import annotations

import numpy as np

import opgraph as og

from . import oracle

DT = og.DataType


def _spread(final, inputs, runs=8):
    want = oracle.evaluate(final, inputs, None)
    rng = np.random.default_rng(0)
    spread = {u: np.zeros(final.tensors[u].dim) for u in final.outputs}
    for _ in range(runs):
        nudged = oracle.evaluate(final, inputs, rng)
        for u in final.outputs:
            spread[u] = np.maximum(spread[u], np.abs(nudged[u].astype(np.float64) - want[u].astype(np.float64)))
    return want, spread


def _graph():
    g = og.Graph("contract", io_data_type=DT.FLOAT, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    a = g.tensor(dim=[64], name="a")
    b = g.tensor(dim=[64], name="b")
    c = g.tensor(dim=[64], name="c")
    p = g.mul(a, b, name="p")
    g.floor(p, name="fl").set_output(True)
    g.cmp_ge(p, c, name="ge").set_output(True).set_data_type(DT.BOOLEAN)
    g.tan(g.add(p, c, name="s"), name="t").set_output(True)
    return g.final


def test_exact_readers_of_a_product_see_it_rounded():
    """floor(3 * 2) is 6 and (3 * 2 >= 6) true in every engine: no spread there."""
    final = _graph()
    uid = {final.tensor(n).uid: n for n in ("a", "b", "c")}
    vals = {"a": np.full(64, 3.0), "b": np.full(64, 2.0), "c": np.full(64, 6.0)}
    want, spread = _spread(final, {u: vals[n] for u, n in uid.items()})
    fl, ge = final.tensor("fl::output").uid, final.tensor("ge::output").uid
    assert want[fl].min() == 6.0 and want[ge].all()
    assert not spread[fl].any() and not spread[ge].any(), (spread[fl].max(), spread[ge].max())


def test_a_sum_reading_a_product_still_sees_it_contracted():
    """tan(a * b + c) near a pole: the product's last bit moves the output (the H100 case of
    seed20261125501445), so the spread there is wide."""
    final = _graph()
    uid = {final.tensor(n).uid: n for n in ("a", "b", "c")}
    rng = np.random.default_rng(1)
    a = rng.uniform(1.0, 2.0, 64)
    b = rng.uniform(1.0, 2.0, 64)
    c = (np.pi / 2 - 1e-3) - (a * b).astype(np.float32).astype(np.float64)  # a * b + c close to the pole
    want, spread = _spread(final, {u: {"a": a, "b": b, "c": c}[n] for u, n in uid.items()})
    t = final.tensor("t::output").uid
    assert (spread[t] > 1e-4 * np.abs(want[t])).any()
