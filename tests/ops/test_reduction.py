"""reduction and genstats against PyTorch float64, and their validation rules."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph import DataType, ReductionMode
from opgraph.ops.reduction import GenStats, Reduction
from opgraph.core.tensor import channels_last_order, packed_strides
from opgraph.testing import compare, random_pack
from tests.helpers import raises_rule, run_reference

torch = pytest.importorskip("torch")

DTYPES = [DataType.FLOAT, DataType.HALF, DataType.BFLOAT16]
LAYOUTS = ["nchw", "nhwc"]


def strides(dim, layout):
    return packed_strides(dim, channels_last_order(len(dim))) if layout == "nhwc" else packed_strides(dim)


def t64(a):
    return torch.from_numpy(np.ascontiguousarray(np.asarray(a).astype(np.float64)))


def torch_reduce(mode, x, axes):
    """The reduction written with PyTorch (float64): the independent formula."""
    M = ReductionMode
    assert axes
    axes_l = list(axes)
    if mode is M.ADD:
        return torch.sum(x, dim=axes_l, keepdim=True)
    if mode in (M.MUL, M.MUL_NO_ZEROS):
        y = torch.where(x == 0, torch.ones_like(x), x) if mode is M.MUL_NO_ZEROS else x
        for a in axes:  # torch.prod takes one axis at a time
            y = torch.prod(y, dim=a, keepdim=True)
        return y
    if mode is M.MIN:
        return torch.amin(x, dim=axes_l, keepdim=True)
    if mode is M.MAX:
        return torch.amax(x, dim=axes_l, keepdim=True)
    if mode is M.AMAX:
        return torch.amax(x.abs(), dim=axes_l, keepdim=True)
    if mode is M.AVG:
        return torch.mean(x, dim=axes_l, keepdim=True)
    if mode is M.NORM1:
        return torch.linalg.vector_norm(x, ord=1, dim=axes_l, keepdim=True)
    if mode is M.NORM2:
        return torch.linalg.vector_norm(x, ord=2, dim=axes_l, keepdim=True)
    raise AssertionError(mode)


CASES = [  # (input dims, output dims)
    ((2, 3, 4, 5), (2, 1, 4, 1)),
    ((4, 6, 3), (1, 1, 1)),
    ((3, 1, 5, 2), (3, 1, 1, 2)),
    ((2, 3, 2, 3, 4), (1, 3, 1, 1, 1)),
]


def _graph(in_dim, out_dim, mode, dtype, layout="nchw"):
    g = og.Graph(io_data_type=dtype)
    x = g.tensor(dim=in_dim, stride=strides(in_dim, layout), name="x")
    y = g.reduction(x, mode, name="red")
    y.set_dim(out_dim).set_output(True).set_name("y")
    return g, x, y


def _check(g, pack, x, y, mode):
    final = g.final
    desc = final.tensors[y.uid]
    xin = t64(pack[x.uid])
    in_dim = final.tensors[x.uid].dim
    axes = tuple(a for a, (i, o) in enumerate(zip(in_dim, desc.dim)) if o == 1 and i != 1)
    want = torch_reduce(mode, xin, axes).numpy()
    assert want.shape == desc.dim
    mismatch = compare(desc, pack[y.uid], want)
    assert mismatch is None, str(mismatch)


@pytest.mark.parametrize("mode", list(ReductionMode), ids=lambda m: m.name)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[0])) + "-" + "x".join(map(str, c[1])))
def test_reduction_vs_torch(mode, dtype, case, rng):
    g, x, y = _graph(*case, mode, dtype)
    kw = {"low": 0.5, "high": 1.5} if mode in (ReductionMode.MUL, ReductionMode.MUL_NO_ZEROS) else {}
    pack, _ = run_reference(g, rng, **kw)
    assert g.final.tensors[y.uid].data_type is DataType.FLOAT  # the reduction default
    _check(g, pack, x, y, mode)


@pytest.mark.parametrize("mode", list(ReductionMode), ids=lambda m: m.name)
def test_reduction_nhwc_input(mode, rng):
    g, x, y = _graph((2, 3, 4, 5), (2, 3, 1, 1), mode, DataType.HALF, layout="nhwc")
    pack, _ = run_reference(g, rng, low=0.5, high=1.5)
    # a reduced output follows the input's axis order
    assert g.final.tensors[y.uid].stride == packed_strides((2, 3, 1, 1), channels_last_order(4))
    _check(g, pack, x, y, mode)


@pytest.mark.parametrize(
    "mode",
    [ReductionMode.MUL, ReductionMode.MUL_NO_ZEROS, ReductionMode.MIN, ReductionMode.AMAX, ReductionMode.NORM1],
    ids=lambda m: m.name,
)
def test_reduction_with_zeros_and_negatives(mode, rng):
    g, x, y = _graph((3, 8), (3, 1), mode, DataType.FLOAT)
    final = g.final
    pack = random_pack(final, rng, low=-1.5, high=1.5)
    xs = pack[x.uid]
    xs[0, ::2] = 0.0  # zeros in a row
    xs[1, :] = 0.0  # a row of zeros only: MUL_NO_ZEROS gives the empty product 1
    g.build(device="cpu").execute(pack)
    _check(g, pack, x, y, mode)
    if mode is ReductionMode.MUL_NO_ZEROS:
        assert pack[y.uid][1, 0] == 1.0
        assert pack[y.uid][0, 0] == pytest.approx(np.prod(xs[0, 1::2].astype(np.float64)), rel=1e-6)


def test_reduction_output_type_override_and_no_reduced_axes(rng):
    g = og.Graph(io_data_type=DataType.FLOAT)
    x = g.tensor(dim=[4, 5], name="x")
    y = g.reduction(x, ReductionMode.ADD).set_dim([4, 1]).set_output(True).set_data_type(DataType.HALF)
    z = g.reduction(x, "norm1").set_dim([4, 5]).set_output(True)  # nothing reduced: |x|
    pack, _ = run_reference(g, rng)
    assert g.final.tensors[y.uid].data_type is DataType.HALF
    xs = pack[x.uid].astype(np.float64)
    assert compare(g.final.tensors[y.uid], pack[y.uid], xs.sum(axis=1, keepdims=True)) is None
    np.testing.assert_array_equal(pack[z.uid], np.abs(pack[x.uid]))


def test_reduction_virtual_output_is_float_and_feeds_an_op(rng):
    g = og.Graph(io_data_type=DataType.HALF, intermediate_data_type=DataType.HALF)
    x = g.tensor(dim=[2, 6], name="x")
    s = g.reduction(x, ReductionMode.MAX).set_dim([2, 1])
    y = g.sub(x, s).set_output(True)
    pack, _ = run_reference(g, rng)
    assert g.final.tensors[s.uid].data_type is DataType.FLOAT
    xs = pack[x.uid].astype(np.float64)
    assert compare(g.final.tensors[y.uid], pack[y.uid], xs - xs.max(axis=1, keepdims=True)) is None


# -- genstats ---------------------------------------------------------------------------------------

GENSTATS_DIMS = [(2, 3, 4, 5), (6, 4), (2, 3, 2, 3, 4), (3, 5, 7)]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dim", GENSTATS_DIMS, ids=lambda d: "x".join(map(str, d)))
def test_genstats_vs_torch(dim, layout, dtype, rng):
    g = og.Graph(io_data_type=dtype)
    x = g.tensor(dim=dim, stride=strides(dim, layout), name="x")
    s, sq = g.genstats(x, name="stats")
    s.set_output(True)
    sq.set_output(True)
    pack, _ = run_reference(g, rng)
    final = g.final
    want_dim = (1, dim[1]) + (1,) * (len(dim) - 2)
    axes = [a for a in range(len(dim)) if a != 1]
    xin = t64(pack[x.uid])
    for t, want in ((s, torch.sum(xin, dim=axes, keepdim=True)), (sq, torch.sum(xin * xin, dim=axes, keepdim=True))):
        desc = final.tensors[t.uid]
        assert desc.dim == want_dim and desc.data_type is DataType.FLOAT
        mismatch = compare(desc, pack[t.uid], want.numpy())
        assert mismatch is None, str(mismatch)


def test_genstats_returns_a_list_of_two():
    g = og.Graph()
    x = g.tensor(dim=[2, 3, 4, 4], name="x")
    out = g.genstats(x)
    assert isinstance(out, list) and len(out) == 2


# -- validation rules ---------------------------------------------------------------------------------


def test_rule_reduction_rank():
    g = og.Graph()
    x = g.tensor(dim=[2, 3, 4], name="x")
    g.reduction(x, ReductionMode.ADD).set_dim([2, 1]).set_output(True).set_name("y")
    raises_rule(g, og.ShapeError, "reduction.rank", "y")


def test_rule_reduction_dims():
    g = og.Graph()
    x = g.tensor(dim=[2, 3, 4], name="x")
    g.reduction(x, ReductionMode.ADD).set_dim([2, 2, 1]).set_output(True).set_name("y")
    err = raises_rule(g, og.ShapeError, "reduction.dims", "y")
    assert "axis 1" in err.detail


@pytest.mark.parametrize("mode", ["SUM", 3, og.PointwiseMode.ADD])
def test_rule_reduction_mode(mode):
    g = og.Graph()
    x = g.tensor(dim=[2, 3], name="x")
    with pytest.raises(og.AttributeValueError) as info:
        g.reduction(x, mode, name="red")
    err = info.value
    assert err.rule == "reduction.mode" and "'red'" in str(err) and "NORM2" in err.hint


def test_rule_reduction_needs_output_dims():
    g = og.Graph()
    x = g.tensor(dim=[2, 3, 4], name="x")
    g.reduction(x, ReductionMode.ADD).set_output(True).set_name("y")
    err = raises_rule(g, og.ShapeError, "infer.dims_unknown", "y")
    assert "set_dim" in err.hint


def test_rule_genstats_rank():
    g = og.Graph()
    x = g.tensor(dim=[8], name="x")
    s, sq = g.genstats(x)
    s.set_output(True)
    sq.set_output(True)
    raises_rule(g, og.ShapeError, "genstats.rank", "x")


def test_reduction_json_round_trip():
    g = og.Graph(io_data_type=DataType.HALF)
    x = g.tensor(dim=[2, 3, 4, 5], name="x")
    g.reduction(x, ReductionMode.NORM2).set_dim([2, 1, 1, 5]).set_output(True)
    s, sq = g.genstats(x)
    s.set_output(True)
    sq.set_output(True)
    g2 = og.Graph.from_json(g.to_json())
    assert g2.key() == g.key()
    kinds = [n.op for n in g2.final.nodes]
    assert isinstance(kinds[0], Reduction) and kinds[0].mode is ReductionMode.NORM2
    assert isinstance(kinds[1], GenStats)
