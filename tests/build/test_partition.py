"""Partitioning: contiguous runs, cuts with each engine's reason, engine preferences, pending pieces,
in-place races, allow_partition=False (stand-in engines from fakes.py, and real ones)."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph.build.partition import partition
from opgraph.engines import get_engine

from ..helpers import assert_engine_matches, run_reference
from .fakes import CPU, FakeEngine, at_most, chain, only_kinds

DT = og.DataType


@pytest.mark.interpreter
def test_an_op_no_engine_runs_alone_waits_for_the_op_that_folds_it_in(rng):
    g = og.Graph("t_mm", io_data_type=DT.FLOAT)
    a = g.tensor(dim=[1, 16, 8], name="a")
    b = g.tensor(dim=[1, 16, 12], name="b")
    g.matmul(g.transpose(a, [0, 2, 1]), b).set_output(True)  # a^T b: the transpose is a view of a
    plan = assert_engine_matches(g, rng, engines=("triton",), expect_steps=1)
    assert plan.steps[0].piece.kinds == ("transpose", "matmul")


def test_a_view_that_only_its_reader_completes_joins_the_piece_with_it():
    """An engine that takes a view only together with the op reading it (a bias reshaped for a GEMM's
    epilogue): the lookahead from the cut at the view takes its reader, and both join the piece."""
    g = og.Graph("epilogue_view", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[2, 3], name="x")
    b = g.tensor(dim=[3], name="b")
    y = g.add(g.exp(x, name="e"), g.reshape(b, [1, 3], name="v"), name="a")
    g.relu(y, name="r").set_output(True)
    f = g.final

    def rule(piece):
        last = piece.nodes[-1]
        return "a view is read in the same piece only" if last.kind == "reshape" else None

    pieces, cuts = partition(f, [FakeEngine("epilogue", rule)], CPU)
    assert names(pieces) == [["e", "v", "a", "r"]] and not cuts


def test_a_pointwise_op_that_only_its_reader_completes_joins_the_piece_with_it():
    """An RMSNorm's scaling as the importer emits it: the rsqrt of the mean, then a cast of the stream
    read again (Importer._recast), then their product. The pointwise template refuses the piece with the
    cast but not the product (two outputs of two shapes); the lookahead from the cut takes the product."""
    from opgraph.build.planner import usable_engines

    g = og.Graph("rms_scale", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT)
    x = g.tensor(dim=[4, 64], name="x")
    ms = g.tensor(dim=[4, 1], name="ms", data_type=DT.FLOAT)
    r = g.rsqrt(g.add(ms, g.tensor(dim=[1], name="eps", data_type=DT.FLOAT, is_pass_by_value=True), name="a"), name="r")
    wide = g.identity(x, name="recast").set_data_type(DT.FLOAT)
    g.mul(wide, r, name="m").set_output(True)
    pieces, cuts = partition(g.final, usable_engines(["triton"], CPU), CPU)
    assert names(pieces) == [["a", "r", "recast", "m"]] and not cuts


def test_an_op_no_engine_runs_at_all_is_refused_with_reasons():
    g = og.Graph("lonely", io_data_type=DT.FLOAT)
    # (no generated template runs a causal conv1d; a reshape that is no view is a copy kernel now)
    y = g.causal_conv1d(g.tensor(dim=[2, 4, 8], name="x"), g.tensor(dim=[4, 3], name="w"))
    y.set_output(True)
    with pytest.raises(og.UnsupportedGraphError) as err:
        g.build(device="cpu", engines=["triton"])
    assert err.value.rule == "engine.no_support" and "causal_conv1d" in str(err.value)
    assert "triton: not applicable" in str(err.value)


# -- the greedy rule, with stand-in engines (build/fakes.py) -----------------------------------------


def names(pieces) -> list[list[str]]:
    return [[n.name for n in p.nodes] for p in pieces]


def check_contiguous(pieces, graph) -> None:
    """The pieces, in order, are the graph's ops in its topological order, each piece once."""
    assert [p.index for p in pieces] == list(range(len(pieces)))
    assert [n for p in pieces for n in p.nodes] == list(graph.nodes)


def test_pieces_are_contiguous_runs_cut_where_the_engine_stops():
    f = chain()
    pieces, cuts = partition(f, [FakeEngine("pairs", at_most(2))], CPU)
    check_contiguous(pieces, f)
    assert names(pieces) == [["e", "m"], ["r", "a"]]
    (cut,) = cuts
    assert cut.before == 0 and cut.node.name == "r" and cut.reasons == (("pairs", "at most 2 ops"),)
    # the tensor between the pieces is an output of the first and an input of the second
    between = f.nodes[1].output_uids()[0]
    assert between in pieces[0].outputs and between in pieces[1].inputs
    assert pieces[1].outputs == f.outputs


def test_a_less_preferred_engine_does_not_take_an_op_a_preferred_one_runs_alone():
    f = chain()
    engines = [FakeEngine("relu_only", only_kinds("r")), FakeEngine("any")]
    pieces, cuts = partition(f, engines, CPU)
    check_contiguous(pieces, f)
    assert names(pieces) == [["e", "m"], ["r"], ["a"]]
    assert [c.node.name for c in cuts] == ["r", "a"]
    assert cuts[0].reasons == (("any", "this op runs on the preferred engine 'relu_only'"),)
    assert cuts[1].reasons == (("relu_only", "runs only r alone"),)  # only engines as preferred as the owner


def test_an_engine_that_fuses_its_neighbours_keeps_them():
    f = chain()
    engines = [FakeEngine("relu_only", only_kinds("r")), FakeEngine("fusing", fuses=True)]
    pieces, cuts = partition(f, engines, CPU)
    assert names(pieces) == [["e", "m", "r", "a"]] and cuts == []


def test_a_pending_op_joins_the_op_that_completes_it():
    f = chain()
    not_exp_alone = FakeEngine("needs_consumer", lambda p: "exp alone" if [n.name for n in p.nodes] == ["e"] else None)
    pieces, cuts = partition(f, [not_exp_alone], CPU)
    assert names(pieces) == [["e", "m", "r", "a"]] and cuts == []
    # never completed: the op no engine runs is named, with each engine's reason
    picky = FakeEngine("picky", lambda p: None if p.nodes[0].name != "e" and len(p.nodes) == 1 else "not this")
    with pytest.raises(og.UnsupportedGraphError) as err:
        partition(f, [picky, FakeEngine("other", lambda p: "never")], CPU)
    assert err.value.rule == "engine.no_support" and err.value.op == "pointwise 'e'"
    assert "picky: not this; other: never" in str(err.value)


def test_allow_partition_false_names_the_op_where_fusion_broke():
    f = chain()
    with pytest.raises(og.UnsupportedGraphError) as err:
        partition(f, [FakeEngine("pairs", at_most(2))], CPU, allow_partition=False)
    assert err.value.rule == "partition.strict" and err.value.op == "pointwise 'r'"
    assert "needs 2 kernels" in str(err.value) and "pairs: at most 2 ops" in str(err.value)
    # a less preferred engine that runs the whole graph makes it one piece
    pieces, cuts = partition(f, [FakeEngine("pairs", at_most(2)), FakeEngine("any")], CPU, allow_partition=False)
    assert names(pieces) == [["e", "m", "r", "a"]] and cuts == []
    assert pieces[0].inputs == f.inputs and pieces[0].outputs == f.outputs


def _inplace_graph(reader: str) -> og.Graph:
    """W (uid 100) read by `reader` ('matmul' reads other elements; 'pointwise' the same ones;
    'broadcast' a pointwise op whose output is wider than W), then W -= 0.5 * W in place."""
    g = og.Graph("upd", io_data_type=DT.FLOAT)
    wd = [1, 4] if reader == "broadcast" else [4, 4]
    w = g.tensor(dim=wd, name="W", uid=100)
    x = g.tensor(dim=[4, 4], name="x")
    y = g.matmul(x, w, name="read") if reader == "matmul" else g.mul(x, w, name="read")
    y.set_output(True).set_name("y")
    g.sub(w, g.mul(w, 0.5, name="half"), name="upd").set_uid(100).set_output(True)
    return g


@pytest.mark.parametrize("reader", ["matmul", "broadcast"])
def test_an_inplace_update_is_cut_from_an_op_reading_other_elements(rng, reader):
    g = _inplace_graph(reader)
    f = g.final
    pieces, cuts = partition(f, [get_engine("reference")], CPU)
    check_contiguous(pieces, f)
    (cut,) = cuts
    assert cut.node.name == "upd" and cut.reasons[0][0] == "partition"
    assert "updates tensor 'W' (uid 100) in place, which" in cut.reasons[0][1] and "'read'" in cut.reasons[0][1]
    # run it: the reader sees the old W
    pack, out = run_reference(g, rng)
    w_new = pack[100]
    w_old = w_new / 0.5  # W - 0.5 W
    x = pack[f.tensor("x").uid]
    want = x @ w_old if reader == "matmul" else x * w_old
    np.testing.assert_allclose(out[f.tensor("y").uid], want, rtol=1e-5)


def test_an_inplace_update_shares_a_kernel_with_elementwise_readers():
    f = _inplace_graph("pointwise").final
    pieces, cuts = partition(f, [get_engine("reference")], CPU)
    assert len(pieces) == 1 and cuts == []


# --- a one-op graph whose op writes its own input's UID (issue 38: a matmul's generated kernel returned
# garbage, max error 158 against values up to 29) ------------------------------------------------------


def _mm_inplace(role: str) -> og.Graph:
    g = og.Graph("mm", io_data_type=og.DataType.FLOAT)
    a = g.tensor(dim=[1, 8, 8], name="a", uid=1)
    b = g.tensor(dim=[1, 8, 8], name="b", uid=2)
    g.matmul(a, b, name="mm").set_output(True).set_uid(1 if role == "A" else 2).set_name("c")
    return g


def _conv_inplace(which: str) -> og.Graph:
    g = og.Graph("conv", io_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[4, 4, 3, 3], name="x", uid=1)
    w = g.tensor(dim=[4, 4, 3, 3], name="w", uid=2)  # Y has the dims of both
    g.conv_fprop(x, w, padding=[1, 1], name="conv").set_output(True).set_uid(1 if which == "X" else 2)
    return g


def _transpose_inplace() -> og.Graph:
    g = og.Graph("t", io_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[4, 4], name="x", uid=1)
    g.transpose(x, [1, 0], name="t").set_output(True).set_uid(1).set_stride([4, 1])
    return g


CASES = {
    "matmul-A": lambda: _mm_inplace("A"),
    "matmul-B": lambda: _mm_inplace("B"),
    "conv-X": lambda: _conv_inplace("X"),
    "conv-W": lambda: _conv_inplace("W"),
    "transpose": _transpose_inplace,
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_op_overwriting_an_input_it_reads_elsewhere_is_refused_by_generated_kernels(case):
    pytest.importorskip("triton")
    g = CASES[case]()
    with pytest.raises(og.UnsupportedGraphError) as ei:
        g.build(device="cpu", engines=["triton"])
    text = str(ei.value)
    assert "over its own" in text and "dataflow.inplace" in text and "torch, reference" in text


@pytest.mark.parametrize("engine", ["reference", "torch"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_engines_that_write_after_computing_run_it_right(case, engine, rng):
    """Through a copy: the whole result is computed before it is written over the input."""
    if engine == "torch":
        pytest.importorskip("torch")
    g = CASES[case]()
    final = g.final
    (uid,) = final.outputs
    plan = g.build(device="cpu", engines=[engine])
    pack = og.testing.random_pack(final, rng)
    want = og.testing.reference_outputs(final, {u: v.copy() for u, v in pack.items()})
    plan.execute(pack)
    np.testing.assert_allclose(pack[uid], want[uid], rtol=1e-5, atol=1e-5)


def test_the_default_build_with_triton_first_gives_the_op_to_torch(rng):
    pytest.importorskip("triton")
    pytest.importorskip("torch")
    g = _mm_inplace("A")
    plan = g.build(device="cpu", engines=["triton", "torch"])
    assert [s.config.engine for s in plan.steps] == ["torch"]
    assert not og.testing.check_plan(plan, rng)


def test_aligned_updates_in_place_stay_with_generated_kernels(rng):
    pytest.importorskip("triton")
    g = og.Graph("upd", io_data_type=og.DataType.FLOAT)
    w = g.tensor(dim=[4, 8], name="w", uid=1)
    d = g.tensor(dim=[4, 8], name="d", uid=2)
    g.sub(w, d, name="upd").set_uid(1).set_output(True)  # W = W - dW
    plan = g.build(device="cpu", engines=["triton"])
    assert [s.config.engine for s in plan.steps] == ["triton"]
    wv, dv = rng.standard_normal((4, 8)).astype(np.float32), rng.standard_normal((4, 8)).astype(np.float32)
    buf = wv.copy()
    plan.execute({1: buf, 2: dv})
    np.testing.assert_allclose(buf, wv - dv, rtol=1e-6)


# -- views pending for their reader (real engines) -----------------------------------------------------


def _kinds(plan) -> list[tuple[str, tuple[str, ...]]]:
    return [(s.config.engine, s.piece.kinds) for s in plan.steps]


def test_views_wait_for_their_reader_and_the_others_are_copied_by_a_generated_kernel():
    """A transpose that its reader does not follow (an epilogue moved between them, in-place updates),
    then a transpose and the GEMM reading it: the GEMM reads its transpose in place and the first is
    copied by the pointwise template (the torch engine took both, and the GEMM read a copy)."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    g = og.Graph("views", io_data_type=DT.FLOAT)
    a, b = g.tensor(dim=[1, 16, 8], name="a"), g.tensor(dim=[1, 16, 8], name="b")
    c, d = g.tensor(dim=[1, 16, 12], name="c"), g.tensor(dim=[1, 8, 12], name="d")
    ta = g.transpose(a, [0, 2, 1], name="ta")
    s = g.add(g.matmul(g.transpose(b, [0, 2, 1], name="tb"), c, name="m1"), g.exp(d, name="e"), name="s")
    g.add(s, g.matmul(ta, c, name="m2"), name="o").set_output(True)
    g.validate()
    final = g.final
    order = {n.name: n for n in final.nodes}
    assert [n.name for n in final.nodes] == ["tb", "m1", "e", "s", "ta", "m2", "o"]  # (placement.py)
    moved = og.FinalGraph(
        final.name,
        final.tensors,
        tuple(order[k] for k in ["ta", "tb", "m1", "e", "s", "m2", "o"]),
        final.io_data_type,
        final.intermediate_data_type,
        final.compute_data_type,
    )
    engines = [get_engine("triton"), get_engine("torch")]
    pieces, cuts = partition(moved, engines, CPU)
    assert names(pieces) == [["ta"], ["tb", "m1", "e", "s"], ["m2", "o"]]
    owners = [next(e.name for e in engines if e.supports(p, CPU).ok) for p in pieces]
    assert owners == ["triton"] * 3
    assert cuts[0].node.name == "tb"


@pytest.mark.interpreter
def test_views_of_different_dims_before_another_op_close_as_copies_of_their_own(rng):
    """Views that no reader follows (an unrelated op comes next) and that one kernel cannot copy together
    (other dims) become a generated copy each, not one torch-engine step."""
    pytest.importorskip("torch")
    g = og.Graph("views2", io_data_type=DT.FLOAT)
    a = g.tensor(dim=[2, 6, 4], name="a")
    b = g.tensor(dim=[3, 5], name="b")
    c = g.tensor(dim=[2, 3], name="c")
    ra = g.reshape(g.transpose(a, [0, 2, 1], name="ta"), [2, 24], name="ra")  # no strides describe it
    tb = g.transpose(b, [1, 0], name="tb")
    e = g.exp(c, name="e")
    g.add(g.matmul(ra, g.tensor(dim=[24, 3], name="w")), e).set_output(True)
    g.matmul(tb, g.tensor(dim=[3, 2], name="v")).set_output(True)
    plan = assert_engine_matches(g, rng, engines=("triton", "torch"))
    kinds = _kinds(plan)
    assert all(engine == "triton" for engine, _ in kinds), kinds


def test_views_closed_apart_leave_cuts_and_a_strict_build_names_them():
    """Two views of different dims that no kernel copies together: a cut between their copies (with each
    engine's reason), and allow_partition=False a typed error, not an IndexError."""
    pytest.importorskip("triton")
    g = og.Graph("v", io_data_type=DT.FLOAT)
    g.transpose(g.tensor(dim=[2, 6, 4], name="a"), [0, 2, 1], name="ta").set_output(True)
    g.transpose(g.tensor(dim=[3, 5], name="b"), [1, 0], name="tb").set_output(True)
    g.validate()
    pieces, cuts = partition(g.final, [get_engine("triton")], CPU)
    assert names(pieces) == [["ta"], ["tb"]]
    (cut,) = cuts
    assert cut.before == 0 and cut.node.name == "tb" and cut.reasons[0][0] == "triton"
    with pytest.raises(og.UnsupportedGraphError) as err:
        g.build(device="cpu", engines=["triton"], allow_partition=False)
    assert err.value.rule == "partition.strict"
