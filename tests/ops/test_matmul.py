"""matmul against torch.matmul (float64, broadcast batch axes, any operand strides), INT8 -> INT32
exactly, and its validation rules."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph import DataType
from opgraph.core.tensor import packed_strides
from opgraph.testing import compare, random_pack
from tests.helpers import check_rule, raises_rule, run_reference

torch = pytest.importorskip("torch")

DTYPES = [DataType.FLOAT, DataType.HALF, DataType.BFLOAT16]


def strides(dim, layout):
    """row: row-major; col: the last two axes swapped in memory (a transposed operand); gapped:
    row-major rows padded by 3 elements and batches by 5."""
    rank = len(dim)
    if layout == "col":
        return packed_strides(dim, [*range(rank - 2), rank - 1, rank - 2])
    if layout == "gapped":
        out = [0] * rank
        out[-1] = 1
        out[-2] = dim[-1] + 3
        step = out[-2] * dim[-2] + 5
        for a in reversed(range(rank - 2)):
            out[a] = step
            step *= dim[a]
        return tuple(out)
    return packed_strides(dim)


def t64(a):
    return torch.from_numpy(np.ascontiguousarray(np.asarray(a).astype(np.float64)))


SHAPES = [  # A dims, B dims
    ((5, 7), (7, 3)),
    ((3, 4, 5), (3, 5, 6)),
    ((2, 1, 4, 5), (1, 3, 5, 6)),
    ((1, 6, 16), (4, 16, 2)),
    ((1, 1), (1, 9)),
]


def _graph(a_dim, b_dim, dtype, a_layout="row", b_layout="row"):
    g = og.Graph(io_data_type=dtype)
    a = g.tensor(dim=a_dim, stride=strides(a_dim, a_layout), name="A")
    b = g.tensor(dim=b_dim, stride=strides(b_dim, b_layout), name="B")
    c = g.matmul(a, b, name="mm").set_output(True).set_name("C")
    return g, a, b, c


def _check(g, pack, a, b, c):
    desc = g.final.tensors[c.uid]
    want = torch.matmul(t64(pack[a.uid]), t64(pack[b.uid])).numpy()
    assert desc.dim == want.shape
    mismatch = compare(desc, pack[c.uid], want)
    assert mismatch is None, str(mismatch)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("shapes", SHAPES, ids=lambda s: f"{s[0]}@{s[1]}")
def test_matmul_vs_torch(shapes, dtype, rng):
    g, a, b, c = _graph(*shapes, dtype)
    pack, _ = run_reference(g, rng)
    desc = g.final.tensors[c.uid]
    assert desc.data_type is dtype  # the io type: the core default
    assert desc.stride == packed_strides(desc.dim)
    _check(g, pack, a, b, c)


@pytest.mark.parametrize("a_layout", ["row", "col", "gapped"])
@pytest.mark.parametrize("b_layout", ["row", "col", "gapped"])
@pytest.mark.parametrize("shapes", [SHAPES[1], SHAPES[2]], ids=lambda s: f"{s[0]}@{s[1]}")
def test_matmul_operand_strides(shapes, a_layout, b_layout, rng):
    g, a, b, c = _graph(*shapes, DataType.HALF, a_layout, b_layout)
    pack, _ = run_reference(g, rng)
    assert g.final.tensors[c.uid].stride == packed_strides(g.final.tensors[c.uid].dim)  # C is row-major
    _check(g, pack, a, b, c)


@pytest.mark.parametrize("layouts", [("row", "row"), ("col", "gapped"), ("gapped", "col")])
@pytest.mark.parametrize(
    "shapes", [((6, 300), (300, 5)), ((2, 1, 3, 512), (1, 2, 512, 4))], ids=lambda s: f"{s[0]}@{s[1]}"
)
def test_matmul_int8_to_int32_exact(shapes, layouts, rng):
    g = og.Graph(io_data_type=DataType.INT8)
    a = g.tensor(dim=shapes[0], stride=strides(shapes[0], layouts[0]), name="A")
    b = g.tensor(dim=shapes[1], stride=strides(shapes[1], layouts[1]), name="B")
    c = g.matmul(a, b, compute_data_type=DataType.INT32).set_output(True).set_data_type(DataType.INT32)
    final = g.final
    pack = random_pack(final, rng)
    # full int8 range, so sums leave the int16 range and must be accumulated exactly
    pack[a.uid][...] = rng.integers(-128, 128, size=shapes[0])
    pack[b.uid][...] = rng.integers(-128, 128, size=shapes[1])
    g.build(device="cpu").execute(pack)
    want = torch.matmul(
        torch.from_numpy(np.asarray(pack[a.uid], np.int64)), torch.from_numpy(np.asarray(pack[b.uid], np.int64))
    ).numpy()
    assert np.abs(want).max() > 2**15
    assert pack[c.uid].dtype == np.int32
    np.testing.assert_array_equal(pack[c.uid], want)


def test_matmul_virtual_output_feeds_pointwise(rng):
    """C virtual (intermediate type) into a bias: the usual GEMM + epilogue."""
    g = og.Graph(io_data_type=DataType.HALF, intermediate_data_type=DataType.FLOAT)
    a = g.tensor(dim=[2, 4, 8], name="A")
    b = g.tensor(dim=[1, 8, 3], name="B")
    bias = g.tensor(dim=[1, 1, 3], name="bias")
    c = g.matmul(a, b)
    y = g.add(c, bias).set_output(True)
    pack, _ = run_reference(g, rng)
    assert g.final.tensors[c.uid].data_type is DataType.FLOAT
    want = (torch.matmul(t64(pack[a.uid]), t64(pack[b.uid])) + t64(pack[bias.uid])).numpy()
    assert compare(g.final.tensors[y.uid], pack[y.uid], want) is None


def test_matmul_json_round_trip():
    g, *_ = _graph((2, 1, 4, 5), (1, 3, 5, 6), DataType.BFLOAT16, "col", "gapped")
    g2 = og.Graph.from_json(g.to_json())
    assert g2.key() == g.key()


# -- validation rules ---------------------------------------------------------------------------------


def _bad(a_dim, b_dim, a_type=DataType.FLOAT, b_type=DataType.FLOAT):
    g = og.Graph(io_data_type=DataType.FLOAT)
    a = g.tensor(dim=a_dim, data_type=a_type, name="A")
    b = g.tensor(dim=b_dim, data_type=b_type, name="B")
    g.matmul(a, b).set_output(True)
    return g


@pytest.mark.parametrize("dims, culprit", [(((5,), (5, 3)), "A"), (((4, 5), (5,)), "B")])
def test_rule_matmul_rank(dims, culprit):
    raises_rule(_bad(*dims), og.ShapeError, "matmul.rank", culprit)


def test_rule_matmul_batch_rank():
    raises_rule(_bad((2, 4, 5), (5, 3)), og.ShapeError, "matmul.batch_rank", "B")


def test_rule_matmul_k():
    err = raises_rule(_bad((4, 5), (6, 3)), og.ShapeError, "matmul.k", "B")
    assert "K = 5" in err.detail and "K = 6" in err.detail


def test_rule_matmul_batch():
    err = raises_rule(_bad((2, 4, 5), (3, 5, 3)), og.ShapeError, "matmul.batch", "B")
    assert "2 vs 3" in err.detail


@pytest.mark.parametrize(
    "types, culprit", [((DataType.BOOLEAN, DataType.FLOAT), "A"), ((DataType.HALF, DataType.BOOLEAN), "B")]
)
def test_rule_matmul_bool(types, culprit):
    raises_rule(_bad((4, 5), (5, 3), *types), og.DataTypeError, "matmul.bool", culprit)


@pytest.mark.parametrize("types", [(DataType.INT8, DataType.HALF), (DataType.FLOAT, DataType.INT32)])
def test_rule_matmul_dtype_mix(types):
    raises_rule(_bad((4, 5), (5, 3), *types), og.DataTypeError, "matmul.dtype_mix", "B")


@pytest.mark.parametrize("padding", [1.5, float("nan"), "0"])
def test_rule_matmul_padding(padding):
    g = og.Graph()
    a = g.tensor(dim=[4, 5], name="A")
    b = g.tensor(dim=[5, 3], name="B")
    with pytest.raises(og.AttributeValueError) as info:
        g.matmul(a, b, padding=padding, name="mm")
    check_rule(info.value, "matmul.padding", "mm")


def test_matmul_padding_zero_is_accepted():
    g = og.Graph()
    a = g.tensor(dim=[4, 5], name="A")
    b = g.tensor(dim=[5, 3], name="B")
    c = g.matmul(a, b, None, 0.0, "mm").set_output(True)
    assert g.final.tensors[c.uid].dim == (4, 3)


def test_matmul_mixed_float_types(rng):
    g = _bad((3, 4), (4, 2), DataType.HALF, DataType.BFLOAT16)
    final = g.final
    pack, _ = run_reference(g, rng)
    a, b = (final.tensor(n).uid for n in ("A", "B"))
    c = final.outputs[0]
    want = np.matmul(pack[a].astype(np.float64), pack[b].astype(np.float64))
    assert compare(final.tensors[c], pack[c], want) is None
