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


def test_a_normalization_result_contracts_into_a_sum():
    """(dx + y) - dx with dx ~1e19 from batchnorm_backward (double): op by op it is 0, with dx's final
    product fused into the ADD (H100, seed 20261125905043) it is y; the oracle allows both."""
    g = og.Graph("bnsum", io_data_type=DT.DOUBLE, intermediate_data_type=DT.DOUBLE, compute_data_type=DT.DOUBLE)
    dy = g.tensor(dim=[4, 2, 3, 3], name="dy")
    x = g.tensor(dim=[4, 2, 3, 3], name="x")
    scale = g.tensor(dim=[1, 2, 1, 1], name="scale")
    y = g.tensor(dim=[4, 2, 3, 3], name="y")
    dx, dscale, dbias = g.batchnorm_backward(dy, x, scale, epsilon=0.09, name="bn")
    dscale.set_output(True)
    dbias.set_output(True)
    g.sub(g.add(dx, y), dx, name="out").set_output(True)
    final = g.final
    rng = np.random.default_rng(2)
    vals = {
        "dy": rng.normal(size=dy.dim),
        "x": rng.normal(size=x.dim),
        "scale": np.full(scale.dim, 3e19),
        "y": rng.normal(size=y.dim),
    }
    want, spread = _spread(final, {final.tensor(n).uid: v for n, v in vals.items()})
    out = final.tensor("out::output").uid
    assert not want[out].any()  # y is lost in dx's rounding op by op
    assert (4 * spread[out] >= np.abs(vals["y"])).mean() > 0.5  # ... and kept when contracted


def test_a_mean_of_integers_rounds():
    """sin(mean of INT32 values near 3e6): the mean's division rounds (the last bit of 3e6 is 5e-10),
    so unlike an integer sum it is no exact op (torch on an H100, seed 20261125903940)."""
    g = og.Graph("intmean", io_data_type=DT.DOUBLE, intermediate_data_type=DT.DOUBLE, compute_data_type=DT.DOUBLE)
    a = g.tensor(dim=[3, 6], data_type=DT.INT32, name="a")
    g.sin(g.reduction(a, mode="avg", name="m").set_dim([3, 1]).set_data_type(DT.DOUBLE), name="s").set_output(True)
    final = g.final
    m = final.nodes[0]
    assert not oracle.exact_node(m, final.tensors)
    want, spread = _spread(final, {final.tensor("a").uid: np.random.default_rng(3).integers(2**21, 2**22, (3, 6))})
    s = final.tensor("s::output").uid
    assert spread[s].max() > 1e-12
