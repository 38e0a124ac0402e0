"""graph/placement.py: views read by several ops are duplicated per reader, every view sits right before the
first op that depends on it, a GEMM's would-be epilogue moves up next to it and a generator down to its
reader; the values never change
(the reference engine against NumPy or its own op-by-op results)."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph.testing import random_pack

DT = og.DataType


def _order(g: og.Graph) -> list[str]:
    return [n.name for n in g.final.nodes]


def _values_hold(g: og.Graph, rng) -> None:
    """The reordered graph's plan computes what its ops define, op by op (the reference engine)."""
    final = g.final
    pack = random_pack(final, rng)
    want = og.testing.reference_outputs(final, pack)
    g.build(device="cpu", engines=["reference"]).execute(pack)
    for u in final.outputs:
        np.testing.assert_allclose(pack[u], want[u], rtol=1e-6)


def _run_keeping(g: og.Graph, rng, uid: int) -> tuple[og.FinalGraph, dict, np.ndarray]:
    """g's graph, a random pack after the reference engine ran the plan on it, and tensor `uid`'s value
    before (one the plan updates in place)."""
    final = g.final
    pack = random_pack(final, rng)
    old = pack[uid].copy()
    g.build(device="cpu", engines=["reference"]).execute(pack)
    return final, pack, old


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


def _shared_reshape() -> og.Graph:
    g = og.Graph("share", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[3, 2, 2, 5, 4], name="x")
    w = g.tensor(dim=[1, 24, 6], name="w")
    t = g.reshape(g.transpose(x, [1, 3, 0, 2, 4], name="t"), [2, 5, 24], name="r")
    g.matmul(t, w, name="mm").set_output(True)
    g.reduction(t, "ADD", name="sum").set_dim([1, 1, 24]).set_output(True)
    rows = g.transpose(g.reshape(t, [1, 10, 24], name="rows"), [0, 2, 1], name="rt")
    g.matmul(rows, g.tensor(dim=[1, 10, 3], name="v"), name="mm2").set_output(True)
    g.exp(t, name="e").set_output(True)
    return g


def test_a_reshape_that_needs_a_copy_is_shared_by_its_readers_but_pointwise_ones(rng):
    """Heads-major gradients [3, B, H, S, D] transposed to tokens and merged to [B, S, 3 H D]: no view of
    that memory, so the matmul, the reduction and the view reading it share one (a copy made once);
    the pointwise reader gets its own (it gathers). The values hold."""
    g = _shared_reshape()
    names = _order(g)
    assert names.count("r") == 1 and "r~1" in names and "r~2" not in names, names
    readers = {n.name: n.input_uids() for n in g.final.nodes}
    r = next(n for n in g.final.nodes if n.name == "r").output_uids()[0]
    assert all(r in readers[k] for k in ("mm", "sum", "rows")) and r not in readers["e"], names
    final = g.final
    pack = random_pack(final, rng)
    x0 = pack[final.tensor("x").uid].copy()
    g.build(device="cpu", engines=["reference"]).execute(pack)
    tokens = x0.transpose(1, 3, 0, 2, 4).reshape(2, 5, 24)
    np.testing.assert_allclose(pack[final.tensor("sum::output").uid], tokens.sum(axis=(0, 1), keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(pack[final.tensor("e::output").uid], np.exp(tokens), rtol=1e-6)


@pytest.mark.interpreter
def test_a_shared_copy_computes_the_reference_in_generated_kernels(rng):
    plan = _shared_reshape().build(device="cpu", engines=["triton"])
    bad = og.testing.check_plan(plan, rng, rtol=1e-4, atol=1e-4)
    assert not bad, "\n".join(map(str, bad)) + "\n" + plan.describe()


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
    final, pack, old = _run_keeping(g2, rng, 1)
    np.testing.assert_allclose(pack[final.tensor("late::output").uid], np.exp(old.T), rtol=1e-6)
    np.testing.assert_allclose(pack[1], old - 0.5 * pack[2], rtol=1e-6)


def test_a_chain_of_views_of_a_tensor_updated_in_place_reads_the_old_value(rng):
    """transpose(old W) -> reshape -> exp, the exp recorded after W's in-place update: the reshape may
    follow its reader past the update, but the transpose (which reads W) must stay before it."""
    g = og.Graph("inplace_chain", io_data_type=DT.FLOAT)
    w = g.tensor(dim=[3, 4], name="W", uid=1)
    dw = g.tensor(dim=[3, 4], name="dW", uid=2)
    wr = g.reshape(g.transpose(w, [1, 0], name="wt"), [2, 6], name="wr")
    g.sub(w, g.mul(dw, 0.5, name="step"), name="update").set_uid(1).set_output(True)
    g.exp(wr, name="late").set_output(True)
    names = _order(g)
    assert names.index("wt") < names.index("update") and names.index("wr") < names.index("late"), names
    final, pack, old = _run_keeping(g, rng, 1)
    np.testing.assert_allclose(pack[final.tensor("late::output").uid], np.exp(old.T.reshape(2, 6)), rtol=1e-6)
    np.testing.assert_allclose(pack[1], old - 0.5 * pack[2], rtol=1e-6)


def test_a_gemm_epilogue_moves_up_to_its_gemm(rng):
    """dA = dY @ W^T, then (recorded later, after an unrelated op) dh = gelu_backward(dA, h) and its
    column sum: both move to just after the GEMM (one kernel can take them); values unchanged."""
    g = og.Graph("epi", io_data_type=DT.FLOAT)
    dy = g.tensor(dim=[1, 8, 6], name="dy")
    w = g.tensor(dim=[1, 6, 5], name="w")
    h = g.tensor(dim=[1, 8, 5], name="h")
    other = g.tensor(dim=[1, 8, 6], name="other")
    da = g.matmul(dy, w, name="dA")
    g.exp(other, name="unrelated").set_output(True)
    dh = g.gelu_backward(da, h, name="dgelu")
    dh.set_output(True)
    g.reduction(dh, mode=og.ReductionMode.ADD, name="dbias").set_output(True).set_dim([1, 1, 5])
    names = _order(g)
    assert names.index("dgelu") == names.index("dA") + 1 and names.index("dbias") == names.index("dA") + 2, names
    _values_hold(g, rng)


def test_an_epilogue_in_place_leads_on_and_a_view_moves_with_its_reader(rng):
    """AOTAutograd's RMSNorm backward after the data-gradient GEMM: the residual add is next to the GEMM
    already, then unrelated ops (the next weight gradient's transposes), then the norm's weight reshaped
    to broadcast (a view, placed right before its reader) times the add, and the row sum: the product
    moves up after the add with its view, and the sum after it; values unchanged."""
    g = og.Graph("aot", io_data_type=DT.FLOAT)
    dy = g.tensor(dim=[1, 8, 6], name="dy")
    w = g.tensor(dim=[1, 6, 5], name="w")
    res = g.tensor(dim=[1, 8, 5], name="res")
    gamma = g.tensor(dim=[5], name="gamma")
    other = g.tensor(dim=[6, 4], name="other")
    da = g.matmul(dy, w, name="dA")
    added = g.add(da, res, name="add")
    added.set_output(True)
    g.exp(g.transpose(other, [1, 0], name="t_other"), name="unrelated").set_output(True)
    scaled = g.mul(added, g.reshape(gamma, [1, 1, 5], name="gamma3"), name="scaled")
    g.reduction(scaled, mode=og.ReductionMode.ADD, name="rowsum").set_output(True).set_dim([1, 8, 1])
    names = _order(g)
    at = names.index("add")
    assert names[at + 1 : at + 4] == ["gamma3", "scaled", "rowsum"], names
    _values_hold(g, rng)


def test_placing_a_placed_order_again_leaves_it():
    """Two chains hanging off one epilogue op (a loss's row max and its picked logit after the classifier
    GEMM) keep their order, so a plan file's graph, placed again when it is read, gives the same kernels."""
    from opgraph.graph.placement import place_epilogues

    g = og.Graph("chains", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[1, 8, 6], name="x")
    w = g.tensor(dim=[1, 6, 5], name="w")
    onehot = g.tensor(dim=[1, 8, 5], name="onehot")
    logits = g.add(g.matmul(x, w, name="mm"), 1.0, name="bias")
    g.reduction(logits, mode=og.ReductionMode.MAX, name="max").set_dim([1, 8, 1]).set_output(True)
    g.exp(g.tensor(dim=[3], name="other"), name="unrelated").set_output(True)
    picked = g.mul(logits, onehot, name="pick")
    g.reduction(picked, mode=og.ReductionMode.ADD, name="picked").set_dim([1, 8, 1]).set_output(True)
    final = g.final
    names = [n.name for n in final.nodes]
    assert names.index("max") < names.index("pick"), names
    again = place_epilogues(list(final.nodes), final.tensors)
    assert [n.name for n in again] == names


def test_a_widening_cast_does_not_move_after_an_epilogue_in_place():
    """A bf16 residual add next to its GEMM, the norm's statistics from its fp32 cast, then (after the
    statistics) a second fp32 cast of the residual for the normalising product: that cast stays with its
    reader, so the GEMM's piece does not store an fp32 copy of the residual."""
    g = og.Graph("norm", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    a = g.tensor(dim=[1, 8, 6], name="a")
    w = g.tensor(dim=[1, 6, 16], name="w")
    h = g.tensor(dim=[1, 8, 16], name="h")
    r = g.add(g.matmul(a, w, name="mm"), h, name="res").set_data_type(DT.BFLOAT16)
    r.set_output(True)
    sq = g.mul(
        g.identity(r, name="cast1").set_data_type(DT.FLOAT),
        g.identity(r, name="cast1b").set_data_type(DT.FLOAT),
        name="sq",
    )
    var = g.reduction(sq, mode=og.ReductionMode.AVG, name="var").set_dim([1, 8, 1])
    inv = g.rsqrt(g.add(var, 1e-6, name="eps"), name="inv")
    y = g.mul(g.identity(r, name="cast2").set_data_type(DT.FLOAT), inv, name="y")
    y.set_output(True)
    names = _order(g)
    assert names.index("cast2") > names.index("var"), names


def test_an_epilogue_does_not_move_above_a_write_of_what_it_reads():
    """y = dA * s' where s' (s halved in place, recorded between the GEMM and y) is the new value of s:
    y stays after the update."""
    g = og.Graph("epi2", io_data_type=DT.FLOAT)
    a = g.tensor(dim=[1, 4, 3], name="a")
    b = g.tensor(dim=[1, 3, 2], name="b")
    s = g.tensor(dim=[1, 4, 2], name="s", uid=50)
    da = g.matmul(a, b, name="mm")
    s_new = g.mul(s, 0.5, name="halve").set_uid(50).set_output(True)
    g.mul(da, s_new, name="y").set_output(True)
    names = _order(g)
    assert names.index("y") > names.index("halve"), names


def test_a_long_chain_of_views_is_placed_without_recursion():
    """2,000 reshapes in a row, read by one op at the end of the graph (after an unrelated op)."""
    g = og.Graph("chain", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[4, 6], name="x")
    other = g.tensor(dim=[3], name="other")
    y = x
    for i in range(2000):
        y = g.reshape(y, [6, 4] if i % 2 == 0 else [4, 6], name=f"r{i}")
    g.exp(other, name="unrelated").set_output(True)
    g.exp(y, name="last").set_output(True)
    names = _order(g)
    assert names[0] == "unrelated" and names[1:] == [f"r{i}" for i in range(2000)] + ["last"]


def test_an_epilogue_read_through_views_moves_up_with_them(rng):
    """The query and key projections recorded together, then each one's rotary embedding, read through the
    product's views (split into heads, transposed, sliced; one view chain a reader): each embedding's ops and
    views move up to their projection, so that its kernel can take them; values unchanged."""
    from ..engines.test_triton_concat import _rotary

    g = og.Graph("rope", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[2, 4, 8], name="x")
    cos, sin = (g.tensor(dim=[1, 1, 4, 4], name=n) for n in ("cos", "sin"))
    q = g.matmul(x, g.tensor(dim=[1, 8, 8], name="wq"), name="q_proj").set_dim([2, 4, 8]).set_data_type(DT.FLOAT)
    k = g.matmul(x, g.tensor(dim=[1, 8, 4], name="wk"), name="k_proj").set_dim([2, 4, 4]).set_data_type(DT.FLOAT)
    _rotary(g, q, cos, sin, 2, 4, DT.FLOAT).set_output(True)
    _rotary(g, k, cos, sin, 1, 4, DT.FLOAT).set_output(True)
    final = g.final
    kinds = [n.kind for n in final.nodes]
    products = [i for i, kind in enumerate(kinds) if kind == "matmul"]
    assert products[1] > products[0] + 1, kinds  # (the queries' embedding between the two projections)
    between = kinds[products[0] + 1 : products[1]]
    assert "concatenate" in between and "slice" in between and between.count("pointwise") >= 4, kinds
    _values_hold(g, rng)


def test_an_epilogue_at_the_end_of_a_long_chain_of_views_moves_without_recursion():
    """A product read through 2,000 reshapes by one op recorded after an unrelated op: the op and its chain
    move up to the product, walked without recursion."""
    g = og.Graph("gemm_chain", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[4, 6], name="x")
    y = g.matmul(x, g.tensor(dim=[6, 6], name="w"), name="product")
    g.exp(g.tensor(dim=[3], name="other"), name="unrelated").set_output(True)
    for i in range(2000):
        y = g.reshape(y, [6, 4] if i % 2 == 0 else [4, 6], name=f"r{i}")
    g.exp(y, name="last").set_output(True)
    names = _order(g)
    assert names.index("last") < names.index("unrelated"), names[:4]


def _cross_entropy_parts(classes: int = 64) -> og.Graph:
    """A loss's passes over logits as training.losses emits them: the row max, then the sum of exps and the
    picked logit, whose one-hot labels (made from the classes' indices and the per-row target) are
    recorded before the passes that read them."""
    g = og.Graph("ce", io_data_type=DT.FLOAT)
    logits = g.tensor(dim=[8, classes], name="logits")
    target = g.tensor(dim=[8, 1], name="target", data_type=DT.INT64)
    m = g.reduction(logits, mode=og.ReductionMode.MAX, name="max").set_dim([8, 1])
    onehot = g.cmp_eq(g.gen_index(logits, 1, name="classes"), target, name="onehot").set_data_type(DT.FLOAT)
    shifted = g.sub(logits, m, name="shift")
    total = g.reduction(g.exp(shifted, name="exp"), mode=og.ReductionMode.ADD, name="sum").set_dim([8, 1])
    total.set_output(True)
    picked = g.reduction(g.mul(onehot, shifted, name="pick"), mode=og.ReductionMode.ADD, name="picked")
    picked.set_dim([8, 1]).set_output(True)
    return g


def test_a_generator_moves_to_its_reader_and_no_kernel_stores_its_value():
    """The one-hot labels sit right before the op picking with them: the partition fuses them into that
    pass over the logits, and no piece writes them (the max's kernel stored [tokens, vocab] floats)."""
    from opgraph.build.partition import partition
    from opgraph.build.planner import usable_engines

    from ..build.fakes import CPU

    g = _cross_entropy_parts()
    assert _order(g) == ["max", "shift", "exp", "sum", "classes", "onehot", "pick", "picked"]
    final = g.final
    onehot = next(u for n in final.nodes if n.name in ("classes", "onehot") for u in n.output_uids())
    pieces, _ = partition(final, usable_engines(["triton"], CPU), CPU)
    assert all(onehot not in p.outputs for p in pieces), [p.label() for p in pieces]
    assert [[n.name for n in p.nodes] for p in pieces][-1][-3:] == ["onehot", "pick", "picked"]


@pytest.mark.interpreter
def test_a_placed_generator_computes_the_reference_in_generated_kernels(rng):
    g = _cross_entropy_parts()
    target = next(u for u in g.final.inputs if g.final.tensors[u].name == "target")
    targets = rng.integers(0, 64, size=(8, 1))
    plan = g.build(device="cpu", engines=["triton"])
    bad = og.testing.check_plan(plan, rng, prepare=lambda p: p.__setitem__(target, targets), rtol=1e-4, atol=1e-4)
    assert not bad, "\n".join(map(str, bad)) + "\n" + plan.describe()


def test_a_broadcast_by_a_few_is_no_generator():
    """Keys repeated for grouped-query heads (a broadcast along an axis of 2) stay where they are: their
    value is no cheaper to compute where it is read than to store."""
    from opgraph.graph.placement import GENERATED_PER_READ

    assert GENERATED_PER_READ > 2
    g = og.Graph("repeat", io_data_type=DT.FLOAT)
    k = g.tensor(dim=[2, 1, 16], name="k")
    ones = g.tensor(dim=[1, 2, 1], name="ones")
    other = g.tensor(dim=[3], name="other")
    rep = g.mul(k, ones, name="repeat")
    g.exp(other, name="unrelated").set_output(True)
    g.exp(rep, name="reader").set_output(True)
    assert _order(g) == ["repeat", "unrelated", "reader"]


def test_a_generator_reading_a_tensor_updated_in_place_stays_before_the_update(rng):
    """A per-row value spread over the columns by their indices, read after an in-place update of that
    row value in recording order: it is no generator to move (it would read the new value)."""
    g = og.Graph("gen_inplace", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[8, 64], name="x", uid=1)
    row = g.tensor(dim=[8, 1], name="row", uid=2)
    spread = g.add(row, g.gen_index(x, 1, name="idx").set_data_type(DT.FLOAT), name="spread")
    g.add(row, 1.0, name="bump").set_uid(2).set_output(True)
    g.mul(spread, g.exp(x, name="unrelated"), name="reader").set_output(True)
    names = _order(g)
    assert names.index("spread") < names.index("bump"), names
    final, pack, old = _run_keeping(g, rng, 2)
    want = (old + np.arange(64)) * np.exp(pack[1])
    np.testing.assert_allclose(pack[final.tensor("reader::output").uid], want, rtol=1e-6)


def test_placing_generators_again_leaves_them():
    from opgraph.graph.placement import place_generators

    final = _cross_entropy_parts().final
    again = place_generators(list(final.nodes), final.tensors)
    assert [n.name for n in again] == [n.name for n in final.nodes]
