"""Graphs with dynamic dims (opgraph.Dim): declaring them, what finalize proves and refuses, the static
graph at one shape (FinalGraph.at) and graph files."""

from __future__ import annotations

import pytest

import opgraph as og
from opgraph.core.symbolic import Expr
from tests.helpers import check_rule

B, S = og.Dim("batch", 1, 16), og.Dim("seq", 1, 2048)


def relu_graph(dim, stride=None) -> tuple[og.Graph, og.Tensor, og.Tensor]:
    g = og.Graph("dyn", io_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=dim, stride=stride, name="x")
    y = g.relu(x).set_output(True).set_name("y")
    return g, x, y


def test_a_tensor_takes_dims_and_gets_packed_symbolic_strides():
    g, x, y = relu_graph([B, S, 64])
    assert x.dim == (B, S, 64) and isinstance(x.dim[0], Expr)
    final = g.final
    assert final.symbols == {"batch": B, "seq": S} and final.is_dynamic
    desc = final.tensor("x")
    assert desc.stride == (64 * S, 64, 1) and desc.is_dynamic
    assert final.tensor("y").dim == (B, S, 64) and final.tensor("y").stride == (64 * S, 64, 1)
    assert desc.layout == "row-major"
    assert "dims: batch 1..16, seq 1..2048" in str(final)
    assert "f32[batch,seq,64]" in str(final)


def test_a_static_graph_has_no_symbols_and_is_its_own_shape():
    g, _, _ = relu_graph([2, 3])
    assert g.final.symbols == {} and not g.final.is_dynamic
    assert g.final.at({}) is g.final


def test_at_evaluates_every_size_and_keeps_handles():
    g, x, y = relu_graph([B, S, 64])
    static = g.final.at({"batch": 3, "seq": 17})
    assert static.tensor("x").dim == (3, 17, 64) and static.tensor("x").stride == (17 * 64, 64, 1)
    assert static.tensor("y").dim == (3, 17, 64)
    assert not static.is_dynamic and static.handle_uid(x) == g.final.handle_uid(x)
    assert g.final.at({"batch": 3, "seq": 17}) is static  # memoized by shape
    assert g.final.at({"seq": 17, "batch": 3, "other": 9}) is static


@pytest.mark.parametrize("env", [{"batch": 17, "seq": 1}, {"batch": 0, "seq": 1}, {"seq": 5}, {"batch": 1.0, "seq": 1}])
def test_at_refuses_a_shape_outside_the_ranges(env):
    g, _, _ = relu_graph([B, S])
    with pytest.raises(og.ShapeError) as info:
        g.final.at(env)
    check_rule(info.value, "dim.value", "batch" if "batch" not in env or env["batch"] != 1 else "seq")


def test_expressions_as_dims_and_strides():
    g, _, _ = relu_graph([B * S, 4096])
    assert g.final.tensor("y").dim == (B * S, 4096)
    padded = [S * 4224, 4224, 1]  # padded rows
    g, _, _ = relu_graph([B, S, 4096], padded)
    assert g.final.tensor("x").stride == tuple(padded)
    assert g.final.at({"batch": 2, "seq": 3}).tensor("x").stride == (3 * 4224, 4224, 1)


def test_a_dim_that_can_be_below_one_is_refused():
    g = og.Graph()
    with pytest.raises(og.ShapeError) as info:
        g.tensor(dim=[S - 1, 4], name="x")
    check_rule(info.value, "tensor.dim")


def test_two_ranges_for_one_name_are_refused_naming_both_tensors():
    g = og.Graph(io_data_type=og.DataType.FLOAT)
    a = g.tensor(dim=[og.Dim("n", 1, 8), 4], name="a")
    b = g.tensor(dim=[og.Dim("n", 1, 9), 4], name="b")
    g.add(a, b).set_output(True)
    with pytest.raises(og.ShapeError) as info:
        g.validate()
    check_rule(info.value, "dim.conflict", "a", "b", "n")


def test_a_layout_whose_order_flips_inside_the_range_is_refused():
    seq = og.Dim("seq", 1, 128)
    g, _, _ = relu_graph([seq, 4, 4096], [seq * 64, 4096, 1])  # 64*seq < 4096 below seq 64
    with pytest.raises(og.ShapeError) as info:
        g.validate()
    check_rule(info.value, "tensor.layout_order", "x")


def test_distinct_dims_do_not_broadcast():
    g = og.Graph(io_data_type=og.DataType.FLOAT)
    a = g.tensor(dim=[B, 4], name="a")
    b = g.tensor(dim=[og.Dim("m", 1, 16), 4], name="b")
    g.add(a, b).set_output(True)
    with pytest.raises(og.ShapeError) as info:
        g.validate()
    err = check_rule(info.value, "broadcast.dims", "b")
    assert "declare one Dim" in err.hint


def test_a_literal_one_broadcasts_against_a_dynamic_dim():
    g = og.Graph(io_data_type=og.DataType.FLOAT)
    a = g.tensor(dim=[B, S, 8], name="a")
    bias = g.tensor(dim=[1, 1, 8], name="bias")
    g.add(a, bias).set_output(True).set_name("y")
    assert g.final.tensor("y").dim == (B, S, 8)


def test_an_op_that_does_not_take_dynamic_dims_is_refused_by_name():
    g = og.Graph(io_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[B, 8, 6], name="x")
    g.causal_conv1d(x, g.tensor(dim=[8, 4], name="w"), name="conv").set_output(True)  # a family left static
    with pytest.raises(og.ShapeError) as info:
        g.validate()
    check_rule(info.value, "op.dynamic_dims", "x", "conv")


def test_graph_json_round_trip_keeps_dims_and_static_files_stay_version_1():
    g, _, _ = relu_graph([B, S * 2, 64])
    text = g.to_json()
    assert '"version": 2' in text and '"dims"' in text and '"2*seq"' in text
    back = og.Graph.from_json(text).final
    assert back.symbols == g.final.symbols
    assert back.tensor("y").dim == g.final.tensor("y").dim
    assert back.tensor("x").stride == g.final.tensor("x").stride
    static, _, _ = relu_graph([2, 3])
    assert '"version": 1' in static.to_json() and '"dims"' not in static.to_json()


@pytest.mark.parametrize(
    "damage, rule",
    [
        (lambda d: d.pop("dims"), "json.version"),
        (lambda d: d.__setitem__("dims", [{"name": "batch", "min": 1}]), "symbolic.json"),
        (lambda d: d["dims"].append(dict(d["dims"][0])), "json.dims"),
        (lambda d: d["tensors"][0].__setitem__("dim", ["batch", "zeq", 64]), "symbolic.unknown"),
        (lambda d: d["tensors"][0].__setitem__("dim", ["__import__('os')", 1, 64]), "symbolic.parse"),
    ],
)
def test_damaged_dims_in_a_graph_file_are_serialization_errors(damage, rule):
    import json

    g, _, _ = relu_graph([B, S, 64])
    doc = json.loads(g.to_json())
    damage(doc)
    with pytest.raises(og.SerializationError) as info:
        og.Graph.from_json(json.dumps(doc))
    assert info.value.rule == rule, str(info.value)
