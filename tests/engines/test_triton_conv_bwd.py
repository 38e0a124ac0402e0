"""The Triton conv_dgrad and conv_wgrad templates against the reference engine: every geometry class,
the stride phases of dgrad, depthwise stencils, split-K and multi-tap wgrad, data types, and the
backward fusions (dgrad + drelu, dgrad + batchnorm-backward inputs and reductions, SBR -> wgrad,
wgrad + an SGD step), each built as one piece; seeded fuzzers on small integers (exact results).
Under the interpreter on the CPU with tiny shapes; marked gpu, on CUDA at the ResNet benchmark size."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph.core.device import Device
from opgraph.core.config import NumericalNote
from opgraph.engines.triton import TEMPLATES
from opgraph.core.errors import AttributeValueError
from opgraph.ops.conv import ConvGeometry
from opgraph.core.piece import make_piece
from opgraph.tools.samples import nhwc

from ..helpers import (
    assert_candidates_match,
    assert_engine_matches,
    candidate_configs,
    layout_stride,
    plan_with,
    requires_cuda,
    scale_mask_or_genstats,
    templates,
)
from .hopper_compile import compile_for_hopper

pytestmark = pytest.mark.interpreter
DT = og.DataType
H100 = Device("cuda", 0, "H100", (9, 0), 132)
EXACT = {"integers": True, "low": -2, "high": 2, "rtol": 0, "atol": 0}


def _loss_dims(x_dims, w_dims, conv) -> list[int]:
    nsp = len(x_dims) - 2

    def full(key, default):
        v = conv.get(key, conv.get("padding") if key in ("pre_padding", "post_padding") else None)
        return tuple(v) if v is not None else (default,) * nsp

    geo = ConvGeometry(full("pre_padding", 0), full("post_padding", 0), full("stride", 1), full("dilation", 1))
    return [x_dims[0], w_dims[0], *geo.out_size(x_dims[2:], w_dims[2:])]


def _graph(name, dt, intermediate=DT.FLOAT):
    return og.Graph(name, io_data_type=dt, intermediate_data_type=intermediate, compute_data_type=DT.FLOAT)


def dgrad_graph(x_dims, w_dims, *, dt=DT.HALF, layout="nhwc", **conv):
    """dy, w -> conv_dgrad -> dx (dims and layout set as the forward image's); (graph, dy, w, dx)."""
    g = _graph("dgrad", dt)
    yd = _loss_dims(x_dims, w_dims, conv)
    dy = g.tensor(dim=yd, stride=layout_stride(yd, layout), name="dy")
    w = g.tensor(dim=list(w_dims), stride=layout_stride(w_dims, layout), name="w")
    dx = g.conv_dgrad(dy, w, name="dgrad", **conv).set_dim(list(x_dims))
    if layout == "nhwc":
        dx.set_stride(nhwc(list(x_dims)))
    return g, dy, w, dx


def wgrad_graph(x_dims, w_dims, *, dt=DT.HALF, layout="nhwc", **conv):
    """x, dy -> conv_wgrad -> dw (dims and layout set as the filter's); (graph, x, dy, dw)."""
    g = _graph("wgrad", dt)
    yd = _loss_dims(x_dims, w_dims, conv)
    x = g.tensor(dim=list(x_dims), stride=layout_stride(x_dims, layout), name="x")
    dy = g.tensor(dim=yd, stride=layout_stride(yd, layout), name="dy")
    dw = g.conv_wgrad(x, dy, name="wgrad", **conv).set_dim(list(w_dims))
    if layout == "nhwc":
        dw.set_stride(nhwc(list(w_dims)))
    return g, x, dy, dw


def _check(plan, rng, **kw):
    bad = og.testing.check_plan(plan, rng, **kw)
    assert not bad, "\n".join(map(str, bad)) + "\n" + plan.describe()


def _template(name):
    return next(t for t in TEMPLATES if t.name == name)


# -- geometry -------------------------------------------------------------------------------------------

GEOMETRIES = {
    "1d": dict(x=(2, 8, 11), w=(16, 8, 3), padding=[1]),
    "1d_stride_dilation": dict(x=(2, 8, 17), w=(16, 8, 3), padding=[2], stride=[2], dilation=[2]),
    "2d_3x3": dict(x=(2, 8, 6, 6), w=(16, 8, 3, 3), padding=[1, 1]),
    "2d_1x1": dict(x=(2, 16, 5, 5), w=(8, 16, 1, 1)),
    "2d_1x1_stride2": dict(x=(2, 16, 7, 6), w=(8, 16, 1, 1), stride=[2, 2]),
    "2d_asymmetric": dict(x=(2, 8, 6, 7), w=(16, 8, 3, 2), pre_padding=[0, 2], post_padding=[2, 1]),
    "2d_stride2": dict(x=(2, 8, 9, 8), w=(16, 8, 3, 3), padding=[1, 1], stride=[2, 2]),
    "2d_stride2_dilation2": dict(x=(2, 8, 9, 10), w=(16, 8, 3, 3), padding=[2, 1], stride=[2, 2], dilation=[2, 2]),
    "2d_stride3_big_pad": dict(
        x=(1, 8, 10, 11), w=(16, 8, 2, 4), pre_padding=[3, 0], post_padding=[1, 3], stride=[3, 3]
    ),
    "2d_dilation": dict(x=(2, 8, 9, 9), w=(16, 8, 3, 3), padding=[2, 2], dilation=[2, 2]),
    "2d_rect_filter_stride": dict(x=(1, 8, 10, 9), w=(16, 8, 1, 5), padding=[0, 2], stride=[3, 1]),
    "2d_groups": dict(x=(2, 16, 5, 5), w=(32, 8, 3, 3), padding=[1, 1]),
    "2d_groups4_stride2": dict(x=(2, 32, 6, 5), w=(32, 8, 3, 3), padding=[1, 1], stride=[2, 2]),
    "2d_ragged_channels": dict(x=(2, 20, 5, 5), w=(24, 20, 3, 3), padding=[1, 1]),
    "3d": dict(x=(1, 8, 4, 5, 4), w=(16, 8, 3, 3, 3), padding=[1, 1, 1]),
    "3d_stride_asym": dict(
        x=(1, 8, 5, 6, 5), w=(16, 8, 2, 3, 3), pre_padding=[1, 0, 1], post_padding=[0, 1, 2], stride=[2, 1, 2]
    ),
    "depthwise_3x3": dict(x=(2, 16, 6, 6), w=(16, 1, 3, 3), padding=[1, 1]),
    "depthwise_stride2": dict(x=(2, 16, 7, 7), w=(16, 1, 3, 3), padding=[1, 1], stride=[2, 2]),
    "depthwise_multiplier2": dict(x=(2, 8, 5, 5), w=(16, 1, 3, 3), padding=[1, 1]),
    "depthwise_1d_dilation": dict(x=(2, 16, 9), w=(16, 1, 3), padding=[2], dilation=[2]),
    "depthwise_3d": dict(x=(1, 8, 4, 4, 4), w=(8, 1, 3, 3, 3), padding=[1, 1, 1]),
}


@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
@pytest.mark.parametrize("case", sorted(GEOMETRIES))
def test_dgrad_geometry(case, layout, rng):
    spec = dict(GEOMETRIES[case])
    g, _, _, dx = dgrad_graph(spec.pop("x"), spec.pop("w"), layout=layout, **spec)
    dx.set_output(True)
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert templates(plan) == ["conv_dgrad"]


@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
@pytest.mark.parametrize("case", sorted(GEOMETRIES))
def test_wgrad_geometry(case, layout, rng):
    spec = dict(GEOMETRIES[case])
    g, _, _, dw = wgrad_graph(spec.pop("x"), spec.pop("w"), layout=layout, **spec)
    dw.set_output(True)
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert templates(plan) == ["conv_wgrad"]


@pytest.mark.parametrize("op", ["dgrad", "wgrad"])
@pytest.mark.parametrize("stride", [1, 2])
def test_convolution_mode_flips_the_filter(op, stride, rng):
    build = dgrad_graph if op == "dgrad" else wgrad_graph
    g, _, _, out = build(
        (2, 8, 7, 6),
        (16, 8, 3, 2),
        pre_padding=[1, 0],
        post_padding=[0, 1],
        stride=[stride, stride],
        convolution_mode="convolution",
    )
    out.set_output(True)
    assert_engine_matches(g, rng, expect_steps=1)


# -- dgrad: stride phases, stencil, split-K --------------------------------------------------------------

STRIDED = [
    "1d_stride_dilation",
    "2d_1x1_stride2",
    "2d_stride2",
    "2d_stride2_dilation2",
    "2d_stride3_big_pad",
    "2d_rect_filter_stride",
    "2d_groups4_stride2",
    "3d_stride_asym",
]


@pytest.mark.parametrize("case", STRIDED)
def test_dgrad_stride_phases_by_default_and_masked_path(case, rng):
    """Strided dgrads run one stride phase per program (only the taps that reach it); PHASES=0 masks the
    holes instead. Both must match."""
    spec = dict(GEOMETRIES[case])
    g, _, _, dx = dgrad_graph(spec.pop("x"), spec.pop("w"), **spec)
    dx.set_output(True)
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert plan.steps[0].config.knob("PHASES") == 1
    assert "phase = pid_m //" in plan.source(0)
    masked = plan_with(g, {"PHASES": 0})
    assert "phase" not in masked.source(0)
    _check(masked, rng)


def test_dgrad_phase_without_taps_is_zero(rng):
    """Stride 2, dilation 2, no padding: odd pixels receive no tap at all (their gradient is 0, plus the
    epilogue)."""
    g, _, _, dx = dgrad_graph((2, 8, 9, 9), (16, 8, 3, 3), stride=[2, 2], dilation=[2, 2])
    yf = g.tensor(dim=[2, 8, 9, 9], stride=nhwc([2, 8, 9, 9]), name="yf")
    g.relu_backward(dx, yf).set_output(True)
    assert_engine_matches(g, rng, expect_steps=1)


@pytest.mark.parametrize("split", [2, 3])
@pytest.mark.parametrize("stride", [1, 2])
def test_dgrad_split_k_with_epilogue_and_reductions(split, stride, rng):
    g, _, _, dx = dgrad_graph((2, 8, 6, 6), (40, 8, 3, 3), padding=[1, 1], stride=[stride, stride])
    yf = g.tensor(dim=[2, 8, 6, 6], stride=nhwc([2, 8, 6, 6]), name="yf")
    dz = g.relu_backward(dx, yf).set_output(True)
    s = g.reduction(dz, mode="ADD").set_dim([1, 8, 1, 1])
    s.set_output(True)
    plan = plan_with(g, {"SPLIT_K": split, "BLOCK_K": 16, "BLOCK_M": 16})
    assert len(plan.steps[0].kernel.generated.launches) == 3  # main, split-K epilogue, reduction combine
    _check(plan, rng)


@pytest.mark.parametrize(
    "knobs",
    [{"PERSISTENT": 3}, {"PERSISTENT": 2, "SPLIT_K": 2, "BLOCK_K": 16}, {"EPILOGUE_SUBTILE": 2, "BLOCK_N": 32}],
    ids=str,
)
@pytest.mark.parametrize("stride", [1, 2])
def test_dgrad_gemm_knobs_of_the_shared_machinery(knobs, stride, rng):
    """dgrad runs gemm.py's generate: persistent programs and epilogue subtiles work with phases too."""
    g, _, _, dx = dgrad_graph((2, 16, 6, 6), (40, 16, 3, 3), padding=[1, 1], stride=[stride, stride])
    yf = g.tensor(dim=[2, 16, 6, 6], stride=nhwc([2, 16, 6, 6]), name="yf")
    g.relu_backward(dx, yf).set_output(True)
    _check(plan_with(g, knobs), rng)


def test_dgrad_stencil_has_no_dot_and_fuses_drelu(rng):
    g, _, _, dx = dgrad_graph((2, 16, 6, 6), (16, 1, 3, 3), padding=[1, 1], stride=[2, 2])
    yf = g.tensor(dim=[2, 16, 6, 6], stride=nhwc([2, 16, 6, 6]), name="yf")
    g.relu_backward(dx, yf).set_output(True)
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert "tl.dot" not in plan.source(0)


# -- wgrad: split-K, taps per program, stencil --------------------------------------------------------------


@pytest.mark.parametrize(
    "knobs",
    [
        {"TAPS": 3},
        {"TAPS": 3, "SPLIT_K": 3},
        {"TAPS": 9, "SPLIT_K": 12},
        {"SPLIT_K": 10},
        {"TAPS": 9, "SPLIT_K": 5, "COMBINE_M": 16, "COMBINE_N": 16},
        {"SPLIT_K": 7, "EPILOGUE_SUBTILE": 2, "BLOCK_N": 32},
    ],
    ids=str,
)
@pytest.mark.parametrize("grouped", [False, True], ids=["dense", "groups"])
def test_wgrad_split_and_taps_per_program(knobs, grouped, rng):
    xd, wd = ((2, 16, 5, 6), (32, 8, 3, 3)) if grouped else ((2, 8, 6, 5), (16, 8, 3, 3))
    g, _, _, dw = wgrad_graph(xd, wd, padding=[1, 1])
    w = g.tensor(dim=list(wd), stride=nhwc(list(wd)), name="w")
    g.add(dw, w).set_output(True)  # an epilogue reading a tensor in the filter's layout
    plan = plan_with(g, {"BLOCK_K": 16, **knobs})
    if knobs.get("SPLIT_K", 1) > 1:
        assert "kernel_epilogue" in plan.source(0)
    _check(plan, rng)


def test_wgrad_taps_must_divide_the_filter():
    g, _, _, dw = wgrad_graph((2, 8, 6, 6), (16, 8, 3, 3), padding=[1, 1])
    dw.set_output(True)
    piece = make_piece(g.final, 0, g.final.nodes)
    with pytest.raises(AttributeValueError, match="TAPS=2 must divide"):
        _template("conv_wgrad").generate(
            piece, {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "TAPS": 2}, og.core.device.CPU
        )


def test_wgrad_heuristic_splits_the_pixels(rng):
    g, _, _, dw = wgrad_graph((4, 8, 8, 8), (16, 8, 3, 3), padding=[1, 1])
    dw.set_output(True)
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert plan.steps[0].config.knob("SPLIT_K") > 1


def test_gpu_heuristic_of_sbr_wgrad_keeps_the_prologue_tiles_lean():
    """With the scale + bias + relu prologue on the image, the first fused config is 32x64 with 3 taps a
    program (the autotuner's choice on an H100, 0.74x the cost model's 64x64); without it, 64x64."""
    from opgraph.core.device import Device
    from opgraph.core.piece import make_piece

    h100 = Device("cuda", 0, "NVIDIA H100 80GB HBM3", (9, 0), 132)
    template = _template("conv_wgrad")

    def cands(g):
        return template.candidates(make_piece(g.final, 0, g.final.nodes), h100)

    sbr = cands(sbr_wgrad(n=32, c=64, k=64, hw=56, intermediate=DT.HALF)[0])
    fused = next(c for c in sbr if not c.get("PROLOGUE_PASS"))
    assert (fused["BLOCK_M"], fused["BLOCK_N"], fused["TAPS"]) == (32, 64, 3)
    plain = cands(_stored(wgrad_graph((32, 64, 56, 56), (64, 64, 3, 3), padding=[1, 1])))[0]
    assert (plain["BLOCK_M"], plain["BLOCK_N"], plain["TAPS"]) == (64, 64, 3)
    # nine taps: first the prologue as its own pass, then the plain wgrad's config (64.6 µs fused against
    # 30.5 plain + ~11 for the pass, bf16, H100, 2026-11-26)
    assert sbr[0] == {**plain, "PROLOGUE_PASS": 1}


@pytest.mark.parametrize("knobs", [{"SPLIT_K": 1}, {"SPLIT_K": 3}, {"SPLIT_K": 3, "BLOCK_K": 8}], ids=str)
def test_wgrad_depthwise_stencil(knobs, rng):
    """(8 pixels a step: no tl.dot needs 16; the GPU heuristic offers it for wide channel blocks)"""
    g, _, _, dw = wgrad_graph((2, 16, 6, 7), (16, 1, 3, 3), pre_padding=[1, 0], post_padding=[1, 2], stride=[1, 2])
    w = g.tensor(dim=[16, 1, 3, 3], stride=nhwc([16, 1, 3, 3]), name="w")
    g.sub(w, g.mul(dw, 0.5)).set_output(True)
    plan = plan_with(g, knobs)
    assert "tl.dot" not in plan.source(0)
    _check(plan, rng)


def test_wgrad_depthwise_stencil_many_taps_loops(rng):
    g, _, _, dw = wgrad_graph((1, 8, 4, 5, 4), (8, 1, 3, 3, 4), padding=[1, 1, 1])
    dw.set_output(True)
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert "for tap in range(36)" in plan.source(0)


@pytest.mark.parametrize("knobs", [{}, {"SPLIT_K": 3}, {"TAPS": 3}, {"TAPS": 3, "SPLIT_K": 2}], ids=str)
def test_wgrad_reductions_of_dw(knobs, rng):
    """Per-filter gradient norms (rows and taps reduced, as for LARS or clipping) and a sum over the
    filters (the tile's columns), in the combine launch when the pixels are split."""
    g, _, _, dw = wgrad_graph((2, 8, 6, 6), (16, 8, 3, 3), padding=[1, 1])
    dw.set_output(True)
    g.reduction(dw, mode="NORM2").set_dim([16, 1, 1, 1]).set_output(True)
    g.reduction(dw, mode="ADD").set_dim([1, 8, 3, 3]).set_output(True)
    _check(plan_with(g, knobs), rng, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("op", ["dgrad", "wgrad"])
def test_int8_depthwise(op, rng):
    build = dgrad_graph if op == "dgrad" else wgrad_graph
    g, _, _, out = build((2, 16, 5, 5), (16, 1, 3, 3), dt=DT.INT8, padding=[1, 1])
    out.set_output(True).set_data_type(DT.INT32)
    plan = assert_engine_matches(g, rng, expect_steps=1, rtol=0, atol=0)
    assert "tl.dot" not in plan.source(0)


# -- data types ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["dgrad", "wgrad"])
@pytest.mark.parametrize("dt", [DT.HALF, DT.BFLOAT16, DT.FLOAT], ids=lambda d: d.name)
def test_dtypes(op, dt, rng):
    build = dgrad_graph if op == "dgrad" else wgrad_graph
    g, _, _, out = build((2, 16, 5, 5), (16, 16, 3, 3), dt=dt, padding=[1, 1])
    g.mul(out, 0.5).set_output(True)
    assert_engine_matches(g, rng, expect_steps=1)


@pytest.mark.parametrize("op", ["dgrad", "wgrad"])
def test_int8_int32_output(op, rng):
    build = dgrad_graph if op == "dgrad" else wgrad_graph
    g, _, _, out = build((2, 16, 5, 5), (16, 16, 3, 3), dt=DT.INT8, padding=[1, 1])
    out.set_output(True).set_data_type(DT.INT32)
    assert_engine_matches(g, rng, expect_steps=1, rtol=0, atol=0)


@pytest.mark.parametrize("op", ["dgrad", "wgrad"])
def test_fp32_tf32_knob_and_note(op):
    build = dgrad_graph if op == "dgrad" else wgrad_graph
    g, _, _, out = build((1, 16, 4, 4), (16, 16, 3, 3), dt=DT.FLOAT, padding=[1, 1])
    out.set_output(True)
    piece = make_piece(g.final, 0, g.final.nodes)
    template = _template(f"conv_{op}")
    cands = template.candidates(piece, og.core.device.CPU)
    assert {c["fp32_precision"] for c in cands} == {"tf32", "ieee"}
    assert template.notes(piece, {**cands[0], "fp32_precision": "tf32"}, H100) == {NumericalNote.DOWN_CONVERT_INPUTS}
    assert template.notes(piece, {**cands[0], "fp32_precision": "ieee"}, H100) == frozenset()
    gpu = template.candidates(piece, H100)
    source = template.generate(piece, {**gpu[0], "fp32_precision": "tf32"}, H100).source
    assert 'input_precision="tf32"' in source


def test_half_virtual_dx_is_rounded_before_the_epilogue(rng):
    g, _, _, dx = dgrad_graph((1, 16, 4, 4), (16, 16, 3, 3), dt=DT.FLOAT, padding=[1, 1])
    dx.set_data_type(DT.HALF)
    g.sub(g.mul(dx, 1.0 / 3.0), g.mul(dx, 0.25)).set_output(True)
    assert_engine_matches(g, rng, expect_steps=1, rtol=1e-6, atol=1e-6)


# -- backward fusions: one piece each ---------------------------------------------------------------------


def dgrad_drelu(n=2, c=8, k=16, hw=6, r=3, *, dt=DT.HALF, stride=1):
    """The cuDNN frontend's dgrad + drelu pattern: dx = relu_backward(conv_dgrad(dy, w), y_fwd)."""
    xd = [n, c, hw, hw]
    g, _, _, dx = dgrad_graph(xd, (k, c, r, r), dt=dt, padding=[r // 2, r // 2], stride=[stride, stride])
    yf = g.tensor(dim=xd, stride=nhwc(xd), name="y_fwd")
    g.relu_backward(dx, yf, name="drelu").set_output(True).set_name("dx")
    return g


@pytest.mark.parametrize("stride", [1, 2])
def test_pattern_dgrad_drelu_is_one_piece(stride, rng):
    g = dgrad_drelu(stride=stride)
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert templates(plan) == ["conv_dgrad"]
    g.build(device="cpu", engines=["triton"], allow_partition=False)


def bn_backward_inputs(n=2, c=8, k=16, hw=6):
    """dgrad -> drelu -> dz, then the inputs of the next batchnorm backward in the same kernel: dz*scale,
    dbias = sum(dz) and dscale = sum(dz * x_hat) per channel, x_hat = (x - mean) * inv_std."""
    xd, cd = [n, c, hw, hw], [1, c, 1, 1]
    g, _, _, dx = dgrad_graph(xd, (k, c, 3, 3), padding=[1, 1])
    yf = g.tensor(dim=xd, stride=nhwc(xd), name="y_fwd")
    x = g.tensor(dim=xd, stride=nhwc(xd), name="x")
    mean = g.tensor(dim=cd, data_type=DT.FLOAT, name="mean")
    inv_std = g.tensor(dim=cd, data_type=DT.FLOAT, name="inv_std")
    scale = g.tensor(dim=cd, data_type=DT.FLOAT, name="scale")
    dz = g.relu_backward(dx, yf).set_output(True).set_name("dz")
    g.mul(dz, scale).set_output(True).set_name("dz_scaled")
    g.reduction(dz, mode="ADD").set_dim(cd).set_output(True).set_name("dbias")
    xhat = g.mul(g.sub(x, mean), inv_std)
    g.reduction(g.mul(dz, xhat), mode="ADD").set_dim(cd).set_output(True).set_name("dscale")
    return g


def test_dgrad_batchnorm_backward_inputs(rng):
    g = bn_backward_inputs()
    plan = assert_engine_matches(g, rng, expect_steps=1, rtol=1e-3, atol=1e-3)
    assert templates(plan) == ["conv_dgrad"]


def test_dgrad_genstats_of_dx(rng):
    g, _, _, dx = dgrad_graph((3, 8, 6, 6), (16, 8, 3, 3), padding=[1, 1], stride=[2, 2])
    dx.set_output(True)
    s, sq = g.genstats(dx)
    s.set_output(True)
    sq.set_output(True)
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert templates(plan) == ["conv_dgrad"]


def test_dgrad_prologue_on_the_loss(rng):
    """dy computed in the prologue (relu_backward of the next layer's gradient), zero where padded."""
    g = _graph("dgrad_prologue", DT.HALF)
    yd = [2, 16, 6, 6]
    raw = g.tensor(dim=yd, stride=nhwc(yd), name="raw")
    act = g.tensor(dim=yd, name="act")  # NCHW next to NHWC
    w = g.tensor(dim=[16, 8, 3, 3], stride=nhwc([16, 8, 3, 3]), name="w")
    g.conv_dgrad(g.relu_backward(raw, act), w, padding=[1, 1]).set_output(True)
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert templates(plan) == ["conv_dgrad"]


def sbr_wgrad(n=2, c=8, k=16, hw=6, r=3, *, dt=DT.HALF, intermediate=DT.FLOAT, padding=1, stride=1, sgd=False):
    """The ResNet training pattern: relu(x*s + b) -> conv_wgrad (+ W - lr * DW)."""
    g = _graph("sbr_wgrad", dt, intermediate)
    xd, wd, cd = [n, c, hw, hw], [k, c, r, r], [1, c, 1, 1]
    yd = _loss_dims(xd, wd, dict(padding=[padding] * 2, stride=[stride] * 2))
    x = g.tensor(dim=xd, stride=nhwc(xd), name="X")
    dy = g.tensor(dim=yd, stride=nhwc(yd), name="DY")
    s = g.tensor(dim=cd, stride=nhwc(cd), name="S")
    b = g.tensor(dim=cd, stride=nhwc(cd), name="B")
    a = g.relu(g.bias(g.scale(x, s, name="scale"), b, name="bias"), name="relu")
    dw = g.conv_wgrad(a, dy, padding=[padding] * 2, stride=[stride] * 2, name="wgrad").set_dim(wd)
    dw.set_stride(nhwc(wd))
    if not sgd:
        dw.set_output(True).set_name("DW")
        return g, b
    w = g.tensor(dim=wd, stride=nhwc(wd), name="W")
    lr = g.tensor(dim=[1], data_type=DT.FLOAT, name="lr")
    g.sub(w, g.mul(dw, lr), name="sgd").set_output(True).set_name("W_new")
    return g, b


@pytest.mark.parametrize("intermediate", [DT.HALF, DT.FLOAT], ids=lambda d: d.name)
@pytest.mark.parametrize("stride", [1, 2])
def test_pattern_sbr_wgrad_is_one_piece(intermediate, stride, rng):
    """The padding of the image must read 0 after the prologue, not relu(b) (b > 0 here)."""
    g, b = sbr_wgrad(intermediate=intermediate, stride=stride)
    plan = assert_engine_matches(g, rng, expect_steps=1, prepare=lambda p: p[b.uid].__iadd__(3.0))
    assert templates(plan) == ["conv_wgrad"]
    g.build(device="cpu", engines=["triton"], allow_partition=False)


@pytest.mark.parametrize("knobs", [{}, {"TAPS": 3, "SPLIT_K": 4}, {"SPLIT_K": 1}], ids=str)
def test_wgrad_sgd_step_is_one_piece_and_reads_lr_at_run_time(knobs, rng):
    """W_new = W - lr * DW with SBR on the image: one kernel (plus the split-K combine); lr lives in
    device memory, so a new learning rate needs no rebuild."""
    g, b = sbr_wgrad(sgd=True, intermediate=DT.HALF)
    plan = plan_with(g, knobs)
    assert templates(plan) == ["conv_wgrad"]
    final = plan.graph
    lr_uid = next(u for u in final.inputs if final.tensors[u].name == "lr")
    for value in (0.5, -2.0):
        _check(plan, rng, prepare=lambda p, v=value: p[lr_uid].fill(v))


def test_pattern_wgrad_sgd_strict(rng):
    g, _ = sbr_wgrad(sgd=True)
    g.build(device="cpu", engines=["triton"], allow_partition=False)


def test_wgrad_prologue_on_the_loss_and_cast_epilogue(rng):
    g = _graph("wgrad_pro", DT.HALF)
    xd, yd = [2, 8, 6, 6], [2, 16, 6, 6]
    x = g.tensor(dim=xd, stride=nhwc(xd), name="x")
    raw = g.tensor(dim=yd, stride=nhwc(yd), name="raw")
    act = g.tensor(dim=yd, name="act")  # NCHW next to NHWC
    dw = g.conv_wgrad(x, g.relu_backward(raw, act), padding=[1, 1]).set_dim([16, 8, 3, 3])
    g.identity(g.mul(dw, 0.25)).set_output(True).set_data_type(DT.BFLOAT16)
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert templates(plan) == ["conv_wgrad"]


# -- every candidate ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["dgrad", "wgrad"])
def test_every_candidate_matches(op, rng):
    if op == "dgrad":
        g = dgrad_drelu(stride=2, k=24)
    else:
        g, _ = sbr_wgrad(sgd=True, n=3)
    assert_candidates_match(*candidate_configs(g), rng)


@pytest.mark.parametrize("op", ["dgrad", "wgrad"])
def test_gpu_candidates_generate(op):
    """The GPU knob lists (ranked by the cost model) generate for the benchmark shape, and the wgrad
    defaults split the 100k-pixel reduction over the SMs."""
    g = gpu_dgrad_drelu() if op == "dgrad" else gpu_wgrad()[0]
    piece = make_piece(g.final, 0, g.final.nodes)
    template = _template(f"conv_{op}")
    cands = template.candidates(piece, H100)
    assert len(cands) >= 3
    for knobs in cands:
        template.generate(piece, knobs, H100)
        assert template.estimate(piece, knobs, H100) > 0
    if op == "wgrad":
        first = cands[0]
        assert first["SPLIT_K"] >= 16
        programs = first["SPLIT_K"] * 9 // first.get("TAPS", 1)
        assert programs >= H100.sm_count


# -- fuzzers --------------------------------------------------------------------------------------------------


def _fuzz_geometry(rng):
    nsp = int(rng.choice([1, 2, 2, 3]))
    depthwise = rng.random() < 0.2
    groups = 1 if depthwise else int(rng.choice([1, 1, 2]))
    cg = 1 if depthwise else int(rng.choice([3, 8, 16, 20]))
    c = 8 * int(rng.integers(1, 3)) if depthwise else cg * groups
    k = c * int(rng.choice([1, 1, 2])) if depthwise else groups * int(rng.choice([8, 16, 24]))
    taps = [int(rng.choice([1, 2, 3])) for _ in range(nsp)]
    dil = [int(rng.choice([1, 1, 2])) for _ in range(nsp)]
    stride = [int(rng.choice([1, 1, 2, 3])) for _ in range(nsp)]
    pre = [int(rng.integers(0, 3)) for _ in range(nsp)]
    post = [int(rng.integers(0, 3)) for _ in range(nsp)]
    size = {1: 12, 2: 6, 3: 4}[nsp]
    x_sp = [int(max(size + rng.integers(-1, 2), (t - 1) * d + 1)) for t, d in zip(taps, dil)]
    n = int(rng.integers(1, 3))
    return dict(
        x=(n, c, *x_sp),
        w=(k, cg, *taps),
        pre_padding=pre,
        post_padding=post,
        stride=stride,
        dilation=dil,
        convolution_mode=str(rng.choice(["cross_correlation", "convolution"])),
    )


def fuzz_dgrad(seed: int) -> og.Graph:
    rng = np.random.default_rng(seed)
    geo = _fuzz_geometry(rng)
    dt = rng.choice([DT.HALF, DT.BFLOAT16, DT.FLOAT])
    layout = str(rng.choice(["nhwc", "nchw"]))
    xd, wd = geo.pop("x"), geo.pop("w")
    g, dy, w, dx = dgrad_graph(xd, wd, dt=dt, layout=layout, **geo)
    cd = [1, xd[1]] + [1] * (len(xd) - 2)
    epi = rng.choice(["none", "drelu", "drelu_bn", "scale_mask", "genstats"])
    if epi == "none":
        dx.set_output(True)
    elif epi == "drelu":
        other = "nchw" if layout == "nhwc" else "nhwc"
        yf = g.tensor(dim=list(xd), stride=layout_stride(xd, other), name="yf")
        g.relu_backward(dx, yf).set_output(True)
    elif epi == "drelu_bn":
        yf = g.tensor(dim=list(xd), stride=layout_stride(xd, layout), name="yf")
        dz = g.relu_backward(dx, yf).set_output(True)
        g.reduction(dz, mode="ADD").set_dim(cd).set_output(True)
        g.reduction(
            g.mul(dz, g.tensor(dim=list(xd), stride=layout_stride(xd, layout), name="xhat")), mode="ADD"
        ).set_dim(cd).set_output(True)
    else:
        scale_mask_or_genstats(g, dx, epi)
    return g


def fuzz_wgrad(seed: int) -> og.Graph:
    rng = np.random.default_rng(seed)
    geo = _fuzz_geometry(rng)
    dt = rng.choice([DT.HALF, DT.BFLOAT16, DT.FLOAT])
    layout = str(rng.choice(["nhwc", "nchw"]))
    xd, wd = geo.pop("x"), geo.pop("w")
    g = _graph(f"fuzz_wgrad{seed}", dt)
    yd = _loss_dims(xd, wd, geo)
    x = g.tensor(dim=list(xd), stride=layout_stride(xd, layout), name="x")
    dy = g.tensor(dim=yd, stride=layout_stride(yd, layout), name="dy")
    if rng.random() < 0.4:
        cd = [1, xd[1]] + [1] * (len(xd) - 2)
        x = g.relu(g.bias(g.scale(x, g.tensor(dim=cd, name="s")), g.tensor(dim=cd, name="b")))
    dw = g.conv_wgrad(x, dy, **geo).set_dim(list(wd))
    if layout == "nhwc":
        dw.set_stride(nhwc(list(wd)))
    epi = rng.choice(["none", "sgd", "scale"])
    if epi == "none":
        dw.set_output(True)
    elif epi == "sgd":
        w = g.tensor(dim=list(wd), stride=layout_stride(wd, layout), name="w")
        lr = g.tensor(dim=[1], data_type=DT.FLOAT, name="lr")
        g.sub(w, g.mul(dw, lr)).set_output(True)
    else:
        dw.set_output(True)
        g.mul(dw, -1.0).set_output(True)
    return g


@pytest.mark.parametrize("seed", range(24))
def test_fuzz_dgrad(seed, rng):
    """Random geometry (strides up to 3, dilation, asymmetric padding, groups, depthwise), layout, type
    and epilogue; small-integer inputs make every result exact, so the comparison is exact too."""
    assert_engine_matches(fuzz_dgrad(seed), rng, expect_steps=1, **EXACT)


@pytest.mark.parametrize("seed", range(24))
def test_fuzz_wgrad(seed, rng):
    assert_engine_matches(fuzz_wgrad(seed), rng, expect_steps=1, **EXACT)


@pytest.mark.parametrize("seed", range(6))
def test_fuzz_dgrad_masked_path(seed, rng):
    g = fuzz_dgrad(100 + seed)
    _check(plan_with(g, {"PHASES": 0}), rng, **EXACT)


@pytest.mark.parametrize("seed", range(6))
def test_fuzz_wgrad_forced_split_and_taps(seed, rng):
    g = fuzz_wgrad(100 + seed)
    plan = g.build(device="cpu", engines=["triton"])
    ntaps = int(np.prod(plan.graph.tensors[plan.steps[0].piece.nodes[-1].output_uids()[0]].dim[2:]))
    knobs = {"SPLIT_K": 3 + seed % 3}
    if seed % 2:
        knobs["TAPS"] = max(t for t in range(1, 4) if ntaps % t == 0)
    _check(plan_with(g, knobs), rng, **EXACT)


# -- compiled for Hopper (no GPU needed): registers and spills of the default configs ----------------------


def gpu_dgrad_drelu():
    return dgrad_drelu(n=32, c=64, k=64, hw=56)


def gpu_wgrad():
    g = _graph("wgrad", DT.HALF)
    xd, yd, wd = [32, 64, 56, 56], [32, 64, 56, 56], [64, 64, 3, 3]
    x = g.tensor(dim=xd, stride=nhwc(xd), name="x")
    dy = g.tensor(dim=yd, stride=nhwc(yd), name="dy")
    g.conv_wgrad(x, dy, padding=[1, 1]).set_dim(wd).set_stride(nhwc(wd)).set_output(True)
    return g, x


def _fuzz_dgrad_sigmoid_grad():
    """Fuzz seed 20261126603140: a strided 1-D conv_dgrad whose accumulator feeds sigmoid_backward (its
    exp(-|x|)) and sin; wrong on an H100 while |x| was an `and` of the sign bit."""
    from pathlib import Path

    from ..fuzz.replay import load
    from ..fuzz.runner import graph_of

    return graph_of(load(Path(__file__).parents[1] / "fuzz" / "regressions" / "seed20261126603140.json"))


def _dgrad_times_minus_one():
    """Issue 38: a 1-D conv_dgrad (dy expanded over the batch, dilation [1, 2]) times the literal -1,
    -0.0 for -24.0 on an H200 while `acc * -1.0` compiled to a sign-bit xor of the accumulator."""
    from pathlib import Path

    from ..fuzz.replay import load
    from ..fuzz.runner import graph_of

    return graph_of(load(Path(__file__).parents[1] / "fuzz" / "regressions" / "issue38-dgrad-neg.json"))


HOPPER_CASES = {  # the benchmark shapes: (graph, template, how many of its first candidates)
    "fuzz_dgrad_sigmoid_grad": (_fuzz_dgrad_sigmoid_grad, "conv_dgrad", 1),
    "dgrad_times_minus_one": (_dgrad_times_minus_one, "conv_dgrad", None),
    "dgrad_drelu": (gpu_dgrad_drelu, "conv_dgrad", 2),
    "dgrad_drelu_stride2": (lambda: dgrad_drelu(n=32, c=64, k=64, hw=56, stride=2), "conv_dgrad", 1),
    "wgrad": (lambda: gpu_wgrad()[0], "conv_wgrad", 3),
    "sbr_wgrad_half": (lambda: sbr_wgrad(n=32, c=64, k=64, hw=56, intermediate=DT.HALF, sgd=True)[0], "conv_wgrad", 1),
    "sbr_wgrad_float": (lambda: sbr_wgrad(n=32, c=64, k=64, hw=56)[0], "conv_wgrad", 1),
    "wgrad_depthwise": (
        lambda: _stored(wgrad_graph((32, 256, 28, 28), (256, 1, 3, 3), padding=[1, 1])),
        "conv_wgrad",
        1,
    ),
    "wgrad_depthwise_8_pixel_steps": (
        lambda: _stored(wgrad_graph((32, 256, 28, 28), (256, 1, 3, 3), padding=[1, 1])),
        "conv_wgrad",
        lambda candidates: [c for c in candidates if c["BLOCK_K"] == 8],
    ),
    "dgrad_depthwise": (
        lambda: _stored(dgrad_graph((32, 256, 28, 28), (256, 1, 3, 3), padding=[1, 1])),
        "conv_dgrad",
        1,
    ),
    "dgrad_bf16_groups_stride3": (
        lambda: _stored(
            dgrad_graph(
                (8, 64, 30, 29), (128, 32, 3, 3), dt=DT.BFLOAT16, padding=[2, 1], stride=[3, 2], dilation=[2, 1]
            )
        ),
        "conv_dgrad",
        1,
    ),
    "dgrad_bn_backward": (lambda: bn_backward_inputs(n=32, c=64, k=64, hw=56), "conv_dgrad", 1),
    "wgrad_int8": (
        lambda: _stored(wgrad_graph((8, 64, 28, 28), (64, 64, 3, 3), dt=DT.INT8, padding=[1, 1]), DT.INT32),
        "conv_wgrad",
        1,
    ),
    "wgrad_depthwise_3d": (
        lambda: _stored(wgrad_graph((4, 64, 8, 8, 8), (64, 1, 3, 3, 4), padding=[1, 1, 1])),
        "conv_wgrad",
        1,
    ),
}


def _stored(built, dt=None):
    g, *_, out = built
    out.set_output(True)
    if dt is not None:
        out.set_data_type(dt)
    return g


def test_kernels_compile_for_hopper_without_spills():
    out = compile_for_hopper(__name__, timeout=900)
    lines = [line for line in out.splitlines() if line.startswith("compiled")]
    assert len(lines) >= 2 * len(HOPPER_CASES)
    spilled = [line for line in lines if " spills 0 " not in line]
    assert not spilled, "\n".join(spilled)
    signed = [line for line in lines if " signbit 0 " not in line]  # abs / neg of accumulators as instructions
    assert not signed, "\n".join(signed)


# -- GPU, realistic sizes ------------------------------------------------------------------------------------


@pytest.mark.gpu
@requires_cuda
def test_gpu_dgrad_drelu_resnet(rng):
    plan = assert_engine_matches(gpu_dgrad_drelu(), rng, device="cuda", expect_steps=1, **EXACT)
    assert templates(plan) == ["conv_dgrad"]


@pytest.mark.gpu
@requires_cuda
def test_gpu_dgrad_drelu_stride2(rng):
    g = dgrad_drelu(n=32, c=64, k=128, hw=56, stride=2)
    assert_engine_matches(g, rng, device="cuda", expect_steps=1, **EXACT)


@pytest.mark.gpu
@requires_cuda
def test_gpu_wgrad_resnet(rng):
    plan = assert_engine_matches(gpu_wgrad()[0], rng, device="cuda", expect_steps=1, **EXACT)
    assert templates(plan) == ["conv_wgrad"]


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("intermediate", [DT.HALF, DT.FLOAT], ids=lambda d: d.name)
def test_gpu_sbr_wgrad_sgd(intermediate, rng):
    g, _ = sbr_wgrad(n=32, c=64, k=64, hw=56, intermediate=intermediate, sgd=True)
    plan = assert_engine_matches(g, rng, device="cuda", expect_steps=1, **EXACT)
    assert templates(plan) == ["conv_wgrad"]


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("op", ["dgrad", "wgrad"])
@pytest.mark.parametrize("dt", [DT.HALF, DT.BFLOAT16, DT.FLOAT], ids=lambda d: d.name)
def test_gpu_dtypes(op, dt, rng):
    build = dgrad_graph if op == "dgrad" else wgrad_graph
    g, _, _, out = build((8, 64, 28, 28), (128, 64, 3, 3), dt=dt, padding=[1, 1], stride=[2, 2])
    out.set_output(True)
    assert_engine_matches(g, rng, device="cuda", expect_steps=1, **EXACT)


@pytest.mark.gpu
@requires_cuda
def test_gpu_depthwise_backward(rng):
    g, _, _, dw = wgrad_graph((32, 256, 28, 28), (256, 1, 3, 3), padding=[1, 1])
    dw.set_output(True)
    assert_engine_matches(g, rng, device="cuda", expect_steps=1, **EXACT)
    g, _, _, dx = dgrad_graph((32, 256, 28, 28), (256, 1, 3, 3), padding=[1, 1])
    dx.set_output(True)
    assert_engine_matches(g, rng, device="cuda", expect_steps=1, **EXACT)


@pytest.mark.gpu
@requires_cuda
def test_gpu_depthwise_wgrad_every_candidate(rng):
    """Every GPU candidate of a depthwise wgrad, the 8-pixel steps of 128 channels (no tl.dot) among them."""
    from opgraph.core.config import HeurMode

    g, _, _, dw = wgrad_graph((8, 144, 28, 28), (144, 1, 3, 3), padding=[1, 1])
    dw.set_output(True)
    plan = g.build(device="cuda", engines=["triton"], heur_mode=[HeurMode.B])
    step = plan.steps[0]
    configs = (step.config, *step.alternatives)
    assert any(c.knob("BLOCK_K") == 8 for c in configs)
    assert_candidates_match(plan, step, configs, rng, **EXACT)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("seed", range(8))
def test_gpu_fuzz(seed, rng):
    assert_engine_matches(fuzz_dgrad(seed), rng, device="cuda", expect_steps=1, **EXACT)
    plan = assert_engine_matches(fuzz_wgrad(seed), rng, device="cuda", **EXACT)
    # one kernel, unless the wgrad has too few channels per group to take its epilogue on the GPU
    assert len(plan.steps) == 1 or (len(plan.steps) == 2 and "input channel(s) per group" in plan.describe())


def test_wgrad_with_a_few_channels_fuses_nothing_on_the_gpu():
    """A stem-like wgrad (3 input channels) wastes most of each GEMM tile: on CUDA it runs alone (where a
    library convolution can take it) rather than with an epilogue; on the CPU it still fuses."""
    g, x, dy, dw = wgrad_graph((2, 3, 16, 16), (8, 3, 7, 7), padding=[3, 3], stride=[2, 2])
    g.mul(dw, 0.5, name="scaled").set_output(True)
    g.validate()
    fused = make_piece(g.final, 0, list(g.final.nodes))
    alone = make_piece(g.final, 0, list(g.final.nodes)[:1])
    verdict = _template("conv_wgrad").match(fused, H100)
    assert not verdict.ok and "3 input channel(s)" in verdict.reason
    assert _template("conv_wgrad").match(alone, H100).ok
    assert _template("conv_wgrad").match(fused, Device("cpu", 0, "cpu")).ok
    g, x, dy, dw = wgrad_graph((2, 8, 16, 16), (8, 8, 3, 3), padding=[1, 1])
    g.mul(dw, 0.5, name="scaled").set_output(True)
    g.validate()
    assert _template("conv_wgrad").match(make_piece(g.final, 0, list(g.final.nodes)), H100).ok
