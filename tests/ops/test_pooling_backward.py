"""Pooling's backward ops (resample_max_backward, resample_avg_backward) against PyTorch autograd in
float64 (the gradient of F.max_pool / F.avg_pool over an explicitly padded input), on the reference and
torch engines, NCHW and NHWC, random data with ties; their validation rules; a JSON round trip."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph.core.tensor import stride_order
from opgraph.ops.pooling import ResampleMode
from opgraph.ops.pooling_backward import ResampleAvgBackward, ResampleMaxBackward
from tests.helpers import check_rule, layout_stride

torch = pytest.importorskip("torch")
F = torch.nn.functional
DT = og.DataType
CASES = {  # name: (input dims, window, stride, pre, post)
    "stem": ([2, 3, 7, 6], (3, 3), (2, 2), (1, 1), (1, 1)),
    "asymmetric": ([1, 2, 9, 11], (2, 3), (2, 3), (0, 1), (1, 2)),
    "one_axis": ([2, 3, 10], (3,), (2,), (1,), (0,)),
    "three_axes": ([1, 2, 5, 6, 4], (2, 2, 2), (2, 1, 2), (0, 1, 0), (1, 0, 1)),
}


def _torch_pool(x, mode, w, s, pre, post):
    spec = [p for a in reversed(range(len(w))) for p in (pre[a], post[a])]
    nsp = len(w)
    maxp = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[nsp]
    avgp = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[nsp]
    if mode is ResampleMode.MAX:
        return maxp(F.pad(x, spec, value=-np.inf), w, s)
    total = avgp(F.pad(x, spec), w, s)
    if mode is ResampleMode.AVG_INCLUDE_PADDING:
        return total
    return total / avgp(F.pad(torch.ones_like(x), spec), w, s)


def _want(mode, x, dy, w, s, pre, post):
    xt = torch.tensor(x, requires_grad=True)
    (dx,) = torch.autograd.grad(_torch_pool(xt, mode, w, s, pre, post), xt, torch.tensor(dy))
    return dx.numpy()


def _graph(mode, case, layout="nchw"):
    dims, w, s, pre, post = CASES[case]
    out = [(d + a + b - k) // t + 1 for d, a, b, k, t in zip(dims[2:], pre, post, w, s)]
    g = og.Graph("pool_bwd", io_data_type=DT.DOUBLE, compute_data_type=DT.DOUBLE)
    dy = g.tensor(dim=[*dims[:2], *out], stride=layout_stride([*dims[:2], *out], layout), name="dy")
    geometry = dict(window=w, stride=s, pre_padding=pre, post_padding=post)
    if mode is ResampleMode.MAX:
        x = g.tensor(dim=dims, stride=layout_stride(dims, layout), name="x")
        (dx,) = g._add_op(ResampleMaxBackward(**geometry), [dy, x], name="dpool")
    else:
        x = None
        (dx,) = g._add_op(ResampleAvgBackward(mode=mode, in_dim=tuple(dims), **geometry), [dy], name="dpool")
    dx.set_output(True).set_name("dx")
    return g, dy, x, dx


@pytest.mark.parametrize("engine", ["reference", "torch"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("mode", list(ResampleMode)[:3], ids=lambda m: m.name)
def test_against_torch_autograd(mode, case, layout, engine, rng):
    dims, w, s, pre, post = CASES[case]
    if layout == "nhwc" and len(dims) != 4:
        pytest.skip("NHWC is a 2-D layout")
    g, dy, x, dx = _graph(mode, case, layout)
    plan = g.build(device="cpu", engines=[engine])
    pack = og.testing.random_pack(plan.graph, rng)
    if x is not None:  # ties: several maxima in a window (the first gets the gradient)
        pack[x.uid][...] = np.round(rng.uniform(-2, 2, size=dims) * 2) / 2
    pack[dx.uid][...] = np.nan
    plan.execute(pack)
    xv = pack[x.uid] if x is not None else np.zeros(dims)
    want = _want(mode, np.ascontiguousarray(xv), np.ascontiguousarray(pack[dy.uid]), w, s, pre, post)
    np.testing.assert_allclose(pack[dx.uid], want, rtol=1e-12, atol=1e-12)
    assert stride_order(g.final.tensors[dx.uid].stride) == stride_order(g.final.tensors[dy.uid].stride)  # dy's layout


def test_one_value_means_every_axis_and_is_made_explicit():
    g = og.Graph("b", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[1, 2, 7, 6], name="x")
    dy = g.tensor(dim=[1, 2, 4, 3], name="dy")
    g._add_op(ResampleMaxBackward(window=(3,), stride=(2,), pre_padding=(1,), post_padding=(1,)), [dy, x])[
        0
    ].set_output(True)
    op = g.final.nodes[0].op
    assert (op.window, op.stride, op.pre_padding, op.post_padding) == ((3, 3), (2, 2), (1, 1), (1, 1))


@pytest.mark.parametrize(
    "dy_dims,change,error,rule",
    [
        ([1, 3, 4, 3], {}, og.ShapeError, "pooling_backward.geometry"),  # dy broadcast over the batch
        ([2, 3, 4, 3], {"window": (3, 3, 3)}, og.AttributeValueError, "pooling_backward.geometry"),
        ([2, 3, 4, 3], {"stride": (0,)}, og.AttributeValueError, "pooling_backward.geometry"),
        ([2, 3, 4, 3], {"post_padding": (1, -1)}, og.AttributeValueError, "pooling_backward.geometry"),
    ],
)
def test_bad_geometry_is_refused_naming_dy(dy_dims, change, error, rule):
    geometry = {"window": (3, 3), "stride": (2, 2), "pre_padding": (1, 1), "post_padding": (1, 1), **change}
    g = og.Graph("bad", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[2, 3, 7, 6], name="x")
    dy = g.tensor(dim=dy_dims, name="dy")
    g._add_op(ResampleMaxBackward(**geometry), [dy, x], name="dpool")[0].set_output(True)
    with pytest.raises(error) as err:
        g.validate()
    check_rule(err.value, rule, "dy")


def test_average_backward_needs_an_average_mode():
    g = og.Graph("bad", io_data_type=DT.FLOAT)
    dy = g.tensor(dim=[2, 3, 4, 3], name="dy")
    op = ResampleAvgBackward(
        mode=ResampleMode.MAX,
        in_dim=(2, 3, 7, 6),
        window=(3, 3),
        stride=(2, 2),
        pre_padding=(1, 1),
        post_padding=(1, 1),
    )
    g._add_op(op, [dy], name="dpool")[0].set_output(True)
    with pytest.raises(og.AttributeValueError) as err:
        g.validate()
    check_rule(err.value, "pooling_backward.mode", "dy")


def test_json_round_trip():
    g, *_ = _graph(ResampleMode.AVG_EXCLUDE_PADDING, "asymmetric")
    back = og.Graph.from_json(g.to_json())
    assert back.key() == g.key() and back.final.nodes[0].op == g.final.nodes[0].op
