"""The Triton pooling backward template (the ops resample_max_backward / resample_avg_backward
that autodiff emits for `resample`) against the reference engine: under the interpreter on the CPU
(small shapes: geometries, layouts, types, ties, NaN, wide windows) and, marked gpu, on CUDA at
ResNet's stem pool size."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph.autodiff import grad
from opgraph.engines.triton.templates.pool_backward import TEMPLATE, tap_type
from opgraph.ops.pooling_backward import AVG_BACKWARD, MAX_BACKWARD

from ..helpers import requires_cuda
from .test_triton_pooling import GEOMETRIES, _layout, _nans

pytestmark = pytest.mark.interpreter
DT = og.DataType
MODES = ("max", "avg_include_padding", "avg_exclude_padding")
MORE = {  # name: (input dims, window, stride, pre, post)
    "window_under_stride": ([1, 3, 9, 11], [1, 2], [2, 3], [0, 1], [0, 0]),
    "wide_window": ([1, 2, 12, 11], [9, 9], [1, 1], [4, 4], [4, 4]),  # 81 windows an element: a range loop
    "int16_taps": ([1, 2, 140], [130], [5], [2], [0]),  # 130 taps: the argmax scratch is int16
    "global": ([2, 3, 4, 5], [4, 5], [1, 1], [0, 0], [0, 0]),  # one window: dy's spatial axes of size 1
    "unit_batch_and_channel": ([1, 1, 5, 6], [2, 2], [2, 2], [0, 1], [1, 1]),
}


def _grad_graph(mode, geo, *, dt=DT.FLOAT, layout="nchw"):
    dims, w, s, pre, post = {**GEOMETRIES, **MORE}[geo]
    g = og.Graph("pool", io_data_type=dt, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    x = g.tensor(dim=dims, stride=_layout(dims, layout), name="x")
    y = g.resample(x, mode=mode, window=w, stride=s, pre_padding=pre, post_padding=post, name="pool")[0]
    y.set_output(True).set_name("y")
    return grad(g, y, x).graph


def _ties(pack):
    """Values on a grid of 0.5 in [-2, 2]: windows with several maxima (the first one gets the gradient)."""
    for v in pack.values():
        if isinstance(v, np.ndarray) and v.dtype.kind == "f":
            v[...] = np.round(np.clip(v.astype(np.float64), -2, 2) * 2) / 2


def _check(bg, rng, prepare=None, **tol):
    plan = bg.build(device="cpu", engines=["triton"])
    (step,) = plan.steps
    assert dict(step.config.knobs)["template"] == TEMPLATE.name
    bad = og.testing.check_plan(plan, rng, prepare=prepare, **tol)
    assert not bad, "\n".join(map(str, bad))
    return plan


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("geo", sorted(GEOMETRIES) + sorted(MORE))
@pytest.mark.parametrize("mode", MODES)
def test_geometries(mode, geo, layout, rng):
    dims = {**GEOMETRIES, **MORE}[geo][0]
    if layout == "nhwc" and len(dims) != 4:
        pytest.skip("NHWC is a 2-D layout")
    _check(_grad_graph(mode, geo, layout=layout), rng, prepare=_ties if mode == "max" else None)


@pytest.mark.parametrize("dt", [DT.HALF, DT.BFLOAT16, DT.DOUBLE], ids=lambda d: d.name)
@pytest.mark.parametrize("mode", ["max", "avg_exclude_padding"])
def test_types(mode, dt, rng):
    _check(_grad_graph(mode, "2d", dt=dt, layout="nhwc"), rng, prepare=_ties if mode == "max" else None)


def test_every_tie_goes_to_the_first_maximum(rng):
    """All inputs equal: each window's gradient lands on its first tap inside the input, only."""
    bg = _grad_graph("max", "2d")
    plan = _check(
        bg,
        rng,
        prepare=lambda pack: [
            v.fill(1.0) for v in pack.values() if isinstance(v, np.ndarray) and v.ndim == 4 and v.shape[2:] == (7, 6)
        ],
    )
    assert plan.steps[0].kernel is not None


def test_nan_takes_the_gradient_as_in_the_forward(rng):
    _check(_grad_graph("max", "2d"), rng, prepare=_nans)


@pytest.mark.parametrize("dy_layout", ["nchw", "nhwc"])
def test_layouts_of_dy_and_x_differ(dy_layout, rng):
    """dy and x in different layouts (dx takes dy's, the custom op's first input): each tensor indexed
    by its own strides, the taps in dy's order."""
    g = og.Graph("mixed", io_data_type=DT.HALF, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    dims = [2, 3, 7, 6]
    x = g.tensor(dim=dims, stride=_layout(dims, "nchw" if dy_layout == "nhwc" else "nhwc"), name="x")
    dy = g.tensor(dim=[2, 3, 4, 3], stride=_layout([2, 3, 4, 3], dy_layout), name="dy")
    g.custom(MAX_BACKWARD, dy, x, params=STEM_POOL, name="dpool").set_output(True)
    _check(g, rng, prepare=_ties)


STEM_POOL = {"window": "3,3", "stride": "2,2", "pre_padding": "1,1", "post_padding": "1,1"}


@pytest.mark.parametrize(
    "dy_dims, params, error, match",
    [
        ([1, 3, 4, 3], STEM_POOL, og.ShapeError, "gives \\[2, 3, 4, 3\\]"),  # dy broadcast over the batch
        ([2, 3, 4, 3], {**STEM_POOL, "window": "3,3,3"}, og.AttributeValueError, "window \\[3, 3, 3\\] needs 2"),
        (
            [2, 3, 4, 3],
            {**STEM_POOL, "stride": "0"},
            og.AttributeValueError,
            "stride \\[0, 0\\] needs 2 values of at least 1",
        ),
        ([2, 3, 4, 3], {**STEM_POOL, "post_padding": "1,-1"}, og.AttributeValueError, "post_padding"),
        ([2, 3, 4, 3], {**STEM_POOL, "window": "3,x"}, og.AttributeValueError, "comma-separated ints"),
    ],
)
def test_a_graph_of_bad_geometry_is_refused(dy_dims, params, error, match):
    """The ops' infer checks the geometry and dy's dims (a typed error naming them), so no engine, this
    template included, is handed a dy it would index wrongly."""
    g = og.Graph("bad", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[2, 3, 7, 6], name="x")
    dy = g.tensor(dim=dy_dims, name="dy")
    with pytest.raises(error, match=match):
        g.custom(MAX_BACKWARD, dy, x, params=params, name="dpool").set_output(True)
        g.validate()


def test_avg_backward_needs_an_average_mode():
    g = og.Graph("bad", io_data_type=DT.FLOAT)
    dy = g.tensor(dim=[2, 3, 4, 3], name="dy")
    with pytest.raises(og.AttributeValueError, match="not an average pooling mode"):
        g.custom(AVG_BACKWARD, dy, params={**STEM_POOL, "in_dim": "2,3,7,6", "mode": "max"}).set_output(True)
        g.validate()


def test_a_custom_op_of_the_same_name_is_the_users(custom_ops_restored, rng):
    """A user who registers a custom op under a pooling backward's name gets their definition (a custom
    op, which the template does not run), not ours."""
    from opgraph.core.piece import make_piece

    og.register_custom_op(
        MAX_BACKWARD, num_inputs=2, reference=lambda dy, x, **p: 2 * x, infer=lambda dy, x, **p: [x.dim]
    )
    g = og.Graph("mine", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[2, 3, 7, 6], name="x")
    dy = g.tensor(dim=[2, 3, 4, 3], name="dy")
    g.custom(MAX_BACKWARD, dy, x, params=STEM_POOL, name="dpool").set_output(True)
    assert g.final.nodes[0].kind == "custom"
    verdict = TEMPLATE.match(make_piece(g.final, 0, g.final.nodes), og.core.device.CPU)
    assert not verdict.ok and "resample backward op" in verdict.reason
