"""reshape, transpose, slice, concatenate against PyTorch, their layouts and validation rules, and a
JSON round trip."""

from __future__ import annotations

import json

import numpy as np
import pytest

import opgraph as og
from opgraph import DataType
from opgraph.ops.layout import Concatenate, Reshape, Slice, Transpose
from opgraph.core.tensor import channels_last_order, packed_strides, storage_extent, stride_order
from tests.helpers import check_rule, raises_rule, run_reference

torch = pytest.importorskip("torch")

DTYPES = [DataType.FLOAT, DataType.HALF, DataType.BFLOAT16]


def strides(dim, layout):
    if layout == "nhwc":
        return packed_strides(dim, channels_last_order(len(dim)))
    if layout == "gapped":  # row-major with a gap after every innermost row
        out, step = [0] * len(dim), 1
        for a in reversed(range(len(dim))):
            out[a] = step
            step *= dim[a] + (2 if a == len(dim) - 1 else 0)
        return tuple(out)
    return packed_strides(dim)


def t64(a):
    return torch.from_numpy(np.ascontiguousarray(np.asarray(a).astype(np.float64)))


def assert_exact(got, want):
    """Layout ops move data: the result is bit-exact (compared as float64, NaN-free inputs)."""
    want = np.asarray(want)
    assert got.shape == want.shape
    np.testing.assert_array_equal(np.asarray(got).astype(np.float64), want.astype(np.float64))


def _graph(dims, layout, dtype):
    g = og.Graph(io_data_type=dtype)
    x = g.tensor(dim=dims, stride=strides(dims, layout), name="x")
    return g, x


# -- reshape --------------------------------------------------------------------------------------------

RESHAPES = [
    ((2, 3, 4), (6, 4)),
    ((2, 3, 4, 5), (2, 60)),
    ((24,), (2, 3, 4)),
    ((2, 3, 4, 5), (5, -1, 3)),
    ((1, 6, 1), (3, 2)),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("layout", ["nchw", "nhwc", "gapped"])
@pytest.mark.parametrize("case", RESHAPES, ids=lambda c: f"{c[0]}->{c[1]}")
def test_reshape_vs_torch(case, layout, dtype, rng):
    src, dst = case
    g, x = _graph(src, layout, dtype)
    y = g.reshape(x, dst, name="r").set_output(True)
    pack, _ = run_reference(g, rng)
    desc = g.final.tensors[y.uid]
    want = t64(pack[x.uid]).reshape(dst)
    assert desc.dim == tuple(want.shape) and desc.data_type is dtype
    assert desc.stride == packed_strides(desc.dim)  # packed row-major
    assert_exact(pack[y.uid], want.numpy())


def test_reshape_dims_from_set_dim(rng):
    """cuDNN's way: no dims in the call, set_dim on the output."""
    g, x = _graph((2, 3, 4), "nhwc", DataType.HALF)
    y = g.reshape(x).set_dim([4, 6]).set_output(True)
    pack, _ = run_reference(g, rng)
    assert_exact(pack[y.uid], t64(pack[x.uid]).reshape(4, 6).numpy())


def test_layout_ops_keep_the_input_type():
    g = og.Graph(io_data_type=DataType.HALF, intermediate_data_type=DataType.FLOAT)
    x = g.tensor(dim=[2, 3, 4], data_type=DataType.BFLOAT16, name="x")
    r = g.reshape(x, [6, 4])  # virtual: still bf16, not the intermediate type
    t = g.transpose(r, [1, 0]).set_output(True)  # output: bf16, not the io type
    s = g.slice(x, [slice(0, 1)]).set_output(True)
    c = g.concatenate([x, x], axis=0).set_output(True)
    final = g.final
    for h in (r, t, s, c):
        assert final.tensors[h.uid].data_type is DataType.BFLOAT16
    for cls in (Reshape, Transpose, Slice, Concatenate):
        assert cls.MOVES_DATA_ONLY


# -- transpose -----------------------------------------------------------------------------------------

TRANSPOSES = [
    ((2, 3, 4, 5), (0, 2, 3, 1)),
    ((2, 3, 4, 5), (0, 3, 1, 2)),
    ((3, 4), (1, 0)),
    ((2, 3, 4), (2, 0, 1)),
    ((2, 1, 3, 1, 4), (4, 3, 2, 1, 0)),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("layout", ["nchw", "nhwc", "gapped"])
@pytest.mark.parametrize("case", TRANSPOSES, ids=lambda c: f"{c[0]}-{c[1]}")
def test_transpose_vs_torch(case, layout, dtype, rng):
    dims, perm = case
    g, x = _graph(dims, layout, dtype)
    y = g.transpose(x, perm).set_output(True)
    pack, _ = run_reference(g, rng)
    final = g.final
    desc = final.tensors[y.uid]
    assert_exact(pack[y.uid], t64(pack[x.uid]).permute(*perm).numpy())
    xs = final.tensors[x.uid].stride
    # packed, with the non-unit axes in the memory order their input axes had
    nonunit = [a for a in range(len(perm)) if desc.dim[a] > 1]
    assert sorted(nonunit, key=lambda a: -xs[perm[a]]) == sorted(nonunit, key=lambda a: -desc.stride[a])
    assert storage_extent(desc.dim, desc.stride) == desc.numel
    if layout != "gapped":  # a packed input: the output strides are the input's, permuted
        assert all(desc.stride[k] == xs[p] for k, p in enumerate(perm) if desc.dim[k] > 1), (desc.stride, xs)


def test_transpose_nchw_to_nhwc_is_a_view_of_the_same_memory_order():
    g, x = _graph((2, 3, 4, 5), "nhwc", DataType.HALF)
    y = g.transpose(x, [0, 2, 3, 1]).set_output(True)  # logical NHWC of NHWC memory: row-major
    z = g.transpose(x, [0, 2, 3, 1]).set_output(True).set_stride([60, 15, 1, 5])  # explicit: a real move
    final = g.final
    assert final.tensors[y.uid].stride == packed_strides((2, 4, 5, 3))
    assert final.tensors[z.uid].stride == (60, 15, 1, 5)


# -- slice ------------------------------------------------------------------------------------------------

SLICES = [
    ((2, 3, 4, 5), (slice(None), slice(1, 3))),
    ((2, 3, 4, 5), (slice(None), slice(None), slice(-3, None, 2), slice(0, 100))),
    ((6, 7), (slice(-5, -1), slice(None, None, 3))),
    ((2, 3, 4, 5), (slice(1, 2), slice(0, 3, 2), slice(3, None), slice(-100, 2))),
    ((9,), (slice(2, 8, 4),)),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("case", SLICES, ids=lambda c: f"{c[0]}-{c[1]}")
def test_slice_vs_torch(case, layout, dtype, rng):
    dims, slices = case
    g, x = _graph(dims, layout, dtype)
    y = g.slice(x, list(slices), name="s").set_output(True)
    pack, _ = run_reference(g, rng)
    desc = g.final.tensors[y.uid]
    want = t64(pack[x.uid])[slices].numpy()
    assert desc.dim == want.shape
    assert desc.stride == strides(desc.dim, layout)  # packed, in the input's axis order
    assert_exact(pack[y.uid], want)


def test_slice_attribute_is_int_triples_normalised_at_inference():
    g, x = _graph((4, 6), "nchw", DataType.FLOAT)
    y = g.slice(x, [slice(-3, None), slice(None, -2, 2)]).set_output(True)
    node = g.final.nodes[0]
    assert all(isinstance(v, int) for t in node.op.slices for v in t)
    assert node.op.bounds(None, (4, 6)) == ((1, 4, 1), (0, 4, 2))
    assert g.final.tensors[y.uid].dim == (3, 2)
    x.set_dim([5, 8])  # the attribute follows the input's new dims
    assert g.final.tensors[y.uid].dim == (3, 3)


# -- concatenate ---------------------------------------------------------------------------------------

CONCATS = [
    ([(2, 3, 4), (2, 5, 4)], 1),
    ([(2, 3, 4), (2, 3, 1), (2, 3, 2)], -1),
    ([(1, 3, 2, 2), (4, 3, 2, 2)], 0),
    ([(2, 3, 4, 5)], 2),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("case", CONCATS, ids=lambda c: f"{len(c[0])}in-axis{c[1]}")
def test_concatenate_vs_torch(case, layout, dtype, rng):
    shapes, axis = case
    g = og.Graph(io_data_type=dtype)
    xs = [g.tensor(dim=s, stride=strides(s, layout), name=f"x{i}") for i, s in enumerate(shapes)]
    y = g.concatenate(xs, axis, name="cat").set_output(True)
    pack, _ = run_reference(g, rng)
    desc = g.final.tensors[y.uid]
    want = torch.cat([t64(pack[x.uid]) for x in xs], dim=axis).numpy()
    assert desc.dim == want.shape and desc.data_type is dtype
    assert desc.stride == strides(desc.dim, layout)  # the first input's axis order
    assert_exact(pack[y.uid], want)


def test_concatenate_in_place_index_keeps_values(rng):
    g = og.Graph(io_data_type=DataType.FLOAT)
    a = g.tensor(dim=[2, 3], name="a")
    b = g.tensor(dim=[2, 4], name="b")
    y = g.concatenate([a, b], axis=1, in_place_index=0).set_output(True)
    pack, _ = run_reference(g, rng)
    assert_exact(pack[y.uid], np.concatenate([pack[a.uid], pack[b.uid]], axis=1))
    assert g.final.nodes[0].op.in_place_index == 0
    assert g.final.nodes[0].op.input_roles() == ("input0", "input1")


def test_layout_chain_runs_end_to_end(rng):
    """reshape -> transpose -> slice -> concatenate -> relu, virtual in between."""
    g = og.Graph(io_data_type=DataType.HALF, intermediate_data_type=DataType.HALF)
    x = g.tensor(dim=[2, 12], name="x")
    r = g.reshape(x, [2, 3, 4])
    t = g.transpose(r, [0, 2, 1])
    s = g.slice(t, [slice(None), slice(1, 3)])
    c = g.concatenate([s, t], axis=1)
    y = g.relu(c).set_output(True)
    pack, _ = run_reference(g, rng)
    tx = t64(pack[x.uid]).reshape(2, 3, 4).permute(0, 2, 1)
    want = torch.relu(torch.cat([tx[:, 1:3], tx], dim=1)).numpy()
    assert_exact(pack[y.uid], want)


def test_json_round_trip_with_slice_and_concatenate():
    g = og.Graph(io_data_type=DataType.HALF)
    x = g.tensor(dim=[2, 3, 4, 5], name="x")
    w = g.tensor(dim=[2, 3, 2, 5], name="w")
    s = g.slice(x, [slice(None), slice(None), slice(-2, None)])
    c = g.concatenate([s, w, s], axis=2, in_place_index=1)
    t = g.transpose(c, [0, 2, 3, 1])
    g.reshape(t, [2, -1]).set_output(True)
    text = g.to_json()
    g2 = og.Graph.from_json(text)
    assert g2.key() == g.key()
    assert json.loads(g2.to_json()) == json.loads(text)
    ops = [n.op for n in g2.final.nodes]
    assert ops == [n.op for n in g.final.nodes]
    assert isinstance(ops[0], Slice) and ops[0].slices == ((0, 2**63 - 1, 1), (0, 2**63 - 1, 1), (-2, 2**63 - 1, 1))
    assert isinstance(ops[1], Concatenate) and ops[1].num_inputs == 3 and ops[1].in_place_index == 1


# -- validation rules ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dim", [[2, 0, 3], [-1, -1], [-2, 12], []])
def test_rule_reshape_dim(dim):
    g, x = _graph((4, 6), "nchw", DataType.FLOAT)
    g.reshape(x, dim).set_output(True)
    raises_rule(g, og.AttributeValueError, "reshape.dim", "x")


def test_rule_reshape_dim_type():
    g, x = _graph((4, 6), "nchw", DataType.FLOAT)
    with pytest.raises(og.AttributeValueError) as info:
        g.reshape(x, [2.0, 12], name="r")
    check_rule(info.value, "reshape.dim", "r")


def test_rule_reshape_numel():
    g, x = _graph((4, 6), "nchw", DataType.FLOAT)
    g.reshape(x).set_dim([5, 5]).set_output(True).set_name("y")
    raises_rule(g, og.ShapeError, "reshape.numel", "y")


def test_rule_reshape_numel_inferred_axis():
    g, x = _graph((4, 6), "nchw", DataType.FLOAT)
    g.reshape(x, [5, -1]).set_output(True)
    raises_rule(g, og.ShapeError, "reshape.numel", "x")


def test_rule_reshape_needs_dims():
    g, x = _graph((4, 6), "nchw", DataType.FLOAT)
    g.reshape(x).set_output(True).set_name("y")
    raises_rule(g, og.ShapeError, "infer.dims_unknown", "y")


@pytest.mark.parametrize("perm", [[0, 1], [0, 0, 1], [0, 1, 3]])
def test_rule_transpose_permutation(perm):
    g, x = _graph((2, 3, 4), "nchw", DataType.FLOAT)
    g.transpose(x, perm).set_output(True)
    raises_rule(g, og.AttributeValueError, "transpose.permutation", "x")


@pytest.mark.parametrize("bad", [3, slice(0.5, 2), slice("a", None)])
def test_rule_slice_type(bad):
    g, x = _graph((4, 6), "nchw", DataType.FLOAT)
    with pytest.raises(og.AttributeValueError) as info:
        g.slice(x, [slice(None), bad], name="s")
    check_rule(info.value, "slice.type", "s")


def test_rule_slice_rank():
    g, x = _graph((4, 6), "nchw", DataType.FLOAT)
    g.slice(x, [slice(None)] * 3).set_output(True)
    raises_rule(g, og.ShapeError, "slice.rank", "x")


@pytest.mark.parametrize("step", [0, -1])
def test_rule_slice_step(step):
    g, x = _graph((4, 6), "nchw", DataType.FLOAT)
    g.slice(x, [slice(None), slice(None, None, step)]).set_output(True)
    raises_rule(g, og.AttributeValueError, "slice.step", "x")


@pytest.mark.parametrize("s", [slice(3, 3), slice(5, 2), slice(6, None), slice(-100, -50)])
def test_rule_slice_empty(s):
    g, x = _graph((4, 6), "nchw", DataType.FLOAT)
    g.slice(x, [slice(None), s]).set_output(True)
    raises_rule(g, og.ShapeError, "slice.empty", "x")


@pytest.mark.parametrize("inputs", [[], "x", None])
def test_rule_concatenate_count(inputs):
    g, x = _graph((4, 6), "nchw", DataType.FLOAT)
    with pytest.raises(og.AttributeValueError) as info:
        g.concatenate(x if inputs == "x" else inputs, 0, name="cat")
    check_rule(info.value, "concatenate.count", "cat")


@pytest.mark.parametrize("axis", [2, -3])
def test_rule_concatenate_axis(axis):
    g, x = _graph((4, 6), "nchw", DataType.FLOAT)
    g.concatenate([x, x], axis).set_output(True)
    raises_rule(g, og.AttributeValueError, "concatenate.axis", "x")


def test_rule_concatenate_rank():
    g, x = _graph((4, 6), "nchw", DataType.FLOAT)
    z = g.tensor(dim=[4, 6, 1], name="z")
    g.concatenate([x, z], 0).set_output(True)
    raises_rule(g, og.ShapeError, "concatenate.rank", "z")


def test_rule_concatenate_dims():
    g, x = _graph((4, 6), "nchw", DataType.FLOAT)
    z = g.tensor(dim=[4, 5], name="z")
    err = raises_rule(g.concatenate([x, z], 0).set_output(True).graph, og.ShapeError, "concatenate.dims", "z")
    assert "axis 1" in err.detail


def test_rule_concatenate_data_type():
    g, x = _graph((4, 6), "nchw", DataType.FLOAT)
    z = g.tensor(dim=[4, 6], data_type=DataType.HALF, name="z")
    g.concatenate([x, z], 0).set_output(True)
    raises_rule(g, og.DataTypeError, "concatenate.data_type", "z")


@pytest.mark.parametrize("index", [2, -1])
def test_rule_concatenate_in_place_index(index):
    g, x = _graph((4, 6), "nchw", DataType.FLOAT)
    z = g.tensor(dim=[4, 6], name="z")
    g.concatenate([x, z], 0, in_place_index=index).set_output(True)
    raises_rule(g, og.AttributeValueError, "concatenate.in_place_index", "x")


# -- slice_backward ------------------------------------------------------------------------------------------


def _slice_backward(dy_dims, in_dim, slices, dy_stride=None):
    from opgraph.ops.layout import SliceBackward

    g = og.Graph("sb", io_data_type=DataType.FLOAT)
    dy = g.tensor(dim=list(dy_dims), stride=dy_stride, name="dy")
    (dx,) = g._add_op(SliceBackward(in_dim=tuple(in_dim), slices=tuple(slices)), [dy], name="dslice")
    return g, dy, dx.set_output(True).set_name("dx")


@pytest.mark.parametrize("engine", ["reference", "torch"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_slice_backward_scatters_dy_into_zeros_like_torch_autograd(engine, layout, rng):
    in_dim, bounds = (2, 4, 7, 6), ((0, 2, 1), (1, 4, 2), (2, 7, 3), (0, 5, 1))
    dy_dims = tuple(len(range(*b)) for b in bounds)
    g, dy, dx = _slice_backward(dy_dims, in_dim, bounds, strides(dy_dims, layout))
    plan = g.build(device="cpu", engines=[engine])
    pack = og.testing.random_pack(plan.graph, rng)
    pack[dx.uid][...] = np.nan
    plan.execute(pack)
    x = torch.zeros(in_dim, dtype=torch.float64, requires_grad=True)
    view = x[tuple(slice(*b) for b in bounds)]
    (want,) = torch.autograd.grad(view, x, torch.tensor(pack[dy.uid].astype(np.float64)))
    np.testing.assert_array_equal(pack[dx.uid], want.numpy())
    assert stride_order(g.final.tensors[dx.uid].stride) == stride_order(g.final.tensors[dy.uid].stride)


@pytest.mark.parametrize(
    "dy_dims,in_dim,slices,rule",
    [
        ((2, 3), (4, 6), ((1, 3, 1),), "slice_backward.rank"),
        ((2, 3), (4, 6), ((1, 3, 1), (0, 6, 0)), "slice_backward.bounds"),
        ((2, 3), (4, 6), ((1, 3, 1), (-6, 6, 2)), "slice_backward.bounds"),  # not normalised
        ((2, 2), (4, 6), ((1, 3, 1), (0, 6, 2)), "slice_backward.dims"),
    ],
)
def test_slice_backward_rules(dy_dims, in_dim, slices, rule):
    g, _, _ = _slice_backward(dy_dims, in_dim, slices)
    raises_rule(g, og.ShapeError if rule.endswith("dims") else og.AttributeValueError, rule, "dy")


def test_slice_backward_round_trips_through_json():
    g, _, _ = _slice_backward((2, 3), (4, 6), ((1, 3, 1), (0, 6, 2)))
    assert og.Graph.from_json(g.to_json()).key() == g.key()
