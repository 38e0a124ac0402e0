"""The Triton pooling template against the reference engine: under the interpreter on the CPU
(small shapes) and, marked gpu, on CUDA at realistic sizes."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph.ops.pooling import ResampleMode
from opgraph.tools.samples import nhwc

from ..helpers import assert_engine_matches, requires_cuda, requires_interpreter
from .hopper_compile import compile_for_hopper

pytestmark = pytest.mark.interpreter
DT = og.DataType
P = ResampleMode

GEOMETRIES = {  # name: (input dims, window, stride, pre, post)
    "1d": ([2, 3, 11], [3], [2], [1], [0]),
    "2d": ([2, 3, 7, 6], [3, 3], [2, 2], [1, 1], [1, 1]),
    "2d_asym": ([1, 4, 6, 7], [3, 2], [1, 2], [2, 0], [0, 1]),
    "2d_overlap_big_stride": ([2, 2, 9, 8], [2, 3], [3, 1], [0, 1], [1, 2]),
    "3d": ([1, 2, 5, 4, 6], [2, 3, 2], [2, 1, 2], [1, 1, 0], [0, 1, 1]),
}


def _layout(dims, layout):
    return nhwc(dims) if layout == "nhwc" else None


def _pool_graph(mode, geo, *, dt=DT.FLOAT, layout="nchw", index=False, index_type=None):
    dims, w, s, pre, post = GEOMETRIES[geo] if isinstance(geo, str) else geo
    g = og.Graph("pool", io_data_type=dt)
    x = g.tensor(dim=dims, stride=_layout(dims, layout), name="x")
    y, idx = g.resample(
        x, mode=mode, window=w, stride=s, pre_padding=pre, post_padding=post, generate_index=index, name="pool"
    )
    y.set_output(True).set_name("y")
    if idx is not None:
        idx.set_output(True).set_name("index")
        if index_type is not None:
            idx.set_data_type(index_type)
    return g


def _nans(pack):
    for v in pack.values():
        if isinstance(v, np.ndarray) and v.size > 4 and v.dtype.kind == "f":
            flat = np.unravel_index(np.arange(3, v.size, 17), v.shape)
            v[flat] = np.nan


def _negative(pack):
    for v in pack.values():
        if isinstance(v, np.ndarray) and v.dtype.kind == "f":
            v[...] = -np.abs(v.astype(np.float64)) - 0.25


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("geo", GEOMETRIES)
@pytest.mark.parametrize("mode", [P.MAX, P.AVG_INCLUDE_PADDING, P.AVG_EXCLUDE_PADDING], ids=lambda m: m.name)
def test_modes_geometries_layouts(mode, geo, layout, rng):
    """Small integers: many ties, so the index must pick the first maximum as the reference does."""
    g = _pool_graph(mode, geo, layout=layout, index=mode is P.MAX)
    assert_engine_matches(g, rng, expect_steps=1, integers=True, low=-3, high=3)


@pytest.mark.parametrize("dt", [DT.FLOAT, DT.HALF, DT.BFLOAT16], ids=lambda d: d.name)
@pytest.mark.parametrize("mode", [P.MAX, P.AVG_INCLUDE_PADDING, P.AVG_EXCLUDE_PADDING], ids=lambda m: m.name)
def test_types(mode, dt, rng):
    assert_engine_matches(_pool_graph(mode, "2d", dt=dt, layout="nhwc", index=mode is P.MAX), rng, expect_steps=1)


@pytest.mark.parametrize("geo", ["1d", "2d", "3d"])
def test_max_nan_wins_and_first_nan_is_the_index(geo, rng):
    assert_engine_matches(_pool_graph(P.MAX, geo, index=True), rng, expect_steps=1, prepare=_nans)


def test_big_window_loops_over_taps_and_int32_index(rng):
    """A 4x4x3 window (48 taps, over the unroll limit) needs an INT32 index up to 47."""
    geo = ([1, 2, 6, 6, 5], [4, 4, 3], [2, 2, 1], [1, 2, 0], [1, 0, 2])
    g = _pool_graph(P.MAX, geo, layout="nhwc", index=True, index_type=DT.INT32)
    plan = assert_engine_matches(g, rng, expect_steps=1, integers=True, low=-3, high=3)
    assert "static_range" not in plan.source(0)
    g = _pool_graph(P.AVG_EXCLUDE_PADDING, geo, layout="nhwc")
    assert_engine_matches(g, rng, expect_steps=1)


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_relu_then_maxpool_pads_after_the_relu(layout, rng):
    """relu(x + b) -> maxpool with padding, all inputs negative: relu gives 0 inside the image and
    the padding stays -inf, so the max is 0 at the first in-image tap (not at a padded one)."""
    dims = [2, 4, 5, 5]
    g = og.Graph("relu_pool", io_data_type=DT.HALF, intermediate_data_type=DT.FLOAT)
    x = g.tensor(dim=dims, stride=_layout(dims, layout), name="x")
    b = g.tensor(dim=[1, 4, 1, 1], name="b")
    r = g.relu(g.add(x, b))
    y, idx = g.resample(r, mode=P.MAX, window=[3, 3], stride=[2, 2], padding=[1, 1], generate_index=True)
    y.set_output(True).set_name("y")
    idx.set_output(True).set_name("index")
    plan = assert_engine_matches(g, rng, expect_steps=1, prepare=_negative)
    assert plan.steps[0].config.knob("template") == "pooling"
    assert_engine_matches(g, rng, expect_steps=1)  # and on mixed-sign data


@pytest.mark.parametrize("mode", [P.AVG_INCLUDE_PADDING, P.AVG_EXCLUDE_PADDING], ids=lambda m: m.name)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_avgpool_then_pointwise_epilogue(layout, mode, rng):
    """exp(x) -> avgpool -> *scale[c] + residual -> relu, two outputs (the pooled value and the end)."""
    dims = [2, 3, 6, 8]
    out = [2, 3, 3, 4]
    g = og.Graph("pool_epi", io_data_type=DT.HALF, intermediate_data_type=DT.FLOAT)
    x = g.tensor(dim=dims, stride=_layout(dims, layout), name="x")
    sc = g.tensor(dim=[1, 3, 1, 1], name="scale")
    res = g.tensor(dim=out, stride=_layout(out, "nchw" if layout == "nhwc" else "nhwc"), name="res")
    y, _ = g.resample(g.exp(x), mode=mode, window=[3, 2], stride=[2, 2], pre_padding=[1, 0], post_padding=[1, 0])
    y.set_output(True).set_name("y")
    g.relu(g.add(g.mul(y, sc), res)).set_output(True).set_name("z")
    assert_engine_matches(g, rng, expect_steps=1)


def test_virtual_half_pool_output_is_rounded_before_the_epilogue(rng):
    g = og.Graph("round", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[1, 2, 4, 4], name="x")
    y, _ = g.resample(x, mode=P.AVG_INCLUDE_PADDING, window=[2, 2], stride=[2, 2])
    y.set_data_type(DT.HALF)
    g.sub(g.mul(y, 3.0), 1.0).set_output(True)
    assert_engine_matches(g, rng, expect_steps=1, rtol=0, atol=1e-6)


def test_index_feeds_the_epilogue(rng):
    g = og.Graph("idx_epi", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[1, 3, 6, 6], name="x")
    y, idx = g.resample(x, mode=P.MAX, window=[2, 2], stride=[2, 2], generate_index=True)
    y.set_output(True)
    g.mul(idx, 2.0).set_output(True).set_data_type(DT.FLOAT)
    assert_engine_matches(g, rng, expect_steps=1, integers=True, low=-2, high=2)


def test_prologue_needed_elsewhere_is_not_fused(rng):
    """relu(x) is also a graph output: the pooling kernel cannot store it (windows skip or repeat
    elements), so the relu runs as its own step and describe() says why."""
    g = og.Graph("split", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[1, 2, 6, 6], name="x")
    r = g.relu(x).set_output(True).set_name("r")
    y, _ = g.resample(r, mode=P.MAX, window=[2, 2], stride=[2, 2])
    y.set_output(True)
    plan = assert_engine_matches(g, rng, expect_steps=2)
    assert "needed outside the piece" in plan.describe()


def test_gen_index_in_the_prologue(rng):
    """The spatial coordinate seen by the prologue is the tap's input position."""
    g = og.Graph("gi", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[1, 2, 5, 7], name="x")
    i = g.gen_index(x, axis=3).set_data_type(DT.FLOAT)
    y, _ = g.resample(g.add(x, i), mode=P.AVG_EXCLUDE_PADDING, window=[2, 3], stride=[1, 2], padding=[1, 1])
    y.set_output(True)
    assert_engine_matches(g, rng, expect_steps=1)


# -- compiled for Hopper (see hopper_compile.py) ---------------------------------------------------


def _stem(mode, dt=DT.HALF):
    def build():
        dims = [32, 64, 112, 112]
        g = og.Graph("stem", io_data_type=dt)
        x = g.tensor(dim=dims, stride=nhwc(dims), name="x")
        b = g.tensor(dim=[1, 64, 1, 1], name="b")
        y, idx = g.resample(
            g.relu(g.add(x, b)), mode=mode, window=[3, 3], stride=[2, 2], padding=[1, 1], generate_index=mode is P.MAX
        )
        g.relu(g.mul(y, 2.0)).set_output(True)
        if idx is not None:
            idx.set_output(True)
        return g

    return build


def _big_3d():
    geo = ([2, 16, 12, 12, 12], [4, 4, 4], [2, 2, 2], [1, 1, 1], [1, 1, 1])
    return _pool_graph(P.MAX, geo, layout="nhwc", index=True, index_type=DT.INT32)


HOPPER_CASES = {
    **{f"stem_{m.name}": (_stem(m), "pooling", None) for m in (P.MAX, P.AVG_INCLUDE_PADDING, P.AVG_EXCLUDE_PADDING)},
    "stem_bf16": (_stem(P.MAX, DT.BFLOAT16), "pooling", None),
    "nchw_1d": (lambda: _pool_graph(P.AVG_EXCLUDE_PADDING, "1d"), "pooling", None),
    "big_3d": (_big_3d, "pooling", None),
    "int64_offsets": (
        lambda: _pool_graph(
            P.MAX, ([64, 256, 384, 384], [2, 2], [2, 2], [0, 0], [0, 0]), dt=DT.HALF, layout="nhwc", index=True
        ),
        "pooling",
        None,
    ),
}


def test_kernels_compile_for_hopper():
    out = compile_for_hopper(__name__)
    assert out.count("compiled") >= len(HOPPER_CASES)


def test_int64_offsets_past_2_gib_elements():
    from opgraph.core.device import Device
    from opgraph.engines.triton.templates.pooling import TEMPLATE
    from opgraph.core.piece import make_piece

    final = HOPPER_CASES["int64_offsets"][0]().final
    piece = make_piece(final, 0, final.nodes)
    gpu = Device("cuda", 0, "H100", (9, 0), 132)
    assert "tl.program_id(0).to(tl.int64)" in TEMPLATE.generate(piece, TEMPLATE.candidates(piece, gpu)[0], gpu).source


# -- GPU, realistic sizes --------------------------------------------------------------------------


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("dt", [DT.HALF, DT.BFLOAT16], ids=lambda d: d.name)
def test_gpu_resnet_stem_maxpool_with_index(dt, rng):
    """relu -> maxpool 3x3 s2 p1 on N32 C64 112x112 NHWC (the ResNet stem)."""
    dims = [32, 64, 112, 112]
    g = og.Graph("stem", io_data_type=dt)
    x = g.tensor(dim=dims, stride=nhwc(dims), name="x")
    y, idx = g.resample(g.relu(x), mode=P.MAX, window=[3, 3], stride=[2, 2], padding=[1, 1], generate_index=True)
    y.set_output(True)
    idx.set_output(True)
    assert_engine_matches(g, rng, device="cuda", expect_steps=1)


@pytest.mark.gpu
@requires_cuda
def test_gpu_avgpool_epilogue(rng):
    dims = [32, 256, 56, 56]
    g = og.Graph("avg", io_data_type=DT.HALF)
    x = g.tensor(dim=dims, stride=nhwc(dims), name="x")
    b = g.tensor(dim=[1, 256, 1, 1], name="b")
    y, _ = g.resample(x, mode=P.AVG_EXCLUDE_PADDING, window=[3, 3], stride=[2, 2], padding=[1, 1])
    g.relu(g.add(y, b)).set_output(True)
    assert_engine_matches(g, rng, device="cuda", expect_steps=1)
