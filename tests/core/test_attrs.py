"""core.attrs: every registered op's attributes survive encode -> JSON -> decode with their exact types
(sample values made from each attribute's type hint, every enum member included), and bad input gets
a SerializationError that says where, which rule, and what was probably meant."""

from __future__ import annotations

import dataclasses
import enum
import json
import types
import typing
from dataclasses import fields, replace

import pytest

import opgraph as og
from opgraph.core.attrs import attr_fields, decode_op, encode_attrs
from opgraph.core.op import OPS

from ..helpers import check_rule


def samples(hint) -> list:
    """Values of type `hint`, the first of them the plainest: every arm of a union, every member of
    an enum, tuples empty and not."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return [v for arm in args for v in ([None] if arm is type(None) else samples(arm))]
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            item = samples(args[0])
            return [(item[0],), (), tuple(item[:3]) if len(item) >= 3 else (item[-1], item[0])]
        parts = [samples(a) for a in args]
        return [tuple(p[0] for p in parts), tuple(p[-1] for p in parts)]
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return list(hint)
    if hint is bool:
        return [True, False]
    if hint is int:
        return [3, 0, -2]
    if hint is float:
        return [0.5, -2.0, 1e-30]
    if hint is str:
        return ["my_op", ""]
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):  # a structured attribute (a score modifier)
        hints = typing.get_type_hints(hint)
        made = [_made(lambda k=k: hint(**{f.name: samples(hints[f.name])[k] for f in fields(hint)})) for k in (0, -1)]
        return [m for m in made if m is not None]
    raise AssertionError(f"no sample values for attribute type {hint}: teach this test (and core.attrs) the type")


def _made(make):
    """make(), or None where the class refuses the values when made (a negative role count, a score
    modifier's reference out of range)."""
    try:
        return make()
    except (ValueError, og.GraphError):
        return None


def variants(cls) -> list:
    """An instance of `cls` with the first sample of every attribute, then one per other sample value
    (those the class accepts)."""
    hints = typing.get_type_hints(cls)
    values = {f.name: samples(hints[f.name]) for f in attr_fields(cls)}  # (init=False fields: the kind's)
    plain = cls(**{k: v[0] for k, v in values.items()})
    made = [_made(lambda k=k, v=v: replace(plain, **{k: v})) for k, vs in values.items() for v in vs[1:]]
    return [plain, *(m for m in made if m is not None)]


def assert_same(got, want, where="") -> None:
    """Equal, and of the same type all the way down (1 is not 1.0, True is not 1, a tuple not a list)."""
    assert type(got) is type(want), (where, got, want)
    if isinstance(want, tuple):
        assert len(got) == len(want), (where, got, want)
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{where}[{i}]")
    else:
        assert got == want, (where, got, want)


@pytest.mark.parametrize("kind", sorted(OPS))
def test_every_registered_ops_attributes_round_trip_through_json(kind):
    cls = OPS[kind]
    for op in variants(cls):
        text = json.dumps(encode_attrs(op), allow_nan=False)  # plain JSON: names for enums, lists for tuples
        back = decode_op(kind, json.loads(text), "ops[0]")
        assert type(back) is cls and back == op
        for f in fields(cls):
            assert_same(getattr(back, f.name), getattr(op, f.name), f"{kind}.{f.name}")


def test_enums_are_written_by_name():
    op = OPS["pointwise"](mode=og.PointwiseMode.RELU_FWD, axis=None)
    assert encode_attrs(op) == {"mode": "RELU_FWD", "axis": None}


def test_the_registry_covers_the_op_families():
    assert {"pointwise", "matmul", "conv_fprop", "reduction", "resample", "layernorm", "custom"} <= set(OPS)


def test_a_field_the_kind_fixes_is_not_an_attribute():
    """stop_gradient is a pointwise IDENTITY of its own kind: its mode is not written, nor read back."""
    op = OPS["stop_gradient"]()
    assert encode_attrs(op) == {} and op.mode is og.PointwiseMode.IDENTITY
    assert decode_op("stop_gradient", {}, "ops[0]") == op
    with pytest.raises(og.SerializationError, match="unknown attribute"):
        decode_op("stop_gradient", {"mode": "RELU_FWD"}, "ops[0]")


def refused(kind, attrs, rule: str, *texts: str) -> og.SerializationError:
    with pytest.raises(og.SerializationError) as err:
        decode_op(kind, attrs, "ops[2]")
    check_rule(err.value, rule)
    text = str(err.value)
    assert "ops[2]" in text
    for t in texts:
        assert t in text, text
    return err.value


def test_an_unknown_kind_suggests_the_close_one():
    err = refused("conv_fprob", {}, "json.op_kind", "unknown op kind 'conv_fprob'", "did you mean 'conv_fprop'")
    assert "custom" in err.hint and "--import" in err.hint


def test_attrs_must_be_an_object():
    refused("matmul", [], "json.attrs", "'attrs' must be an object")


def test_an_unknown_attribute_suggests_the_close_one():
    err = refused("conv_fprop", {"strides": [1, 1]}, "json.attrs", "['strides']", "did you mean 'stride'")
    assert "dilation" in err.hint  # what the op takes


def test_a_misspelled_enum_member_suggests_the_close_one():
    err = refused(
        "pointwise",
        {"mode": "RELU"},
        "json.attr_enum",
        "ops[2].attrs.mode",
        "'RELU' is not a PointwiseMode",
        "did you mean 'RELU_FWD'",
    )
    assert "ADD" in err.hint
    refused("pointwise", {"mode": 3}, "json.attr_enum", "3 is not a PointwiseMode")


@pytest.mark.parametrize(
    "kind,attrs,where,what",
    [
        ("transpose", {"permutation": "021"}, "ops[2].attrs.permutation", "expected a list"),
        ("transpose", {"permutation": [0, "1", 2]}, "ops[2].attrs.permutation[1]", "expected int, got '1'"),
        ("transpose", {"permutation": None}, "ops[2].attrs.permutation", "expected a list"),
        ("concatenate", {"num_inputs": 2, "axis": True}, "ops[2].attrs.axis", "expected int, got True"),
        ("concatenate", {"num_inputs": 2.0, "axis": 1}, "ops[2].attrs.num_inputs", "expected int, got 2.0"),
        ("slice", {"slices": [[0, 4]]}, "ops[2].attrs.slices[0]", "expected 3 items"),
        ("conv_fprop", {"stride": "2"}, "ops[2].attrs.stride", "fits none of"),
        (
            "resample",
            {"window": [2, 2], "stride": [2, 2], "generate_index": 1},
            "ops[2].attrs.generate_index",
            "expected bool",
        ),
        (
            "custom",
            {"op_name": "f", "num_inputs": 1, "num_outputs": 1, "params": [["k", [1]]]},
            "ops[2].attrs.params[0][1]",
            "fits none of",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) and v.startswith(("expected", "fits")) else None,
)
def test_a_value_of_the_wrong_type_is_refused_where_it_is(kind, attrs, where, what):
    refused(kind, attrs, "json.attr_type", f"{where}: ", what)


def test_a_missing_required_attribute_is_refused():
    refused("pointwise", {}, "json.attrs", "mode")
    refused("transpose", {}, "json.attrs", "permutation")


def test_a_union_keeps_each_values_own_type():
    params = [["n", 1], ["x", 1.0], ["on", True], ["name", "relu"]]
    op = decode_op("custom", {"op_name": "f", "num_inputs": 1, "num_outputs": 1, "params": params}, "w")
    assert_same(op.params, (("n", 1), ("x", 1.0), ("on", True), ("name", "relu")))


def test_a_dynamic_size_attribute_round_trips_as_its_text_and_dims():
    t = og.Dim("t", 1, 13)
    g = og.Graph("s", io_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[2, t + 3, 6], name="x")
    g.slice(x, [slice(None), slice(1, t + 2)]).set_output(True).set_name("inner")
    (node,) = g.final.nodes
    attrs = encode_attrs(node.op)
    assert attrs["slices"][1][1] == {"expr": "t + 2", "dims": [{"name": "t", "min": 1, "max": 13}]}
    assert decode_op("slice", json.loads(json.dumps(attrs)), "ops[0]") == node.op
    loaded = og.Graph.from_json(g.to_json())
    assert str(loaded.final.tensors[loaded.final.outputs[0]].dim[1]) == "t + 1"
    with pytest.raises(og.SerializationError):
        decode_op("slice", {"slices": [[1, {"expr": "t + (", "dims": [t.to_json()]}, 1]]}, "ops[0]")
