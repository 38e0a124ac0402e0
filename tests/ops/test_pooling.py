"""resample (max / average pooling, max index) against PyTorch float64, and its validation rules."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph import DataType, ResampleMode
from opgraph.ops.pooling import Resample
from opgraph.core.tensor import channels_last_order, packed_strides
from opgraph.testing import compare
from tests.helpers import check_rule, raises_rule, run_reference

torch = pytest.importorskip("torch")
F = torch.nn.functional

DTYPES = [DataType.FLOAT, DataType.HALF, DataType.BFLOAT16]
MODES = [ResampleMode.MAX, ResampleMode.AVG_INCLUDE_PADDING, ResampleMode.AVG_EXCLUDE_PADDING]


def strides(dim, layout):
    return packed_strides(dim, channels_last_order(len(dim))) if layout == "nhwc" else packed_strides(dim)


def t64(a):
    return torch.from_numpy(np.ascontiguousarray(np.asarray(a).astype(np.float64)))


def torch_pads(pre, post):
    """F.pad's order: last axis first, (before, after) per axis."""
    out = []
    for a in reversed(range(len(pre))):
        out += [pre[a], post[a]]
    return out


def to_window_index(idx, in_sp, stride, window, offset):
    """PyTorch's max-pool index (flat over the pooled input plane) -> opgraph's (flat within the window).
    `offset` is the padding PyTorch's coordinates leave out (its own `padding`; 0 after F.pad)."""
    nsp = len(in_sp)
    coords = np.unravel_index(idx, in_sp)
    k = []
    for a in range(nsp):
        shape = [1] * idx.ndim
        shape[2 + a] = idx.shape[2 + a]
        o = np.arange(idx.shape[2 + a]).reshape(shape)
        k.append(coords[a] + offset[a] - o * stride[a])
    for a in range(nsp):
        assert ((k[a] >= 0) & (k[a] < window[a])).all()
    return np.ravel_multi_index(k, window)


def torch_pool(mode, x, window, stride, pre, post):
    """Y (and PyTorch's index converted to opgraph's convention, for MAX) in float64."""
    nsp = x.dim() - 2
    maxpool = getattr(F, f"max_pool{nsp}d")
    avgpool = getattr(F, f"avg_pool{nsp}d")
    symmetric = pre == post and all(2 * p <= w for p, w in zip(pre, window))
    if symmetric:  # PyTorch's own padding
        if mode is ResampleMode.MAX:
            y, idx = maxpool(x, window, stride, pre, return_indices=True)
            return y, to_window_index(idx.numpy(), tuple(x.shape[2:]), stride, window, pre)
        include = mode is ResampleMode.AVG_INCLUDE_PADDING
        return avgpool(x, window, stride, pre, count_include_pad=include), None
    pads = torch_pads(pre, post)
    if mode is ResampleMode.MAX:
        xp = F.pad(x, pads, value=-float("inf"))
        y, idx = maxpool(xp, window, stride, return_indices=True)
        return y, to_window_index(idx.numpy(), tuple(xp.shape[2:]), stride, window, (0,) * nsp)
    xp = F.pad(x, pads, value=0.0)
    mean = avgpool(xp, window, stride)
    if mode is ResampleMode.AVG_INCLUDE_PADDING:
        return mean, None
    coverage = avgpool(F.pad(torch.ones_like(x), pads, value=0.0), window, stride)
    return mean / coverage, None


CASES = [  # input dims, window, stride, pre, post
    ((2, 3, 9), (3,), (2,), (1,), (1,)),
    ((2, 3, 7, 6), (3, 2), (2, 1), (1, 1), (1, 1)),
    ((1, 2, 8, 8), (2, 2), (2, 2), (0, 0), (0, 0)),
    ((1, 2, 5, 6, 4), (2, 3, 2), (1, 2, 2), (1, 1, 0), (1, 1, 0)),
    # asymmetric padding, and padding above PyTorch's window // 2 (opgraph allows < window)
    ((2, 3, 7, 6), (3, 3), (2, 2), (2, 0), (0, 1)),
    ((1, 2, 10), (4,), (3,), (3,), (2,)),
    ((1, 2, 4, 5, 6), (2, 3, 3), (2, 1, 2), (0, 2, 1), (1, 0, 2)),
]


def _ids(case):
    dims, w, s, pre, post = case

    def j(v):
        return "".join(map(str, v))

    return f"{'x'.join(map(str, dims))}-w{j(w)}-s{j(s)}-p{j(pre)}_{j(post)}"


def _run_case(case, mode, dtype, layout, rng):
    dims, window, stride, pre, post = case
    g = og.Graph(io_data_type=dtype)
    x = g.tensor(dim=dims, stride=strides(dims, layout), name="x")
    y, index = g.resample(
        x,
        mode=mode,
        window=window,
        stride=stride,
        pre_padding=pre,
        post_padding=post,
        generate_index=mode is ResampleMode.MAX,
        name="pool",
    )
    y.set_output(True).set_name("y")
    if index is not None:
        index.set_output(True).set_name("index")
    else:
        assert mode is not ResampleMode.MAX
    pack, _ = run_reference(g, rng)
    final = g.final
    want_y, want_index = torch_pool(mode, t64(pack[x.uid]), window, stride, pre, post)
    desc = final.tensors[y.uid]
    assert desc.dim == tuple(want_y.shape)
    assert desc.stride == strides(desc.dim, layout)  # follows the input's layout
    mismatch = compare(desc, pack[y.uid], want_y.numpy())
    assert mismatch is None, str(mismatch)
    if index is not None:
        idesc = final.tensors[index.uid]
        assert idesc.data_type is DataType.INT8 and idesc.dim == desc.dim
        got = pack[index.uid].astype(np.int64)
        # the index points at the maximum (whatever ties), and is PyTorch's index (first max)
        xs = np.pad(pack[x.uid].astype(np.float64), [(0, 0), (0, 0)] + list(zip(pre, post)), constant_values=-np.inf)
        ks = np.unravel_index(got, window)
        gather = [
            np.arange(n).reshape([-1 if i == a else 1 for i in range(len(dims))]) for a, n in enumerate(desc.dim[:2])
        ]
        for a in range(len(window)):
            shape = [1] * len(dims)
            shape[2 + a] = desc.dim[2 + a]
            gather.append(np.arange(desc.dim[2 + a]).reshape(shape) * stride[a] + ks[a])
        np.testing.assert_array_equal(xs[tuple(gather)], pack[y.uid].astype(np.float64))
        np.testing.assert_array_equal(got, want_index)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_resample_vs_torch(case, mode, dtype, rng):
    _run_case(case, mode, dtype, "nchw", rng)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
@pytest.mark.parametrize("case", [CASES[1], CASES[3], CASES[4]], ids=_ids)
def test_resample_channels_last(case, mode, rng):
    _run_case(case, mode, DataType.HALF, "nhwc", rng)


def test_resample_defaults_and_aliases(rng):
    g = og.Graph(io_data_type=DataType.FLOAT)
    x = g.tensor(dim=[1, 2, 6, 6], name="x")
    y, index = g.resample(x, window=2)  # MAX, stride = window, no padding
    assert index is None
    y.set_output(True)
    z, _ = g.resample(x, "AVGPOOL_EXCLUDE_PADDING", window=[3, 3], stride=1, padding=1)
    z.set_output(True)
    pack, _ = run_reference(g, rng)
    final = g.final
    assert final.tensors[y.uid].dim == (1, 2, 3, 3)
    assert final.tensors[z.uid].dim == (1, 2, 6, 6)
    op = final.nodes[1].op
    assert op.mode is ResampleMode.AVG_EXCLUDE_PADDING is ResampleMode.AVGPOOL_EXCLUDE_PADDING
    xs = t64(pack[x.uid])
    assert compare(final.tensors[y.uid], pack[y.uid], F.max_pool2d(xs, 2).numpy()) is None
    want = F.avg_pool2d(xs, 3, 1, 1, count_include_pad=False).numpy()
    assert compare(final.tensors[z.uid], pack[z.uid], want) is None
    assert ResampleMode.MAXPOOL is ResampleMode.MAX


def test_resample_index_int32_for_large_windows(rng):
    g = og.Graph(io_data_type=DataType.FLOAT)
    x = g.tensor(dim=[1, 2, 16, 16], name="x")
    y, index = g.resample(x, window=[12, 12], stride=4, generate_index=True)
    y.set_output(True)
    index.set_output(True).set_data_type(DataType.INT32)
    pack, _ = run_reference(g, rng)
    want_y, want_index = torch_pool(ResampleMode.MAX, t64(pack[x.uid]), (12, 12), (4, 4), (0, 0), (0, 0))
    np.testing.assert_array_equal(pack[y.uid], want_y.numpy().astype(np.float32))
    np.testing.assert_array_equal(pack[index.uid], want_index)


def test_resample_index_of_nan_and_ties(rng):
    g = og.Graph(io_data_type=DataType.FLOAT)
    x = g.tensor(dim=[1, 1, 2, 4], name="x")
    y, index = g.resample(x, window=2, generate_index=True)
    y.set_output(True)
    index.set_output(True)
    final = g.final
    xs = np.array([[[[1.0, 3.0, 5.0, np.nan], [3.0, 2.0, 5.0, 7.0]]]], dtype=np.float32)
    pack = {x.uid: xs, y.uid: np.empty((1, 1, 1, 2), np.float32), index.uid: np.empty((1, 1, 1, 2), np.int8)}
    g.build(device="cpu").execute(pack)
    assert pack[y.uid][0, 0, 0, 0] == 3.0 and pack[index.uid][0, 0, 0, 0] == 1  # first of the tied maxima
    assert np.isnan(pack[y.uid][0, 0, 0, 1]) and pack[index.uid][0, 0, 0, 1] == 1  # NaN wins
    assert final.tensors[index.uid].data_type is DataType.INT8


def test_resample_json_round_trip():
    g = og.Graph(io_data_type=DataType.HALF)
    x = g.tensor(dim=[2, 3, 8, 8], name="x")
    y, index = g.resample(
        x, ResampleMode.MAX, window=[3, 3], stride=[2, 2], pre_padding=[1, 1], post_padding=[0, 1], generate_index=True
    )
    y.set_output(True)
    index.set_output(True)
    g2 = og.Graph.from_json(g.to_json())
    assert g2.key() == g.key()
    op = g2.final.nodes[0].op
    assert isinstance(op, Resample) and op.window == (3, 3) and op.post_padding == (0, 1) and op.generate_index


# -- validation rules ---------------------------------------------------------------------------------


def _pool(dims=(1, 2, 6, 6), **kw):
    g = og.Graph(io_data_type=DataType.FLOAT)
    x = g.tensor(dim=list(dims), name="x")
    kw.setdefault("window", [2, 2])
    y, index = g.resample(x, **kw)
    y.set_output(True)
    if index is not None:
        index.set_output(True).set_name("idx")
    return g, x, y, index


def test_rule_resample_rank():
    g, *_ = _pool(dims=(4, 6))
    raises_rule(g, og.ShapeError, "resample.rank", "x")


@pytest.mark.parametrize("attr", ["window", "stride", "pre_padding", "post_padding"])
def test_rule_resample_attr_length(attr):
    kw = {"window": [2, 2], attr: [1, 1, 1]}
    g, *_ = _pool(**kw)
    err = raises_rule(g, og.AttributeValueError, f"resample.{attr}_length", "x")
    assert attr in err.detail


def test_rule_resample_window_value():
    g, *_ = _pool(window=[2, 0], stride=[1, 1])
    raises_rule(g, og.AttributeValueError, "resample.window_value", "x")


def test_rule_resample_stride_value():
    g, *_ = _pool(stride=[0, 1])
    raises_rule(g, og.AttributeValueError, "resample.stride_value", "x")


def test_rule_resample_padding_negative():
    g, *_ = _pool(pre_padding=[0, -1])
    raises_rule(g, og.AttributeValueError, "resample.padding_negative", "x")


def test_rule_resample_padding_window():
    g, *_ = _pool(window=[3, 3], pre_padding=[1, 3], post_padding=[1, 0])
    err = raises_rule(g, og.AttributeValueError, "resample.padding_window", "x")
    assert "spatial axis 1" in err.detail


def test_rule_resample_output_size():
    g, *_ = _pool(dims=(1, 2, 6, 3), window=[2, 5])
    raises_rule(g, og.ShapeError, "resample.output_size", "x")


def test_rule_resample_index_mode():
    g, *_ = _pool(mode=ResampleMode.AVG_INCLUDE_PADDING, generate_index=True)
    raises_rule(g, og.AttributeValueError, "resample.index_mode", "x")


def test_rule_resample_index_output():
    g = og.Graph(io_data_type=DataType.FLOAT)
    x = g.tensor(dim=[1, 2, 6, 6], name="x")
    op = Resample(window=(2, 2), stride=(2, 2), generate_index=False)
    y, index = g._add_op(op, [x], outputs=["output", "index"])
    y.set_output(True)
    index.set_output(True)
    raises_rule(g, og.DataflowError, "resample.index_output", "x")


def test_rule_resample_index_type():
    g, _, _, index = _pool(generate_index=True)
    index.set_data_type(DataType.HALF)
    raises_rule(g, og.DataTypeError, "resample.index_type", "idx")


def test_rule_resample_index_range():
    g, _, _, index = _pool(dims=(1, 2, 16, 16), window=[12, 12], generate_index=True)
    err = raises_rule(g, og.DataTypeError, "resample.index_range", "idx")
    assert "143" in err.detail and "INT32" in err.hint


def test_rule_resample_padding_conflict():
    g = og.Graph()
    x = g.tensor(dim=[1, 2, 6, 6], name="x")
    with pytest.raises(og.AttributeValueError) as info:
        g.resample(x, window=2, padding=1, pre_padding=[1, 1], name="pool")
    check_rule(info.value, "resample.padding_conflict", "pool")


def test_rule_resample_attr_type():
    g = og.Graph()
    x = g.tensor(dim=[1, 2, 6, 6], name="x")
    with pytest.raises(og.AttributeValueError) as info:
        g.resample(x, window=[2.5, 2], name="pool")
    check_rule(info.value, "resample.window_type", "pool")


@pytest.mark.parametrize("mode", ["BILINEAR", og.ReductionMode.MAX])
def test_rule_resample_mode(mode):
    g = og.Graph()
    x = g.tensor(dim=[1, 2, 6, 6], name="x")
    with pytest.raises(og.AttributeValueError) as info:
        g.resample(x, mode, window=2, name="pool")
    check_rule(info.value, "resample.mode", "pool")


def test_resample_needs_a_window():
    g = og.Graph()
    x = g.tensor(dim=[1, 2, 6, 6], name="x")
    with pytest.raises(TypeError, match="window"):
        g.resample(x)
