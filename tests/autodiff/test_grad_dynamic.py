"""Gradients of graphs with dynamic dims (opgraph.Dim): `grad` runs once on the symbolic graph; the
gradient graph, built once, run at many shapes must equal the gradient graph of the static graph
of each shape (reference engine, random inputs, poisoned outputs). Covers the rules that read or
make sizes: a mean's 1/count and a broadcast gradient's position count (size values, evaluated per
shape), slices along dynamic axes (slice_backward with dynamic bounds), concatenation, embedding,
attention (sdpa_backward's B and S), convolutions and pooling with a dynamic batch."""

from __future__ import annotations

import json

import numpy as np
import pytest

import opgraph as og
from opgraph.core.symbolic import Dim
from opgraph.core.symbolic_value import SizeValue, exact_quotient, size_value
from opgraph.testing import compare, random_pack, reference_outputs
from tests.ops.test_dynamic_inference import F32, FAMILIES, SHAPES, N, T, build


def means_and_broadcasts(g, n, t):
    x = g.tensor(dim=[n, t, 8], name="x")
    b = g.tensor(dim=[1, 1, 8], name="b")  # broadcast over the dynamic axes: its gradient sums them
    s = g.tensor(dim=[1, 1, 1], name="s")  # broadcast over everything: a count of positions
    y = g.mul(g.add(x, b), s)
    m = g.reduction(y, mode=og.ReductionMode.AVG).set_dim([1, t, 1])  # a mean over the dynamic batch and 8
    g.mul(m, m).set_output(True).set_name("sq")
    g.reduction(g.mul(s, 2.0), mode=og.ReductionMode.AVG).set_dim([1, 1, 1]).set_output(True).set_name("c")


def attention_training(g, n, t):
    q, k, v = (g.tensor(dim=[n, 2, t, 8], name=name) for name in "qkv")
    o, stats = g.sdpa(q, k, v, attn_scale=0.35, use_causal_mask=True, is_inference=False)
    o.set_output(True).set_name("o")
    stats.set_output(True).set_name("stats")


def dynamic_slices(g, n, t):
    x = g.tensor(dim=[n, t + 3, 6], name="x")
    a = g.slice(x, [slice(None), slice(1, t + 2)])  # a dynamic stop (x[:, 1:-1])
    b = g.slice(x, [slice(None), slice(0, 2), slice(0, 6, 2)])  # int bounds within the smallest size
    g.exp(a).set_output(True).set_name("inner")
    g.neg(b).set_output(True).set_name("window")
    parts = [g.slice(x, [slice(None), slice(0, 1)]), g.slice(x, [slice(None), slice(1, None)])]
    g.relu(g.concatenate(parts, axis=1)).set_output(True).set_name("split")  # slices tiling x: a concatenate
    y = g.tensor(dim=[n, t, 6], name="y")
    both = g.concatenate([y, g.exp(y)], axis=1)  # along a dynamic axis: its gradient slices at t
    g.mul(both, both).set_output(True).set_name("both")
    g.sigmoid(g.slice(both, [slice(None), slice(t, 2 * t)])).set_output(True).set_name("second")


CASES = {
    "pointwise and matmul": FAMILIES["pointwise and matmul"],
    "batched matmul": FAMILIES["batched matmul"],
    "reduction": FAMILIES["reduction"],
    "norms": FAMILIES["norms"],
    "layout": FAMILIES["layout"],
    "embedding": FAMILIES["embedding"],
    "conv and pooling": FAMILIES["conv and pooling"],
    "slice": FAMILIES["slice"],
    "means and broadcasts": means_and_broadcasts,
    "attention": attention_training,
    "dynamic slices": dynamic_slices,
}


def gradient(make, n, t) -> og.Graph:
    g = build(make, n, t)
    fg = g.final
    outputs = [u for u in fg.outputs if fg.tensors[u].data_type.is_floating and fg.tensors[u].name != "stats"]
    wrt = [u for u in fg.inputs if fg.tensors[u].data_type.is_floating]
    return og.grad(g, outputs, wrt, combined=True, allow_unused=True).graph


@pytest.mark.parametrize("case", list(CASES))
def test_gradient_graph_built_once_is_the_static_gradient_at_every_shape(case):
    dynamic = gradient(CASES[case], N, T)
    assert set(dynamic.final.symbols) == {"n", "t"} or case == "conv and pooling"
    plan = dynamic.build(device="cpu", engines=["reference"])
    rng = np.random.default_rng(11)
    for env in SHAPES:
        static = gradient(CASES[case], env["n"], env["t"]).final
        by_name = {t.name: u for u, t in dynamic.final.tensors.items()}
        pack = random_pack(static, rng)
        want = reference_outputs(static, pack)
        moved = {by_name[static.tensors[u].name]: v for u, v in pack.items()}
        for u in dynamic.final.outputs:
            if u in moved and u not in dynamic.final.inputs:
                moved[u] = np.full_like(moved[u], np.nan)
        plan.execute(moved)
        bad = []
        for u in static.outputs:
            d = by_name[static.tensors[u].name]
            if (m := compare(static.tensors[u], moved[d], want[u])) is not None:
                bad.append(m)
        assert not bad, f"{env}: " + "\n".join(map(str, bad))


def test_a_mean_over_dynamic_axes_is_a_size_value_in_the_graph_and_a_float_at_each_shape():
    g = og.Graph(io_data_type=F32)
    x = g.tensor(dim=[N, T, 4], name="x")
    g.reduction(x, mode=og.ReductionMode.AVG).set_dim([1, 1, 1]).set_output(True).set_name("m")
    backward = og.grad(g, "m", "x").graph
    gg = backward.final
    consts = [v.value for node in gg.nodes for v in node.inputs if isinstance(v, og.core.ir.Const)]
    assert SizeValue(1.0, 1, 4 * N * T) in consts
    at = gg.at({"n": 3, "t": 5})
    consts = [v.value for node in at.nodes for v in node.inputs if isinstance(v, og.core.ir.Const)]
    assert 1 / 60 in consts and not any(isinstance(c, SizeValue) for c in consts)
    text = backward.to_json()
    assert og.Graph.from_json(text).to_json() == text  # graph files keep them
    pytest.importorskip("jsonschema")
    from opgraph.graph.schema import schema_errors

    assert schema_errors(json.loads(text)) == []


def test_size_values_and_exact_quotients():
    assert size_value(8, 2) == 4.0 and size_value(3, 4, 2.0) == 1.5
    assert size_value(64 * N * T, N * T) == 64.0  # the symbols cancel: a float
    assert size_value(N, N * T * 4) == SizeValue(1.0, 1, 4 * T)
    assert size_value(N, T) == SizeValue(1.0, N, T)
    assert exact_quotient(6 * N * T + 3 * N, 3 * N) == 2 * T + 1
    assert exact_quotient(N + 1, N) is None and exact_quotient(7, 2) is None and exact_quotient(8, -2) == -4
    rng = np.random.default_rng(3)
    for _ in range(50):
        env = {"n": int(rng.integers(1, 10)), "t": int(rng.integers(1, 14))}
        v = SizeValue(0.5, 3 * N * T + N, 2 * T)
        assert v.at(env) == 0.5 * (3 * env["n"] * env["t"] + env["n"]) / (2 * env["t"])
        assert (v * 4).at(env) == 4 * v.at(env) and (v / 2).at(env) == v.at(env) / 2
    assert SizeValue.from_json(SizeValue(2.0, N * T, 3).to_json(), {"n": N, "t": T}) == SizeValue(2.0, N * T, 3)
    with pytest.raises(og.SerializationError):
        SizeValue.from_json({"scale": "x", "num": 1, "den": 1}, {})


def test_a_slice_backward_with_dynamic_bounds_is_checked_over_the_range():
    from opgraph.ops.layout import SliceBackward

    g = og.Graph(io_data_type=F32)
    t = Dim("t", 2, 9)
    dy = g.tensor(dim=[3, t - 1], name="dy")
    bad = SliceBackward(in_dim=(3, t), slices=((0, 3, 1), (1, t + 1, 1)))  # a stop past the axis' end
    g._add_op(bad, [dy], name="sb")[0].set_output(True)
    with pytest.raises(og.GraphError) as err:
        g.validate()
    assert err.value.rule in ("slice_backward.bounds", "op.dynamic_dims")
