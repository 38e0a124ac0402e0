"""Finalize: dataflow from UIDs, topological order, inference and one test per validation rule.

Every failure must be a typed GraphError whose message names the tensor (name and UID), carries the
rule id and says what to do."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph.testing import compare

from ..helpers import run_reference

D = og.DataType


def expect(g: og.Graph, cls: type, rule: str, *needles: str) -> og.GraphError:
    with pytest.raises(og.GraphError) as ei:
        g.validate()
    err = ei.value
    assert type(err) is cls, f"{type(err).__name__}: {err}"
    text = str(err)
    assert err.rule == rule and f"[rule {rule}]" in text, text
    assert "What to do:" in text and err.hint
    for needle in needles:
        assert needle in text, f"{needle!r} not in: {text}"
    return err


def graph(**kw) -> og.Graph:
    return og.Graph(name="t", io_data_type=D.FLOAT, **kw)


# -- order and dataflow ----------------------------------------------------------------------------


def test_ops_added_in_reverse_order_still_sort(rng):
    """Declare the intermediate by UID, consume it, and only then add the op that produces it."""
    g = graph()
    x = g.tensor(dim=[2, 3], name="x", uid=1)
    m = g.tensor(dim=[2, 3], name="m", uid=2, is_virtual=True)  # a forward reference
    y = g.mul(m, 3.0, name="last").set_output(True).set_name("y").set_uid(3)
    g.exp(x, name="first").set_uid(2)  # produces uid 2 after its consumer was added
    final = g.validate().final
    assert [n.name for n in final.nodes] == ["first", "last"]
    assert final.inputs == (1,) and final.outputs == (3,)
    assert final.tensors[2].name == "m" and final.tensors[2].is_virtual
    assert m.dim == (2, 3) and m.uid == 2
    pack, outs = run_reference(g, rng)
    want = np.exp(pack[1].astype(np.float64)) * 3.0
    assert compare(final.tensors[3], outs[3], want) is None
    assert y.uid == 3


def test_long_chain_sorted_whatever_the_insertion_order(rng):
    g = graph()
    x = g.tensor(dim=[4], name="x", uid=100)
    k = 6
    for i in reversed(range(k)):  # op i reads uid 100+i and writes uid 101+i, added last-first
        src = x if i == 0 else g.tensor(dim=[4], uid=100 + i, name=f"t{i}", is_virtual=True)
        out = g.add(src, 1.0, name=f"op{i}").set_uid(101 + i)
        if i == k - 1:
            out.set_output(True)
    final = g.validate().final
    assert [n.name for n in final.nodes] == [f"op{i}" for i in range(k)]
    pack, outs = run_reference(g, rng)
    np.testing.assert_allclose(outs[100 + k], pack[100] + k, rtol=1e-6)


def test_forward_reference_must_agree_with_its_producer():
    g = graph()
    x = g.tensor(dim=[2, 3], name="x", uid=1)
    m = g.tensor(dim=[3, 2], name="m", uid=2, is_virtual=True)
    g.relu(m).set_output(True).set_uid(3)
    g.exp(x).set_uid(2)
    expect(g, og.ShapeError, "infer.dims_mismatch", "(uid 2)")
    m.set_dim([2, 3]).set_data_type(D.HALF)
    g.validate()
    assert g.final.tensors[2].data_type is D.HALF  # what the declared handle set is kept
    m.set_is_virtual(False)
    expect(g, og.DataflowError, "tensor.uid_alias", "'m' (uid 2)")


def test_cycle():
    g = graph()
    x = g.tensor(dim=[2, 3], name="x", uid=1)
    a = g.tensor(dim=[2, 3], name="a", uid=10, is_virtual=True)
    b = g.add(x, a, name="op_b").set_uid(11).set_name("b")
    g.exp(b, name="op_a").set_uid(10)  # a = exp(b) and b = x + a
    g.relu(b, name="out").set_output(True)
    err = expect(g, og.DataflowError, "dataflow.cycle", "'op_a'", "'op_b'")
    assert "'a' (uid 10)" in str(err) or "'b' (uid 11)" in str(err)
    assert "'out'" not in err.detail  # only the ops of the cycle are named


def test_inplace_update_runs_after_every_other_read_of_the_old_value():
    g = graph()
    x = g.tensor(dim=[2, 3], name="x", uid=7)
    g.exp(x, name="upd").set_uid(7).set_output(True).set_name("x_new")
    g.relu(x, name="other").set_output(True).set_name("r")  # added later, reads the old x
    order = [n.name for n in g.validate().final.nodes]
    assert order == ["other", "upd"]


def test_inplace_update_by_a_non_pointwise_op_in_a_multi_op_graph():
    g = graph()
    x = g.tensor(dim=[3, 3], name="x", uid=7)
    g.transpose(x, [1, 0], name="t").set_uid(7).set_output(True)
    g.relu(x, name="other").set_output(True)
    expect(g, og.DataflowError, "dataflow.inplace", "(uid 7)", "'t'")


def test_tensor_produced_twice():
    g = graph()
    x = g.tensor(dim=[2, 3], name="x")
    g.exp(x, name="p1").set_uid(5).set_output(True).set_name("a")
    g.log(x, name="p2").set_uid(5).set_output(True).set_name("b")
    expect(g, og.DataflowError, "dataflow.two_producers", "(uid 5)", "'p1'", "'p2'")


def test_duplicate_uids_name_both_tensors():
    g = graph()
    x = g.tensor(dim=[2, 3], name="x", uid=7)
    w = g.tensor(dim=[2, 3], name="w", uid=7)
    g.add(x, w).set_output(True)
    expect(g, og.DuplicateUIDError, "tensor.duplicate_uid", "'x'", "'w'", "(uid 7)", "UID 7")


def test_duplicate_uid_on_two_declared_handles_of_one_output():
    g = graph()
    x = g.tensor(dim=[2, 3], name="x", uid=1)
    r1 = g.tensor(dim=[2, 3], name="r1", uid=2, is_virtual=True)
    r2 = g.tensor(dim=[2, 3], name="r2", uid=2, is_virtual=True)
    g.add(r1, r2).set_output(True)
    g.exp(x).set_uid(2)
    expect(g, og.DuplicateUIDError, "tensor.duplicate_uid", "'r1'", "'r2'", "(uid 2)")


def test_inplace_single_op_allowed_multi_op_rejected():
    g = graph()
    x = g.tensor(dim=[2, 3], name="x", uid=7)
    y = g.relu(x).set_uid(7).set_output(True)
    final = g.validate().final
    assert len(final.nodes) == 1 and final.nodes[0].inputs[0] == 7 and final.nodes[0].outputs == (7,)
    assert final.outputs == (7,) and final.inputs == ()
    assert final.tensors[7].name == "x"  # the user's name wins over the generated one
    assert y.uid == 7
    g.exp(y).set_output(True).set_name("e")  # a second op, reading the updated value
    final = g.validate().final
    assert [n.kind for n in final.nodes] == ["pointwise", "pointwise"] and final.nodes[1].inputs[0] == 7


def test_inplace_on_a_virtual_tensor_rejected():
    g = graph()
    x = g.tensor(dim=[2, 3], name="x", uid=7)
    g.relu(x).set_uid(7)  # output left virtual
    expect(g, og.DataflowError, "dataflow.inplace", "(uid 7)")


def test_virtual_tensor_nobody_produces():
    g = graph()
    v = g.tensor(dim=[2, 3], name="ghost", uid=4, is_virtual=True)
    g.relu(v).set_output(True)
    expect(g, og.DataflowError, "dataflow.unproduced_virtual", "'ghost' (uid 4)")


def test_virtual_output_nobody_reads():
    g = graph()
    x = g.tensor(dim=[2, 3], name="x")
    g.relu(x, name="lost").set_name("lost_out").set_uid(9)
    g.exp(x).set_output(True)
    expect(g, og.DataflowError, "dataflow.unread_virtual", "'lost_out' (uid 9)", "'lost'")


def test_declared_tensor_nobody_uses():
    g = graph()
    x = g.tensor(dim=[2, 3], name="x")
    g.tensor(dim=[5], name="lonely", uid=33)
    g.exp(x).set_output(True)
    expect(g, og.DataflowError, "dataflow.unused", "'lonely' (uid 33)")


def test_op_with_no_output():
    g = graph()
    x = g.tensor(dim=[2, 3], name="x")
    from opgraph.ops.pointwise import Pointwise, PointwiseMode

    g._add_op(Pointwise(mode=PointwiseMode.EXP), [x], name="void", out_handles=[None])
    with pytest.raises(og.DataflowError) as ei:
        g.validate()
    assert ei.value.rule == "dataflow.no_output" and "'void'" in str(ei.value)


# -- shapes ------------------------------------------------------------------------------------------


def test_stride_rank_mismatch_on_input():
    g = graph()
    x = g.tensor(dim=[2, 3], stride=[3, 1, 1], name="x", uid=3)
    g.exp(x).set_output(True)
    expect(g, og.ShapeError, "tensor.stride_rank", "'x' (uid 3)", "[2, 3]", "[3, 1, 1]")


def test_stride_rank_mismatch_on_output():
    g = graph()
    x = g.tensor(dim=[2, 3], name="x")
    g.exp(x).set_output(True).set_name("y").set_uid(8).set_stride([1])
    expect(g, og.ShapeError, "tensor.stride_rank", "'y' (uid 8)")


def test_missing_dims_on_input():
    g = graph()
    x = g.tensor(name="nodims", uid=2)
    g.exp(x).set_output(True)
    expect(g, og.ShapeError, "tensor.no_dims", "'nodims' (uid 2)")


def test_output_dims_disagree_with_inference():
    g = graph()
    x = g.tensor(dim=[2, 3], name="x")
    g.exp(x, name="e").set_output(True).set_dim([3, 2]).set_name("y").set_uid(6)
    expect(g, og.ShapeError, "infer.dims_mismatch", "'y' (uid 6)", "[3, 2]", "[2, 3]", "'e'")


def test_output_dims_that_agree_are_fine():
    g = graph()
    x = g.tensor(dim=[2, 3], name="x")
    g.exp(x).set_output(True).set_dim([2, 3]).set_stride([1, 2])
    assert g.validate().final.outputs


@pytest.mark.parametrize("stride", [[1, 1], [0, 1], [2, 1]])
def test_overlapping_output_strides(stride):
    g = graph()
    x = g.tensor(dim=[2, 3], name="x")
    g.exp(x).set_output(True).set_name("y").set_uid(6).set_stride(stride)
    expect(g, og.ShapeError, "tensor.overlapping_output", "'y' (uid 6)", str(stride))


def test_broadcast_input_strides_may_overlap(rng):
    """Inputs may repeat elements (stride 0); only outputs need their own memory."""
    g = graph()
    x = g.tensor(dim=[2, 3], stride=[0, 1], name="x")
    y = g.neg(x).set_output(True)
    g.validate()
    pack, outs = run_reference(g, rng)
    np.testing.assert_array_equal(outs[y.uid], -np.broadcast_to(pack[x.uid][0], (2, 3)))


def test_pass_by_value_with_several_elements():
    g = graph()
    x = g.tensor(dim=[2, 3], name="x")
    s = g.tensor(dim=[2], name="s", uid=4, is_pass_by_value=True)
    g.mul(x, s).set_output(True)
    expect(g, og.ShapeError, "tensor.pass_by_value", "'s' (uid 4)", "[2]")


def test_pass_by_value_as_op_output():
    g = graph()
    x = g.tensor(dim=[1], name="x")
    g.exp(x).set_output(True).set_is_pass_by_value(True).set_name("y").set_uid(5)
    expect(g, og.DataflowError, "dataflow.pass_by_value_output", "'y' (uid 5)")


def test_pass_by_value_any_rank_of_ones_is_fine():
    g = graph()
    x = g.tensor(dim=[2, 3], name="x")
    s = g.tensor(dim=[1, 1], name="s", is_pass_by_value=True)
    g.mul(x, s).set_output(True)
    g.validate()


def test_broadcast_rank_mismatch_names_the_operand():
    g = graph()
    x = g.tensor(dim=[2, 3, 4], name="x")
    b = g.tensor(dim=[3, 4], name="bias", uid=12)
    g.add(x, b, name="badd").set_output(True)
    expect(g, og.ShapeError, "broadcast.rank", "'bias' (uid 12)", "input1", "'badd'")


def test_broadcast_dims_mismatch_names_the_operand():
    g = graph()
    x = g.tensor(dim=[2, 3, 4], name="x")
    b = g.tensor(dim=[1, 2, 1], name="bias", uid=12)
    g.add(x, b).set_output(True)
    expect(g, og.ShapeError, "broadcast.dims", "'bias' (uid 12)", "axis 1", "[1, 2, 1]")


def test_scalar_input_given_a_multi_element_tensor():
    g = graph()
    x = g.tensor(dim=[2, 3], name="x")
    slope = g.tensor(dim=[2, 3], name="slope", uid=21)
    g.relu(x, negative_slope=slope).set_output(True)
    expect(g, og.ShapeError, "op.scalar_input", "'slope' (uid 21)", "negative_slope")


# -- builder-time errors (raised when the op is added) -----------------------------------------------


def test_tensor_from_another_graph():
    g, h = graph(), graph()
    x = h.tensor(dim=[2, 3], name="foreign", uid=3)
    with pytest.raises(og.GraphError) as ei:
        g.relu(x)
    assert ei.value.rule == "op.foreign_tensor" and "'foreign' (uid 3)" in str(ei.value)
    assert g._records == []


@pytest.mark.parametrize("bad", ["a", [1, 2], np.ones(3), 1j, None], ids=repr)
def test_bad_operand(bad):
    g = graph()
    x = g.tensor(dim=[2, 3], name="x")
    with pytest.raises(og.ShapeError) as ei:
        g.add(x, bad)
    assert ei.value.rule in ("op.operand", "op.missing_input") and "input1" in str(ei.value)


def test_empty_graph():
    g = og.Graph(name="nothing")
    g.tensor(dim=[2], name="x")
    expect(g, og.GraphError, "graph.empty", "'nothing'")


# -- validate itself ---------------------------------------------------------------------------------


def test_validate_is_idempotent():
    g = graph()
    x = g.tensor(dim=[2, 3], name="x")
    g.exp(x).set_output(True)
    assert g.validate() is g
    final = g.final
    assert g.validate().final is final
    assert g.validate().final is final  # no re-finalization, same object
    text = str(g)
    assert str(g) == text and "EXP" in text


def test_failed_validate_fails_again_then_recovers():
    g = graph()
    x = g.tensor(dim=[2, 3], name="x")
    y = g.exp(x)
    e1 = expect(g, og.DataflowError, "dataflow.unread_virtual")
    e2 = expect(g, og.DataflowError, "dataflow.unread_virtual")
    assert str(e1) == str(e2)
    assert "not valid yet" in str(g)  # printing an invalid graph does not raise
    y.set_output(True)
    assert g.validate().final.outputs == (y.uid,)


def test_print_shows_the_graph():
    g = og.Graph(name="demo", io_data_type=D.HALF)
    x = g.tensor(dim=[8, 16, 4, 4], stride=[256, 1, 64, 16], name="x", uid=1)
    b = g.tensor(dim=[1, 16, 1, 1], name="b", uid=2)
    g.relu(g.bias(x, b, name="bias0"), negative_slope=0.1, name="act").set_output(True).set_name("y").set_uid(3)
    text = str(g)
    # no op says these are images, so the layout is printed as strides, not named
    for needle in (
        "graph 'demo'",
        "'x'",
        "f16[8,16,4,4] strides[256,1,64,16]",
        "bias0",
        "RELU_FWD",
        "0.1",
        "%3",
        "'y'",
    ):
        assert needle in text, (needle, text)
    assert "4 tensors" in repr(g) and "2 ops" in repr(g)


def test_layouts_are_named_as_images_only_where_an_op_says_so():
    """[B, T, H] activations printed as 'ncw' (issue 20): only operands of image ops (and the
    feature maps pointwise ops carry to them) get nchw/nhwc names; others are row-major or strides."""
    g = og.Graph(name="seq", io_data_type=D.FLOAT)
    x = g.tensor(dim=[2, 16, 32], name="x")
    w = g.tensor(dim=[1, 32, 32], name="w")
    y = g.relu(g.matmul(x, w)).set_output(True).set_name("y")
    t = g.tensor(dim=[2, 32, 16], stride=[512, 1, 32], name="xt")
    g.exp(t).set_output(True).set_name("e")
    final = g.final
    assert final.tensor("x").type_str() == "f32[2,16,32] row-major"
    assert final.tensor("y").layout == "row-major"
    assert final.tensor("xt").layout == "strides[512,1,32]" and "ncw" not in str(g) and "nwc" not in str(g)

    c = og.Graph(name="img", io_data_type=D.FLOAT)
    img = c.tensor(dim=[2, 8, 5], stride=[40, 1, 8], name="img")  # N, C, W channels-last
    pre = c.relu(img)
    wt = c.tensor(dim=[4, 8, 3], name="wt")
    b = c.tensor(dim=[1, 4, 1], name="b")
    c.bias(c.conv_fprop(pre, wt, padding=[1]), b).set_output(True).set_name("out")
    final = c.final
    assert final.tensor("img").layout == "nwc"  # a conv's image, through the relu before it
    assert final.tensor("wt").layout == "ncw" and final.tensor("b").layout == "ncw"
    assert final.tensor("out").layout == "nwc"  # a conv output follows its image
