"""The Triton conv_fprop (implicit GEMM) and depthwise templates against the reference engine: every
geometry class, prologues, epilogues, reductions, data types and the cuDNN frontend's conv fusion
patterns, each built as one fused piece; a seeded fuzzer on small integers (exact results). Under
the interpreter on the CPU with tiny shapes; marked gpu, on CUDA at ResNet sizes."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph.core.device import CPU, Device
from opgraph.core.config import EngineConfig, NumericalNote, Support
from opgraph.engines import get_engine
from opgraph.engines.triton import TEMPLATES
from opgraph.core.piece import make_piece
from opgraph.runtime.plan import ExecutionPlan
from opgraph.build.planner import Step
from opgraph.tools.samples import nhwc

from ..helpers import (
    assert_candidates_match,
    assert_engine_matches,
    candidate_configs,
    layout_stride,
    plan_with,
    requires_cuda,
    requires_interpreter,
    scale_mask_or_genstats,
    step_plan,
    templates,
)
from .hopper_compile import compile_for_hopper

pytestmark = pytest.mark.interpreter
DT = og.DataType


def conv_graph(x_dims, w_dims, *, dt=DT.HALF, layout="nhwc", name="conv", out_dt=None, **conv):
    """x -> conv -> y (an output); returns (graph, x, w, y)."""
    g = og.Graph(name, io_data_type=dt, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    x = g.tensor(dim=list(x_dims), stride=layout_stride(x_dims, layout), name="x")
    w = g.tensor(dim=list(w_dims), stride=layout_stride(w_dims, layout), name="w")
    y = g.conv_fprop(x, w, name="conv", **conv)
    return g, x, w, y


# -- geometry -------------------------------------------------------------------------------------------

GEOMETRIES = {
    "1d": dict(x=(2, 8, 11), w=(16, 8, 3), padding=[1]),
    "1d_stride_dilation": dict(x=(2, 8, 17), w=(16, 8, 3), padding=[2], stride=[2], dilation=[2]),
    "2d_3x3": dict(x=(2, 8, 6, 6), w=(16, 8, 3, 3), padding=[1, 1]),
    "2d_1x1": dict(x=(2, 16, 5, 5), w=(8, 16, 1, 1)),
    "2d_asymmetric": dict(x=(2, 8, 6, 7), w=(16, 8, 3, 2), pre_padding=[0, 2], post_padding=[2, 1]),
    "2d_stride2": dict(x=(2, 8, 9, 8), w=(16, 8, 3, 3), padding=[1, 1], stride=[2, 2]),
    "2d_dilation": dict(x=(2, 8, 9, 9), w=(16, 8, 3, 3), padding=[2, 2], dilation=[2, 2]),
    "2d_rect_filter_stride": dict(x=(1, 8, 10, 9), w=(16, 8, 1, 5), padding=[0, 2], stride=[3, 1]),
    "2d_groups": dict(x=(2, 16, 5, 5), w=(32, 8, 3, 3), padding=[1, 1]),
    "2d_groups4": dict(x=(2, 32, 4, 4), w=(32, 8, 3, 3), padding=[1, 1]),
    "2d_ragged_channels": dict(x=(2, 20, 5, 5), w=(24, 20, 3, 3), padding=[1, 1]),
    "3d": dict(x=(1, 8, 4, 5, 4), w=(16, 8, 3, 3, 3), padding=[1, 1, 1]),
    "3d_stride_asym": dict(
        x=(1, 8, 5, 6, 5), w=(16, 8, 2, 3, 3), pre_padding=[1, 0, 1], post_padding=[0, 1, 2], stride=[2, 1, 2]
    ),
}


@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
@pytest.mark.parametrize("case", sorted(GEOMETRIES))
def test_geometry(case, layout, rng):
    spec = dict(GEOMETRIES[case])
    g, _, _, y = conv_graph(spec.pop("x"), spec.pop("w"), layout=layout, **spec)
    y.set_output(True)
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert templates(plan) == ["conv_fprop"]


def test_convolution_mode_flips_the_filter(rng):
    g, _, _, y = conv_graph((2, 8, 6, 5), (16, 8, 3, 2), padding=[1, 1], convolution_mode="convolution")
    y.set_output(True)
    assert_engine_matches(g, rng, expect_steps=1)


# -- depthwise ------------------------------------------------------------------------------------------

DEPTHWISE = {
    "3x3": dict(x=(2, 16, 6, 6), w=(16, 1, 3, 3), padding=[1, 1]),
    "3x3_stride2": dict(x=(2, 16, 7, 7), w=(16, 1, 3, 3), padding=[1, 1], stride=[2, 2]),
    "5x5_dilation_asym": dict(
        x=(1, 24, 8, 7), w=(24, 1, 3, 3), pre_padding=[2, 1], post_padding=[1, 2], dilation=[2, 1]
    ),
    "multiplier2": dict(x=(2, 8, 5, 5), w=(16, 1, 3, 3), padding=[1, 1]),
    "1d": dict(x=(2, 16, 9), w=(16, 1, 5), padding=[2]),
    "3d": dict(x=(1, 16, 4, 4, 4), w=(16, 1, 3, 3, 3), padding=[1, 1, 1]),
    "single_channel": dict(x=(2, 1, 6, 6), w=(8, 1, 3, 3), padding=[1, 1]),
}


@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
@pytest.mark.parametrize("case", sorted(DEPTHWISE))
def test_depthwise(case, layout, rng):
    spec = dict(DEPTHWISE[case])
    g, _, _, y = conv_graph(spec.pop("x"), spec.pop("w"), layout=layout, **spec)
    g.relu(y).set_output(True)
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert templates(plan) == ["depthwise"]


def test_depthwise_convolution_mode_bias_relu_genstats(rng):
    g, _, _, y = conv_graph((2, 16, 5, 5), (16, 1, 3, 3), padding=[1, 1], convolution_mode="convolution")
    b = g.tensor(dim=[1, 16, 1, 1], name="b")
    r = g.relu(g.bias(y, b)).set_output(True).set_data_type(DT.HALF)
    s, sq = g.genstats(r)
    s.set_output(True)
    sq.set_output(True)
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert templates(plan) == ["depthwise"]


@pytest.mark.parametrize("knobs", [None, dict(ROWS=4, BLOCK_W=2, BLOCK_N=8)])
def test_depthwise_epilogue_operand_broadcast_in_memory_along_the_rows(knobs, rng):
    """An epilogue operand of full dims whose row axes all have stride 0 (an expanded per-channel
    vector) is loaded once per program, before the row loop: its address has no row terms (fuzz seed
    2263: the row-strip kernel read `rm` and `rmask` before they existed, UnboundLocalError)."""
    g, _, _, y = conv_graph((2, 3, 6, 4), (6, 1, 2, 1), layout="nchw", stride=[1, 2], dilation=[1, 2])
    v = g.tensor(dim=[2, 6, 5, 2], stride=[0, 1, 0, 0], name="v")
    g.add(y, v).set_output(True)
    if knobs is None:
        plan = assert_engine_matches(g, rng, expect_steps=1)
    else:
        plan = _plan_exact(g, {**knobs, "num_warps": 1, "num_stages": 2})
        bad = og.testing.check_plan(plan, rng)
        assert not bad, "\n".join(map(str, bad))
    assert templates(plan) == ["depthwise"]


@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
@pytest.mark.parametrize("case", ["3x3_stride2", "5x5_dilation_asym", "multiplier2", "1d", "3d"])
def test_depthwise_filter_copied_tap_major(case, layout, rng):
    """WCOPY=1: a launch before the kernel writes the filter as fp32 [taps, K], which the pixel tiles read
    a tap's channels from in one vector load."""
    spec = dict(DEPTHWISE[case])
    g, _, _, y = conv_graph(spec.pop("x"), spec.pop("w"), layout=layout, **spec)
    g.relu(y).set_output(True)
    plan = _plan_exact(g, dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, WCOPY=1))
    (step,) = plan.steps
    assert [launch.kernel for launch in step.kernel.generated.launches] == ["kernel_filter", "kernel"]
    bad = og.testing.check_plan(plan, rng)
    assert not bad, "\n".join(map(str, bad))


@pytest.mark.parametrize("unroll", [None, 1])
def test_depthwise_7x7_filter_copy_in_convolution_mode_with_bias_half(unroll, rng):
    """A 7x7 filter's taps as a loop over its rows, each row's 7 taps unrolled, or (UNROLL=1) all 49
    unrolled."""
    g, _, _, y = conv_graph(
        (2, 16, 9, 9), (16, 1, 7, 7), dt=DT.HALF, padding=[3, 3], convolution_mode="convolution", layout="nhwc"
    )
    b = g.tensor(dim=[1, 16, 1, 1], name="b")
    g.bias(y, b).set_output(True)
    plan = _plan_exact(g, dict(BLOCK_M=32, BLOCK_N=16, num_warps=4, WCOPY=1, **({"UNROLL": 1} if unroll else {})))
    source = plan.source(0)
    assert ("tl.static_range(49)" in source) == bool(unroll) and ("for outer in range(7)" in source) != bool(unroll)
    bad = og.testing.check_plan(plan, rng)
    assert not bad, "\n".join(map(str, bad))


@pytest.mark.parametrize(
    "template,w,dt,knobs,message,rule",
    [
        ("depthwise", (16, 1, 3, 3), DT.INT8, dict(WCOPY=1), "WCOPY=1 copies a float filter", "triton.depthwise.knob"),
        ("depthwise", (16, 1, 9, 9), DT.FLOAT, dict(UNROLL=1), "at most 49 filter taps", "triton.depthwise.knob"),
        ("conv_fprop", (16, 16, 3, 3), DT.FLOAT, dict(WCOPY=1), "WCOPY is a knob of the depthwise", "triton.gemm.knob"),
        (
            "conv_fprop",
            (16, 16, 3, 3),
            DT.FLOAT,
            dict(UNROLL=1),
            "UNROLL is a knob of the depthwise",
            "triton.gemm.knob",
        ),
    ],
    ids=["wcopy_int8", "unroll_9x9", "wcopy_conv", "unroll_conv"],
)
def test_depthwise_pixel_tile_knobs_are_refused_where_they_do_not_apply(template, w, dt, knobs, message, rule):
    """WCOPY on an int8 filter (no fp32 copy of it), UNROLL=1 beyond 7x7's 49 taps (a 9x9 filter is not
    offered it either), WCOPY and UNROLL on another template: typed errors."""
    g, _, _, y = conv_graph((1, 16, 9, 9), w, dt=dt, padding=[w[-1] // 2] * 2)
    y.set_output(True).set_data_type(DT.INT32 if dt is DT.INT8 else dt)
    piece = make_piece(g.final, 0, g.final.nodes)
    chosen = next(t for t in TEMPLATES if t.name == template)
    if "UNROLL" in knobs and template == "depthwise":
        assert not any(c.get("UNROLL") for c in chosen.candidates(piece, H200))
    with pytest.raises(og.AttributeValueError, match=message) as err:
        chosen.generate(piece, dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, num_warps=4, **knobs), CPU)
    assert err.value.rule == rule


# -- depthwise row strips (knob ROWS > 0) ---------------------------------------------------------------


def _plan_exact(g, knobs):
    """A one-step plan running the graph's single piece with exactly `knobs` on the heuristic's template."""
    plan = g.build(device="cpu", engines=["triton"])
    (step,) = plan.steps
    config = og.engines.EngineConfig(
        "triton", tuple(sorted({"template": step.config.knob("template"), **knobs}.items()))
    )
    return step_plan(plan, step, config)


ROW_STRIPS = {
    "3x3": dict(x=(2, 16, 7, 9), w=(16, 1, 3, 3), padding=[1, 1]),
    "3x3_convolution_mode": dict(x=(1, 8, 6, 7), w=(8, 1, 3, 3), padding=[1, 1], convolution_mode="convolution"),
    "w_stride_dilation_asym": dict(
        x=(2, 8, 6, 11), w=(8, 1, 3, 3), pre_padding=[1, 2], post_padding=[1, 0], stride=[1, 2], dilation=[1, 2]
    ),
    "2x1_no_top_padding": dict(x=(1, 8, 6, 5), w=(8, 1, 2, 1), pre_padding=[0, 0], post_padding=[1, 0]),
    "1x3": dict(x=(1, 8, 5, 6), w=(8, 1, 1, 3), padding=[0, 1]),
    "multiplier2": dict(x=(2, 4, 5, 5), w=(8, 1, 3, 3), padding=[1, 1]),
    "valid": dict(x=(1, 8, 7, 7), w=(8, 1, 3, 3)),
}
ROW_KNOBS = [  # all rows static (ROWS < R), a pipelined loop of 2-3 rows, ragged row blocks, W strips
    dict(ROWS=1, BLOCK_W=8, BLOCK_N=16),
    dict(ROWS=2, BLOCK_W=4, BLOCK_N=4),
    dict(ROWS=4, BLOCK_W=16, BLOCK_N=8),
    dict(ROWS=5, BLOCK_W=4, BLOCK_N=16),
    dict(ROWS=16, BLOCK_W=2, BLOCK_N=32),
]


@pytest.mark.parametrize("knobs", range(len(ROW_KNOBS)))
@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
@pytest.mark.parametrize("case", sorted(ROW_STRIPS))
def test_depthwise_row_strips(case, layout, knobs, rng):
    spec = dict(ROW_STRIPS[case])
    g, _, _, y = conv_graph(spec.pop("x"), spec.pop("w"), layout=layout, **spec)
    g.relu(y).set_output(True)
    plan = _plan_exact(g, {**ROW_KNOBS[knobs], "num_warps": 1, "num_stages": 2})
    assert "tl.range" in plan.source(0) or ROW_KNOBS[knobs]["ROWS"] < 3
    bad = og.testing.check_plan(plan, rng)
    assert not bad, "\n".join(map(str, bad))


@pytest.mark.parametrize("knobs", [dict(ROWS=3, BLOCK_W=4, BLOCK_N=8), dict(ROWS=8, BLOCK_W=8, BLOCK_N=16)])
@pytest.mark.parametrize("n", [1, 2])
def test_depthwise_row_strips_prologue_epilogue_genstats(knobs, n, rng):
    """relu(x * s + t) per channel (loaded once per program), then bias, an NCHW residual, relu, an
    fp16 store and genstats accumulated over the program's rows (one slot when one program covers
    the image: N=1 with ROWS=8 and BLOCK_W=8, i.e. the results are written directly)."""
    xd, cd = [n, 16, 6, 5], [1, 16, 1, 1]
    g = og.Graph("dw_rows", io_data_type=DT.HALF, intermediate_data_type=DT.FLOAT)
    x = g.tensor(dim=xd, stride=nhwc(xd), name="x")
    w = g.tensor(dim=[16, 1, 3, 3], stride=nhwc([16, 1, 3, 3]), name="w")
    sc = g.tensor(dim=cd, name="s")
    sh = g.tensor(dim=cd, name="t")
    b = g.tensor(dim=cd, name="b")
    r = g.tensor(dim=xd, name="r")
    y = g.conv_fprop(g.relu(g.add(g.mul(x, sc), sh)), w, padding=[1, 1])
    z = g.relu(g.add(g.bias(y, b), r)).set_output(True).set_data_type(DT.HALF)
    s1, s2 = g.genstats(z)
    s1.set_output(True)
    s2.set_output(True)
    plan = _plan_exact(g, {**knobs, "num_warps": 1, "num_stages": 2})
    source = plan.source(0)
    assert "racc" in source and "pre" in source
    assert len(plan.steps[0].kernel.generated.launches) == (1 if n == 1 and knobs["ROWS"] >= 6 else 2)
    bad = og.testing.check_plan(plan, rng)
    assert not bad, "\n".join(map(str, bad))


@pytest.mark.parametrize("dt", [DT.BFLOAT16, DT.FLOAT, DT.INT8], ids=lambda d: d.name)
def test_depthwise_row_strips_dtypes(dt, rng):
    g, _, _, y = conv_graph((2, 8, 6, 6), (8, 1, 3, 3), dt=dt, padding=[1, 1])
    y.set_output(True)
    if dt is DT.INT8:
        y.set_data_type(DT.INT32)
    plan = _plan_exact(g, dict(ROWS=4, BLOCK_W=8, BLOCK_N=8, num_warps=1, num_stages=2))
    exact = dict(rtol=0, atol=0) if dt is DT.INT8 else {}
    bad = og.testing.check_plan(plan, rng, **exact)
    assert not bad, "\n".join(map(str, bad))


WLOAD_STRIPS = {  # (the case, knobs): all rows static, the pipelined loop, ragged row blocks
    "7x7_loop": (dict(x=(1, 16, 20, 9), w=(16, 1, 7, 7), padding=[3, 3]), dict(ROWS=12, BLOCK_W=8, BLOCK_N=8)),
    "7x7_static_ragged": (dict(x=(2, 8, 9, 11), w=(8, 1, 7, 7), padding=[3, 3]), dict(ROWS=4, BLOCK_W=4, BLOCK_N=8)),
    "5x5_convolution_mode": (
        dict(x=(1, 8, 12, 7), w=(8, 1, 5, 5), padding=[2, 2], convolution_mode="convolution"),
        dict(ROWS=8, BLOCK_W=8, BLOCK_N=8),
    ),
    "3x3_multiplier2": (dict(x=(2, 4, 9, 5), w=(8, 1, 3, 3), padding=[1, 1]), dict(ROWS=5, BLOCK_W=4, BLOCK_N=8)),
}


@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
@pytest.mark.parametrize("case", sorted(WLOAD_STRIPS))
def test_depthwise_row_strips_loading_the_weights_at_every_row(case, layout, rng):
    """WLOAD=1: filters of more than ROW_TAPS taps (7x7: ConvNeXt's) in row strips, their weights loaded
    at each row (inside the pipelined loop under names of their own, not carried between rows)."""
    spec, knobs = WLOAD_STRIPS[case]
    spec = dict(spec)
    x, w = spec.pop("x"), spec.pop("w")
    g, _, _, y = conv_graph(x, w, layout=layout, **spec)
    g.relu(y).set_output(True)
    plan = _plan_exact(g, {**knobs, "num_warps": 1, "num_stages": 2, "WLOAD": 1})
    source = plan.source(0)
    assert ("lw0_0" in source) == (knobs["ROWS"] > w[2]), source  # (the loop: ROWS >= R + 1)
    bad = og.testing.check_plan(plan, rng)
    assert not bad, "\n".join(map(str, bad))


def test_depthwise_row_strips_loading_a_filter_with_its_prologue(rng):
    g = og.Graph("dw_wload_pro", io_data_type=DT.HALF, intermediate_data_type=DT.FLOAT)
    xd, wd = [1, 16, 14, 6], [16, 1, 7, 7]
    x = g.tensor(dim=xd, stride=nhwc(xd), name="x")
    w = g.tensor(dim=wd, stride=nhwc(wd), name="w")
    s = g.tensor(dim=[16, 1, 1, 1], data_type=DT.FLOAT, name="s")
    g.conv_fprop(x, g.mul(w, s).set_data_type(DT.HALF), padding=[3, 3]).set_output(True)
    plan = _plan_exact(g, dict(ROWS=10, BLOCK_W=8, BLOCK_N=16, num_warps=1, num_stages=2, WLOAD=1))
    loop = plan.source(0).split("for j in tl.range")[1]
    assert "_lw = " in loop  # (the prologue's temporaries renamed in the loop: not carried between rows)
    bad = og.testing.check_plan(plan, rng)
    assert not bad, "\n".join(map(str, bad))


def test_depthwise_7x7_row_strips_need_wload():
    """More than ROW_TAPS taps: row strips only with WLOAD=1 (a typed error says so), offered after the
    pixel tiles (unmeasured), which stay the heuristic's first choice on the GPU and the CPU."""
    from opgraph.engines.triton.templates.depthwise import TEMPLATE

    g, _, _, y = conv_graph((64, 96, 56, 56), (96, 1, 7, 7), dt=DT.BFLOAT16, padding=[3, 3])
    y.set_output(True)
    piece = make_piece(g.final, 0, g.final.nodes)
    h200 = Device("cuda", 0, "NVIDIA H200", (9, 0), 132)
    for device in (h200, CPU):
        cands = TEMPLATE.candidates(piece, device)
        assert cands[0].get("ROWS", 0) == 0, cands
        loaded = [c for c in cands if c.get("WLOAD")]
        assert loaded and all(c["ROWS"] > 0 for c in loaded), cands
        assert cands.index(loaded[0]) > max(i for i, c in enumerate(cands) if c.get("ROWS", 0) == 0)
    top = [c for c in TEMPLATE.candidates(piece, h200) if c.get("WLOAD")][0]
    assert top["BLOCK_W"] * top["BLOCK_N"] == 128 * top["num_warps"]  # 4 elements a thread
    g2, _, _, y2 = conv_graph((2, 8, 9, 9), (8, 1, 7, 7), padding=[3, 3])
    y2.set_output(True)
    with pytest.raises(og.AttributeValueError, match="WLOAD=1"):
        _plan_exact(g2, dict(ROWS=4, BLOCK_W=8, BLOCK_N=8, num_warps=1, num_stages=2))
    # larger than 7x7: pixel tiles only (a 13x13 strip spilled and took minutes to compile for sm_90)
    g3, _, _, y3 = conv_graph((2, 8, 9, 9), (8, 1, 9, 9), padding=[4, 4])
    y3.set_output(True)
    assert all(c.get("ROWS", 0) == 0 for c in TEMPLATE.candidates(make_piece(g3.final, 0, g3.final.nodes), h200))
    with pytest.raises(og.AttributeValueError, match="7x7"):
        _plan_exact(g3, dict(ROWS=4, BLOCK_W=8, BLOCK_N=8, num_warps=1, num_stages=2, WLOAD=1))


def test_depthwise_heuristic_takes_row_strips_where_they_apply():
    from opgraph.engines.triton.templates.depthwise import TEMPLATE

    def first(g, device):
        final = g.final
        return TEMPLATE.candidates(make_piece(final, 0, final.nodes), device)

    h200 = Device("cuda", 0, "NVIDIA H200", (9, 0), 132)
    g, _, _, y = conv_graph((32, 256, 28, 28), (256, 1, 3, 3), padding=[1, 1])
    y.set_output(True)
    cands = first(g, h200)
    top = cands[0]
    assert top["ROWS"] > 0 and top["BLOCK_W"] == 32 and top["BLOCK_W"] * top["BLOCK_N"] == 256 * top["num_warps"]
    programs = 32 * -(-28 // top["ROWS"]) * -(-256 // top["BLOCK_N"])
    assert h200.sm_count <= programs <= 16 // top["num_warps"] * h200.sm_count
    assert any(c.get("ROWS", 0) == 0 for c in cands)  # the pixel-tile kernel stays a candidate
    assert first(g, Device("cpu"))[0]["ROWS"] > 0
    g, _, _, y = conv_graph((2, 16, 7, 7), (16, 1, 3, 3), padding=[1, 1], stride=[2, 2])
    y.set_output(True)
    assert all(c.get("ROWS", 0) == 0 for c in first(g, h200))  # stride 2 along H: pixel tiles


def test_depthwise_every_candidate_matches(rng):
    g, _, _, y = conv_graph((2, 16, 5, 6), (16, 1, 3, 3), padding=[1, 1])
    b = g.tensor(dim=[1, 16, 1, 1], name="b")
    g.relu(g.bias(y, b)).set_output(True)
    plan, step, configs = candidate_configs(g)
    assert {c.knob("ROWS") is not None for c in configs} == {True, False}
    assert_candidates_match(plan, step, configs, rng)


# -- data types -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dt", [DT.HALF, DT.BFLOAT16, DT.FLOAT], ids=lambda d: d.name)
def test_dtypes(dt, rng):
    g, _, _, y = conv_graph((2, 16, 5, 5), (16, 16, 3, 3), dt=dt, padding=[1, 1])
    b = g.tensor(dim=[1, 16, 1, 1], name="b")
    g.relu(g.bias(y, b)).set_output(True)
    assert_engine_matches(g, rng, expect_steps=1)


def test_fp32_ieee_knob_and_tf32_note():
    g, _, _, y = conv_graph((1, 16, 4, 4), (16, 16, 3, 3), dt=DT.FLOAT, padding=[1, 1])
    y.set_output(True)
    piece = make_piece(g.final, 0, g.final.nodes)
    template = next(t for t in TEMPLATES if t.name == "conv_fprop")
    cands = template.candidates(piece, og.core.device.CPU)
    assert {c["fp32_precision"] for c in cands} == {"tf32", "ieee"}
    gpu = Device("cuda", 0, "H100", (9, 0), 132)
    assert template.notes(piece, {**cands[0], "fp32_precision": "tf32"}, gpu) == {NumericalNote.DOWN_CONVERT_INPUTS}
    assert template.notes(piece, {**cands[0], "fp32_precision": "ieee"}, gpu) == frozenset()
    source = template.generate(piece, {**cands[0], "fp32_precision": "tf32"}, gpu).source
    assert 'input_precision="tf32"' in source


def test_int8_conv_int32_output(rng):
    g, _, _, y = conv_graph((2, 16, 5, 5), (16, 16, 3, 3), dt=DT.INT8, padding=[1, 1])
    y.set_output(True).set_data_type(DT.INT32)
    assert_engine_matches(g, rng, expect_steps=1, rtol=0, atol=0)


def test_int8_conv_scale_cast_to_int8(rng):
    """The quantized pattern: int8 conv -> int32 -> * scale + bias -> relu -> int8."""
    g, _, _, y = conv_graph((2, 16, 5, 5), (16, 16, 3, 3), dt=DT.INT8, padding=[1, 1])
    y.set_data_type(DT.INT32)
    s = g.tensor(dim=[1, 16, 1, 1], data_type=DT.FLOAT, name="scale")
    b = g.tensor(dim=[1, 16, 1, 1], data_type=DT.FLOAT, name="bias")
    g.relu(g.bias(g.scale(y, s), b)).set_output(True).set_data_type(DT.INT8)
    assert_engine_matches(g, rng, expect_steps=1, rtol=0, atol=1)


def test_half_virtual_conv_output_is_rounded_before_the_epilogue(rng):
    """y declared fp16 and virtual: the fused kernel rounds it before y*3 - y... exactly like the reference."""
    g, _, _, y = conv_graph((1, 16, 4, 4), (16, 16, 3, 3), dt=DT.FLOAT, padding=[1, 1])
    y.set_data_type(DT.HALF)
    g.sub(g.mul(y, 1.0 / 3.0), g.mul(y, 0.25)).set_output(True)
    assert_engine_matches(g, rng, expect_steps=1, rtol=1e-6, atol=1e-6)


def test_int8_depthwise(rng):
    g, _, _, y = conv_graph((2, 16, 5, 5), (16, 1, 3, 3), dt=DT.INT8, padding=[1, 1])
    y.set_output(True).set_data_type(DT.INT32)
    plan = assert_engine_matches(g, rng, expect_steps=1, rtol=0, atol=0)
    assert templates(plan) == ["depthwise"]


# -- prologues -----------------------------------------------------------------------------------------------


def sbr_conv_genstats(
    n=2, c=8, k=16, hw=5, r=3, *, dt=DT.HALF, intermediate=DT.HALF, padding=1, stride=1, store_y=True, prologue=True
):
    """The ResNet training pattern (cuDNN's conv_genstats sample): relu(x*s + b) -> conv -> genstats
    (prologue=False: conv -> genstats alone, the same shapes)."""
    g = og.Graph("sbr_conv_genstats", io_data_type=dt, intermediate_data_type=intermediate, compute_data_type=DT.FLOAT)
    xd, wd, cd = [n, c, hw, hw], [k, c, r, r], [1, c, 1, 1]
    x = g.tensor(dim=xd, stride=nhwc(xd), name="X")
    w = g.tensor(dim=wd, stride=nhwc(wd), name="W")
    conv_in = x
    if prologue:
        s = g.tensor(dim=cd, stride=nhwc(cd), name="S")
        b = g.tensor(dim=cd, stride=nhwc(cd), name="B")
        conv_in = g.relu(g.bias(g.scale(x, s, name="scale"), b, name="bias"), name="relu")
    y = g.conv_fprop(conv_in, w, padding=[padding] * 2, stride=[stride] * 2, name="conv")
    if store_y:
        y.set_output(True).set_name("Y")
    ssum, sqsum = g.genstats(y, name="genstats")
    ssum.set_output(True).set_data_type(DT.FLOAT)
    sqsum.set_output(True).set_data_type(DT.FLOAT)
    return g


@pytest.mark.parametrize("intermediate", [DT.HALF, DT.FLOAT], ids=lambda d: d.name)
def test_sbr_conv_genstats_is_one_piece(intermediate, rng):
    g = sbr_conv_genstats(intermediate=intermediate)
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert templates(plan) == ["conv_fprop"]


def test_sbr_conv_genstats_many_row_tiles(rng):
    """More row tiles than one: genstats goes through per-program partials and the combine launch."""
    g = sbr_conv_genstats(n=3, c=8, k=16, hw=6, store_y=False)
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert len(plan.steps[0].kernel.generated.launches) == 2


def test_prologue_result_is_zero_in_the_padding(rng):
    """x*s + b with b != 0: padded positions must read 0 (conv of the padded prologue), not b."""
    g = og.Graph("pad", io_data_type=DT.FLOAT)
    xd = [1, 16, 4, 4]
    x = g.tensor(dim=xd, stride=nhwc(xd), name="x")
    w = g.tensor(dim=[16, 16, 3, 3], name="w")
    b = g.tensor(dim=[1, 16, 1, 1], name="b")
    y = g.conv_fprop(g.add(g.mul(x, 2.0), b), w, pre_padding=[2, 1], post_padding=[1, 2])
    y.set_output(True)
    assert_engine_matches(g, rng, expect_steps=1, prepare=lambda p: p[b.uid].__iadd__(5.0))


def test_prologue_with_a_residual_in_another_layout(rng):
    """conv(relu(x + r)): a full-size prologue operand (NCHW) next to an NHWC image."""
    g = og.Graph("pro", io_data_type=DT.HALF)
    xd = [2, 16, 5, 5]
    x = g.tensor(dim=xd, stride=nhwc(xd), name="x")
    r = g.tensor(dim=xd, name="r")
    w = g.tensor(dim=[16, 16, 3, 3], name="w")
    g.conv_fprop(g.relu(g.add(x, r)), w, padding=[1, 1]).set_output(True)
    assert_engine_matches(g, rng, expect_steps=1)


def test_prologue_on_the_filter(rng):
    g = og.Graph("wpro", io_data_type=DT.HALF)
    x = g.tensor(dim=[2, 16, 5, 5], name="x")
    w = g.tensor(dim=[16, 16, 3, 3], name="w")
    s = g.tensor(dim=[16, 1, 1, 1], data_type=DT.FLOAT, name="s")
    g.conv_fprop(x, g.mul(w, s).set_data_type(DT.HALF), padding=[1, 1]).set_output(True)
    assert_engine_matches(g, rng, expect_steps=1)


def test_prologue_value_needed_outside_is_not_fused(rng):
    g = og.Graph("cut", io_data_type=DT.HALF)
    x = g.tensor(dim=[1, 16, 4, 4], name="x")
    w = g.tensor(dim=[16, 16, 3, 3], name="w")
    a = g.relu(x).set_output(True)
    g.conv_fprop(a, w, padding=[1, 1]).set_output(True)
    plan = assert_engine_matches(g, rng, expect_steps=2)
    assert "prologue" in plan.describe()


# -- epilogues ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("res_layout", ["nhwc", "nchw"])
def test_epilogue_bias_scale_residual_clip_and_casts(res_layout, rng):
    """y = relu6(conv*alpha + b + r) with alpha a pass-by-value scalar, the clip read from memory, r a
    residual in either layout; plus a mask output, an fp16 copy and an int8 cast."""
    g, _, _, conv = conv_graph((2, 16, 5, 5), (16, 16, 3, 3), dt=DT.HALF, padding=[1, 1])
    yd = [2, 16, 5, 5]
    r = g.tensor(dim=yd, stride=layout_stride(yd, res_layout), name="r")
    b = g.tensor(dim=[1, 16, 1, 1], name="b")
    alpha = g.tensor(dim=[1], data_type=DT.FLOAT, is_pass_by_value=True, name="alpha")
    clip = g.tensor(dim=[1], data_type=DT.FLOAT, name="clip")
    t = g.add(g.bias(g.mul(conv, alpha), b), r)
    y = g.relu(t, upper_clip=clip).set_output(True).set_name("y")
    g.cmp_gt(t, 0.5).set_output(True).set_name("mask")
    g.identity(g.mul(y, 4.0)).set_output(True).set_data_type(DT.INT8).set_name("q")
    assert_engine_matches(g, rng, expect_steps=1, prepare=lambda p: p[clip.uid].fill(3.0))


@pytest.mark.parametrize("act", ["gelu", "gelu_approx_tanh", "sigmoid", "tanh", "swish", "elu"])
def test_epilogue_activations(act, rng):
    g, _, _, y = conv_graph((1, 16, 4, 4), (16, 16, 3, 3), dt=DT.FLOAT, padding=[1, 1])
    getattr(g, act)(y).set_output(True)
    assert_engine_matches(g, rng, expect_steps=1, rtol=1e-3, atol=1e-4)


def test_epilogue_gen_index_and_select(rng):
    g, _, _, y = conv_graph((1, 16, 4, 4), (16, 16, 3, 3), dt=DT.FLOAT, padding=[1, 1])
    idx = g.gen_index(y, axis=1).set_data_type(DT.FLOAT)
    g.binary_select(y, g.mul(y, 0.0), g.cmp_lt(idx, 8.0)).set_output(True)
    assert_engine_matches(g, rng, expect_steps=1)


def test_conv_output_and_epilogue_both_stored_in_bf16(rng):
    g, _, _, y = conv_graph((2, 16, 5, 5), (32, 16, 3, 3), dt=DT.BFLOAT16, padding=[1, 1])
    y.set_output(True)
    g.relu(y).set_output(True)
    assert_engine_matches(g, rng, expect_steps=1)


def test_genstats_of_the_epilogue_grouped(rng):
    g, _, _, y = conv_graph((2, 16, 5, 5), (32, 8, 3, 3), dt=DT.HALF, padding=[1, 1])
    b = g.tensor(dim=[1, 32, 1, 1], name="b")
    z = g.relu(g.bias(y, b)).set_output(True)
    s, sq = g.genstats(z)
    s.set_output(True)
    sq.set_output(True)
    assert_engine_matches(g, rng, expect_steps=1)


@pytest.mark.parametrize("mode", ["ADD", "AVG", "MAX", "MIN", "AMAX", "NORM1", "NORM2"])
def test_channel_reduction(mode, rng):
    """cuDNN's conv -> reduction over channels ([N, 1, H, W]) and per-channel reductions."""
    g, _, _, y = conv_graph((2, 8, 5, 5), (40, 8, 3, 3), dt=DT.HALF, padding=[1, 1])
    g.reduction(y, mode=mode).set_output(True).set_dim([2, 1, 5, 5])
    g.reduction(y, mode=mode).set_output(True).set_dim([1, 40, 1, 1])
    plan = assert_engine_matches(g, rng, expect_steps=1, rtol=1e-3, atol=1e-3)
    assert templates(plan) == ["conv_fprop"]


def test_an_op_reading_genstats_results_starts_another_piece(rng):
    g, _, _, y = conv_graph((2, 8, 5, 5), (16, 8, 3, 3), dt=DT.HALF, padding=[1, 1])
    y.set_output(True)
    s, sq = g.genstats(y)
    sq.set_output(True)
    g.mul(s, 1.0 / 50).set_output(True).set_name("mean")
    plan = assert_engine_matches(g, rng, expect_steps=2)
    assert templates(plan)[0] == "conv_fprop"
    assert "complete only after the kernel" in plan.describe()


def test_reduction_of_some_row_axes_is_not_fused(rng):
    g, _, _, y = conv_graph((2, 8, 5, 5), (16, 8, 3, 3), dt=DT.HALF, padding=[1, 1])
    y.set_output(True)
    g.reduction(y, mode="ADD").set_output(True).set_dim([2, 16, 1, 5])
    plan = g.build(device="cpu", engines=["triton", "reference"])
    assert len(plan.steps) == 2


# -- the cuDNN frontend's fusion patterns: one piece each ---------------------------------------------------


def test_pattern_conv_bias_relu_with_clips(rng):
    g, _, _, y = conv_graph((2, 16, 6, 6), (32, 16, 3, 3), dt=DT.HALF, padding=[1, 1])
    b = g.tensor(dim=[1, 32, 1, 1], stride=nhwc([1, 32, 1, 1]), name="b")
    g.relu(g.bias(y, b), lower_clip=0.5, upper_clip=4.0).set_output(True)
    assert_engine_matches(g, rng, expect_steps=1)
    g.build(device="cpu", engines=["triton"], allow_partition=False)


def test_pattern_asymmetric_conv_relu(rng):
    g, _, _, y = conv_graph((2, 16, 7, 6), (16, 16, 3, 3), dt=DT.HALF, pre_padding=[0, 1], post_padding=[2, 0])
    g.relu(y).set_output(True)
    assert_engine_matches(g, rng, expect_steps=1)
    g.build(device="cpu", engines=["triton"], allow_partition=False)


def test_pattern_conv3d_bias_leaky_relu(rng):
    g, _, _, y = conv_graph((1, 16, 4, 4, 4), (16, 16, 3, 3, 3), dt=DT.HALF, padding=[1, 1, 1])
    b = g.tensor(dim=[1, 16, 1, 1, 1], name="b")
    g.leaky_relu(g.bias(y, b), negative_slope=0.1).set_output(True)
    assert_engine_matches(g, rng, expect_steps=1)
    g.build(device="cpu", engines=["triton"], allow_partition=False)


def test_pattern_sbr_conv_genstats_strict(rng):
    g = sbr_conv_genstats()
    g.build(device="cpu", engines=["triton"], allow_partition=False)


def test_pattern_conv_channel_reduction(rng):
    g, _, _, y = conv_graph((2, 16, 6, 6), (32, 16, 3, 3), dt=DT.HALF, padding=[1, 1])
    g.reduction(y, mode="ADD").set_output(True).set_dim([2, 1, 6, 6]).set_data_type(DT.FLOAT)
    assert_engine_matches(g, rng, expect_steps=1)
    g.build(device="cpu", engines=["triton"], allow_partition=False)


# -- split-K and every candidate --------------------------------------------------------------------------


@pytest.mark.parametrize("split", [2, 3, 5])
def test_split_k_with_epilogue_and_genstats(split, rng):
    g = sbr_conv_genstats(n=1, c=40, k=16, hw=4)
    plan = plan_with(g, {"SPLIT_K": split, "BLOCK_K": 16})
    bad = og.testing.check_plan(plan, rng)
    assert not bad, "\n".join(map(str, bad))


def test_split_k_with_epilogue_subtile_and_groups(rng):
    g, _, _, y = conv_graph((1, 64, 4, 4), (64, 32, 3, 3), dt=DT.HALF, padding=[1, 1])
    b = g.tensor(dim=[1, 64, 1, 1], name="b")
    z = g.relu(g.bias(y, b)).set_output(True)
    s, sq = g.genstats(z)
    s.set_output(True)
    sq.set_output(True)
    plan = plan_with(g, {"SPLIT_K": 3, "EPILOGUE_SUBTILE": 2, "BLOCK_N": 32, "BLOCK_K": 16})
    assert "tl.split" in plan.source(0)
    bad = og.testing.check_plan(plan, rng)
    assert not bad, "\n".join(map(str, bad))


def test_large_channel_count_takes_split_k_by_heuristic(rng):
    g, _, _, y = conv_graph((1, 96, 3, 3), (16, 96, 3, 3), dt=DT.HALF, padding=[1, 1])
    g.relu(y).set_output(True)
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert plan.steps[0].config.knob("SPLIT_K") > 1


def test_every_candidate_matches(rng):
    g = sbr_conv_genstats(n=2, c=8, k=24, hw=5)
    assert_candidates_match(*candidate_configs(g), rng)


# -- the fuzzer -----------------------------------------------------------------------------------------------


def _fuzz_case(seed: int):
    rng = np.random.default_rng(seed)
    nsp = int(rng.choice([1, 2, 2, 3]))
    depthwise = rng.random() < 0.25
    groups = 1 if depthwise else int(rng.choice([1, 1, 2]))
    cg = 1 if depthwise else int(rng.choice([3, 8, 16, 20]))
    c = 8 * int(rng.integers(1, 3)) if depthwise else cg * groups
    k = c * int(rng.choice([1, 2])) if depthwise else groups * int(rng.choice([8, 16, 24]))
    taps = [int(rng.choice([1, 2, 3])) for _ in range(nsp)]
    dil = [int(rng.choice([1, 1, 2])) for _ in range(nsp)]
    stride = [int(rng.choice([1, 1, 2])) for _ in range(nsp)]
    pre = [int(rng.integers(0, 3)) for _ in range(nsp)]
    post = [int(rng.integers(0, 3)) for _ in range(nsp)]
    size = {1: 12, 2: 6, 3: 4}[nsp]
    x_sp = [int(max(size + rng.integers(-1, 2), (t - 1) * d + 1)) for t, d in zip(taps, dil)]
    dt = rng.choice([DT.HALF, DT.BFLOAT16, DT.FLOAT])
    layout = rng.choice(["nhwc", "nchw"])
    n = int(rng.integers(1, 3))
    return dict(
        nsp=nsp,
        c=c,
        k=k,
        cg=cg,
        taps=taps,
        dil=dil,
        stride=stride,
        pre=pre,
        post=post,
        x_sp=x_sp,
        dt=dt,
        layout=layout,
        n=n,
        epi=rng.choice(["none", "bias_relu", "residual_clip", "scale_mask", "genstats"]),
        prologue=rng.random() < 0.3,
        mode=rng.choice(["cross_correlation", "convolution"]),
    )


def fuzz_graph(seed: int) -> og.Graph:
    f = _fuzz_case(seed)
    xd = [f["n"], f["c"], *f["x_sp"]]
    wd = [f["k"], f["cg"], *f["taps"]]
    g = og.Graph(f"fuzz{seed}", io_data_type=f["dt"], intermediate_data_type=DT.FLOAT)
    x = g.tensor(dim=xd, stride=layout_stride(xd, f["layout"]), name="x")
    w = g.tensor(dim=wd, stride=layout_stride(wd, f["layout"]), name="w")
    xin = g.relu(g.add(x, 1.0)) if f["prologue"] else x
    y = g.conv_fprop(
        xin,
        w,
        pre_padding=f["pre"],
        post_padding=f["post"],
        stride=f["stride"],
        dilation=f["dil"],
        convolution_mode=f["mode"],
    )
    kd = [1, f["k"]] + [1] * f["nsp"]
    epi = f["epi"]
    if epi == "none":
        y.set_output(True)
    elif epi == "bias_relu":
        g.relu(g.bias(y, g.tensor(dim=kd, name="b"))).set_output(True)
    elif epi == "residual_clip":
        y.set_output(True)
        yd = list(g.final.tensors[y.uid].dim)
        y.set_output(False)
        r = g.tensor(dim=yd, stride=layout_stride(yd, "nchw" if f["layout"] == "nhwc" else "nhwc"), name="r")
        g.relu(g.add(y, r), lower_clip=-4.0, upper_clip=24.0).set_output(True)
    else:
        scale_mask_or_genstats(g, y, epi)
    return g


@pytest.mark.parametrize("seed", range(24))
def test_fuzz(seed, rng):
    """Random geometry, layout, type, prologue and epilogue; small-integer inputs make every result
    exact, so the comparison is exact too."""
    assert_engine_matches(fuzz_graph(seed), rng, expect_steps=1, integers=True, low=-2, high=2, rtol=0, atol=0)


# -- GPU-sized launches run by the interpreter, and compiled for Hopper ---------------------------------------

H200 = Device("cuda", 0, "NVIDIA H200", (9, 0), 132)


def _gpu_source_on_cpu(g, knobs=None):
    """A one-step plan whose kernel is generated for an H200 (GPU block sizes of the combine and
    split-K epilogue launches, ...) but run by the interpreter (16-bit graphs only: the GPU source
    multiplies bf16 as it is)."""
    from opgraph.engines.triton import TritonKernel

    plan = g.build(device="cpu", engines=["triton"])
    (step,) = plan.steps
    knobs = {**dict(step.config.knobs), **(knobs or {})}
    name = knobs.pop("template")
    template = next(t for t in TEMPLATES if t.name == name)
    generated = template.generate(step.piece, knobs, H200)
    kernel = TritonKernel(step.piece, step.config, generated, interpret=True)
    return ExecutionPlan(plan.graph, plan.device, (Step(0, step.piece, step.config, kernel),), plan.cuts)


def test_combine_launch_with_gpu_blocks(rng):
    """genstats partials combined by the GPU-sized launch: (position blocks x arrays) programs."""
    g = sbr_conv_genstats(n=3, c=8, k=16, hw=6, store_y=False)
    plan = _gpu_source_on_cpu(g, {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16})
    launches = plan.steps[0].kernel.generated.launches
    combine = launches[-1]
    assert combine.kernel.startswith("kernel_combine") and combine.grid == (4,)  # 2 blocks of 8 x 2 arrays
    bad = og.testing.check_plan(plan, rng)
    assert not bad, "\n".join(map(str, bad))


def test_split_k_epilogue_launch_on_finer_tiles(rng):
    g, _, _, y = conv_graph((2, 64, 8, 8), (64, 64, 3, 3), dt=DT.HALF, padding=[1, 1])
    b = g.tensor(dim=[1, 64, 1, 1], name="b")
    z = g.relu(g.bias(y, b)).set_output(True)
    s, sq = g.genstats(z)
    s.set_output(True)
    sq.set_output(True)
    plan = _gpu_source_on_cpu(g, {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 16, "SPLIT_K": 3})
    main, epi, *_ = plan.steps[0].kernel.generated.launches
    assert epi.kernel == "kernel_epilogue" and epi.grid[0] > main.grid[0] // 3  # finer than the main tiles
    bad = og.testing.check_plan(plan, rng)
    assert not bad, "\n".join(map(str, bad))


def test_fp16_prologue_result_rounds_once():
    """relu(x*s + b) declared fp16 into an fp16 conv: one cast to fp16 after the padding select (no
    .to(fp16).to(fp32) round trip in the main loop)."""
    g = sbr_conv_genstats(intermediate=DT.HALF)
    source = g.build(device="cpu", engines=["triton"]).source(0)
    loop = [line.strip() for line in source[source.index("for it in") : source.index("acc = tl.dot")].splitlines()]
    at = next(i for i, line in enumerate(loop) if line.startswith("a = tl.where("))
    assert "relu" not in loop[at - 1] and ".to(tl.float16).to(tl.float32)" not in loop[at - 1]
    assert "tl.where(" in loop[at - 1] and loop[at + 1] == "a = a.to(tl.float16)"


def test_gpu_heuristics_for_the_benchmark_convs():
    """Deep-K convs with few tiles split K over more programs; the others keep their tiles."""
    from opgraph.engines.triton.templates.conv_fprop import TEMPLATE

    def first(c, k, hw, r):
        from opgraph.tools.samples import conv_bias_relu

        final = conv_bias_relu(n=32, c=c, k=k, hw=hw, r=r, padding=r // 2).final
        return TEMPLATE.candidates(make_piece(final, 0, final.nodes), H200)

    c512 = first(512, 512, 7, 3)
    assert c512[0]["SPLIT_K"] > 1 and c512[0]["BLOCK_M"] * c512[0]["BLOCK_N"] >= 128 * 128
    assert any(c["SPLIT_K"] == 2 and (c["BLOCK_M"], c["BLOCK_N"]) == (128, 128) for c in c512)
    assert first(64, 64, 56, 3)[0]["SPLIT_K"] == 1
    assert first(256, 256, 14, 3)[0]["SPLIT_K"] == 1


def test_gpu_heuristics_for_the_benchmark_convs_on_an_h100():
    """The first candidates for an H100 are what its autotuner measured best (2026-11-26, N=32, every
    candidate timed, fp16 and bf16 alike): see conv_cost."""
    from opgraph.engines.triton.templates.conv_fprop import TEMPLATE

    h100 = Device("cuda", 0, "NVIDIA H100 80GB HBM3", (9, 0), 132)

    def first(c, k, hw, r, stride=1, residual=False, dt=DT.HALF):
        g, _, _, y = conv_graph((32, c, hw, hw), (k, c, r, r), dt=dt, padding=[r // 2] * 2, stride=[stride] * 2)
        y = g.bias(y, g.tensor(dim=[1, k, 1, 1], stride=layout_stride((1, k, 1, 1), "nhwc"), name="b"))
        if residual:
            p = (hw + 2 * (r // 2) - r) // stride + 1
            y = g.add(y, g.tensor(dim=[32, k, p, p], stride=layout_stride((32, k, p, p), "nhwc"), name="z"))
        g.relu(y).set_output(True)
        c0 = TEMPLATE.candidates(make_piece(g.final, 0, g.final.nodes), h100)[0]
        return c0["BLOCK_M"], c0["BLOCK_N"], c0["SPLIT_K"], c0["num_warps"]

    for dt in (DT.HALF, DT.BFLOAT16):
        # bias + residual + relu: 128x64, 4 warps, 44.2 µs against 128x256, 8 warps, 50.6 (fp16)
        bm, bn, split, warps = first(64, 256, 56, 1, residual=True, dt=dt)
        assert bm * bn <= 128 * 64 and warps == 4 and split == 1
        assert first(512, 512, 7, 3, dt=dt)[:3] == (128, 256, 5)  # 26.6 against 128x128 x 5: 32.4
        assert first(128, 128, 56, 3, stride=2, dt=dt)[:3] == (256, 128, 1)  # 22.8 against 128x128: 26.5
        assert first(256, 512, 56, 1, stride=2, dt=dt)[:3] == (128, 256, 1)  # 25.8 against 256x128: 27.4
        assert first(256, 64, 56, 1, dt=dt)[:3] == (256, 64, 1)  # 30.2 against 128x64: 32.3
        assert first(256, 256, 14, 3, dt=dt)[:3] == (128, 128, 1)  # 23.3 against 256x64: 26.5
        assert first(3, 64, 224, 7, stride=2, dt=dt)[:3] == (256, 64, 1)  # the stem: 183 against 128x64: 206
        # SBR -> conv -> genstats: first the prologue as its own pass, then the plain conv's config; the
        # fused configs after it, the prologue's tile lean: 64x64 with 3 stages (53.1 against 128x64: 70.2)
        g = sbr_conv_genstats(n=32, c=64, k=64, hw=56, dt=dt, intermediate=dt)
        sbr = TEMPLATE.candidates(make_piece(g.final, 0, g.final.nodes), h100)
        plain = sbr_conv_genstats(n=32, c=64, k=64, hw=56, dt=dt, intermediate=dt, prologue=False)
        assert sbr[0] == {
            **TEMPLATE.candidates(make_piece(plain.final, 0, plain.final.nodes), h100)[0],
            "PROLOGUE_PASS": 1,
        }
        fused = next(c for c in sbr if not c.get("PROLOGUE_PASS"))
        assert (fused["BLOCK_M"], fused["BLOCK_N"], fused["num_stages"], fused["num_warps"]) == (64, 64, 3, 4)


def _bench_depthwise():
    g, _, _, y = conv_graph((32, 256, 28, 28), (256, 1, 3, 3), padding=[1, 1])
    b = g.tensor(dim=[1, 256, 1, 1], name="b")
    g.relu(g.bias(y, b)).set_output(True)
    return g


def _convnext_depthwise():
    g, _, _, y = conv_graph((64, 96, 56, 56), (96, 1, 7, 7), dt=DT.BFLOAT16, padding=[3, 3])
    b = g.tensor(dim=[1, 96, 1, 1], name="b")
    g.bias(y, b).set_output(True)
    return g


def _bench_conv(c, k, hw, r):
    def build():
        from opgraph.tools.samples import conv_bias_relu

        return conv_bias_relu(n=32, c=c, k=k, hw=hw, r=r, padding=r // 2)

    return build


def _pass_and_fused(candidates):
    """The heuristic's first config (the prologue as its own pass) and the first fused one."""
    return [candidates[0], next(c for c in candidates if not c.get("PROLOGUE_PASS"))]


HOPPER_CASES = {  # (graph, template, candidates compiled, max registers)
    "depthwise_rows": (_bench_depthwise, "depthwise", 3, 128),
    # ConvNeXt-T's stage-1 7x7 depthwise conv: the row strips loading their weights at every row
    "depthwise_7x7_wload": (_convnext_depthwise, "depthwise", lambda c: [k for k in c if k.get("WLOAD")][:1], 200),
    # the same conv's heuristic pick: pixel tiles of 4 pixels x 8 channels a thread, the filter copied
    # tap-major by a launch before (WCOPY=1), the 49 taps unrolled (Triton 3.6: 112 registers)
    "depthwise_7x7_wcopy": (_convnext_depthwise, "depthwise", 1, 128),
    "sbr_conv_genstats": (lambda: sbr_conv_genstats(n=32, c=64, k=64, hw=56), "conv_fprop", _pass_and_fused, 255),
    # bf16: the prologue's roundings and the stores through the cvt.rn.bf16.f32 asm helpers
    "sbr_conv_genstats_bf16": (
        lambda: sbr_conv_genstats(n=32, c=64, k=64, hw=56, dt=DT.BFLOAT16, intermediate=DT.BFLOAT16),
        "conv_fprop",
        _pass_and_fused,
        255,
    ),
    "conv_512_7x7_split_k": (_bench_conv(512, 512, 7, 3), "conv_fprop", 3, 255),
    "conv_64_56x56": (_bench_conv(64, 64, 56, 3), "conv_fprop", 1, 255),
}


def test_kernels_compile_for_hopper_without_spills():
    """The benchmark pieces' first candidates compiled for sm_90 (Triton's NVIDIA backend and ptxas,
    no GPU needed): no spills, shared memory within an SM's 227 KB, and the depthwise row strips
    at <= 128 registers (16 warps per SM; 7x7's, loading their weights at every row, <= 200: Triton 3.6
    gave 142-191 over the candidates; 7x7's pixel tiles <= 128)."""
    import re

    out = compile_for_hopper(__name__, gpu=H200.name, timeout=900)
    lines = [line for line in out.splitlines() if line.startswith("compiled")]
    assert {line.split()[1] for line in lines} == set(HOPPER_CASES), out
    # the SBR cases: the pass's kernel (a pointwise launch) beside the fused kernel's
    assert any(" kernel_prologue_pass " in line for line in lines if line.split()[1] == "sbr_conv_genstats")
    assert any(" kernel_filter " in line for line in lines if line.split()[1] == "depthwise_7x7_wcopy")
    for line in lines:
        name, regs, spills, smem = re.match(r"compiled (\S+) \S+ regs (\d+) spills (\d+) smem (\d+)", line).groups()
        assert int(spills) == 0 and int(smem) <= 227 * 1024, line
        assert int(regs) <= HOPPER_CASES[name][3], line


# -- GPU, realistic sizes ------------------------------------------------------------------------------------

RESNET = [  # (C, K, HW, R): the benchmark's conv+bias+relu shapes at N=32
    (64, 64, 56, 3),
    (256, 64, 56, 1),
    (256, 256, 14, 3),
    (512, 512, 7, 3),
]


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("c,k,hw,r", RESNET)
def test_gpu_resnet_conv_bias_relu(c, k, hw, r, rng):
    from opgraph.tools.samples import conv_bias_relu

    g = conv_bias_relu(n=32, c=c, k=k, hw=hw, r=r, padding=r // 2)
    plan = assert_engine_matches(g, rng, device="cuda", expect_steps=1, rtol=1e-2, atol=1e-2)
    assert templates(plan) == ["conv_fprop"]


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("dt", [DT.HALF, DT.BFLOAT16, DT.FLOAT], ids=lambda d: d.name)
def test_gpu_conv_dtypes(dt, rng):
    g, _, _, y = conv_graph((8, 64, 28, 28), (128, 64, 3, 3), dt=dt, padding=[1, 1], stride=[2, 2])
    b = g.tensor(dim=[1, 128, 1, 1], name="b")
    g.relu(g.bias(y, b)).set_output(True)
    # fp32 runs as TF32 on the GPU by default (10-bit mantissa operands: ~1e-3 relative per product,
    # summed over K ~ 10^3 terms of magnitude ~1): absolute errors of a few 1e-2 are expected
    rtol, atol = {DT.FLOAT: (2e-2, 2e-1), DT.HALF: (1e-2, 1e-2), DT.BFLOAT16: (5e-2, 5e-2)}[dt]
    assert_engine_matches(g, rng, device="cuda", expect_steps=1, rtol=rtol, atol=atol)


def grouped_bias_relu(n, dt):
    """The benchmark's ResNeXt conv: 3x3, 32 groups of 8 channels, 28², + bias + relu."""
    g, _, _, y = conv_graph((n, 256, 28, 28), (256, 8, 3, 3), dt=dt, padding=[1, 1])
    b = g.tensor(dim=[1, 256, 1, 1], name="b")
    g.relu(g.bias(y, b)).set_output(True)
    return g


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("n", [8, 32])
def test_gpu_grouped_conv_bias_relu(n, rng):
    plan = assert_engine_matches(
        grouped_bias_relu(n, DT.HALF), rng, device="cuda", expect_steps=1, rtol=1e-2, atol=1e-2
    )
    assert templates(plan) == ["conv_fprop"]


def test_bf16_narrow_grouped_conv_is_declined_on_the_gpu_only():
    from opgraph.engines.triton.templates.conv_fprop import TEMPLATE

    g = grouped_bias_relu(2, DT.BFLOAT16)
    g.validate()
    piece = make_piece(g.final, 0, list(g.final.nodes))
    h200 = Device("cuda", 0, "NVIDIA H200", (9, 0), 132)
    why = TEMPLATE.match(piece, h200)
    assert not why.ok and "open bug" in why.reason and "8 channels per group" in why.reason
    assert TEMPLATE.match(piece, CPU).ok  # the interpreter runs it (and the CPU tests hold it there)
    g16 = grouped_bias_relu(2, DT.HALF)
    g16.validate()
    assert TEMPLATE.match(make_piece(g16.final, 0, list(g16.final.nodes)), h200).ok
    # a plain bf16 conv of few channels (the stem: C=3, one group) is not grouped: not declined
    gs, _, _, ys = conv_graph((2, 3, 16, 16), (64, 3, 7, 7), dt=DT.BFLOAT16, padding=[3, 3], stride=[2, 2])
    ys.set_output(True)
    gs.validate()
    assert TEMPLATE.match(make_piece(gs.final, 0, list(gs.final.nodes)), h200).ok


@pytest.mark.gpu
@requires_cuda
@pytest.mark.xfail(
    strict=False,
    raises=AssertionError,
    reason="open bug: the generated bf16 grouped conv's output was wrong at N=32 on an H200 (the "
    "engine declines it on the GPU meanwhile); XPASS on an H200 too suggests it is fixed: then "
    "lift the decline in ConvFpropTemplate.check (not strict: seen on one H200 only)",
)
def test_gpu_grouped_conv_bf16_kernel_bug(rng, monkeypatch):
    """The declined kernel compiled anyway (the template's heuristic config for the GPU) and checked against
    the reference engine: on an H200 on 2026-11-26 its bf16 output at N=32 was wrong (relative error 0.09 in
    plain calls, 1e17 in CUDA-graph replays, NaN in another build) while fp16 and N=8 were right."""
    from opgraph.core.device import resolve_device
    from opgraph.engines.triton.templates.conv_fprop import TEMPLATE

    g = grouped_bias_relu(32, DT.BFLOAT16)
    cpu = g.build(device="cpu", engines=["triton"])
    (step,) = cpu.steps
    dev = resolve_device("cuda")
    monkeypatch.setattr(type(TEMPLATE).match_class, "check", lambda self: Support.yes())  # compiled anyway
    knobs = TEMPLATE.candidates(step.piece, dev)[0]
    config = EngineConfig("triton", (("template", TEMPLATE.name), *sorted(knobs.items())))
    kernel = get_engine("triton").compile(step.piece, config, dev)
    plan = ExecutionPlan(cpu.graph, dev, (Step(0, step.piece, config, kernel),), cpu.cuts)
    assert not og.testing.check_plan(plan, rng, rtol=5e-2, atol=5e-2)


@pytest.mark.gpu
@requires_cuda
def test_gpu_depthwise_bias_relu(rng):
    g, _, _, y = conv_graph((32, 256, 28, 28), (256, 1, 3, 3), dt=DT.HALF, padding=[1, 1])
    b = g.tensor(dim=[1, 256, 1, 1], name="b")
    g.relu(g.bias(y, b)).set_output(True)
    plan = assert_engine_matches(g, rng, device="cuda", expect_steps=1)
    assert templates(plan) == ["depthwise"]


@pytest.mark.gpu
@requires_cuda
def test_gpu_sbr_conv_genstats(rng):
    """Y against the reference; the statistics against the kernel's own Y (tight) and the reference
    (relative to the sum of |Y|). Measured on an H200: tensor-core fp16 accumulation differs from
    IEEE fp32 by about an fp16 ulp on half of the outputs, with a slight bias, and the per-channel
    sum of 100k such values cancels to a few % of its terms: an elementwise tolerance on the sum would
    measure the hardware, not the kernel (cuDNN's fused graph shows the same)."""
    from opgraph.core.torch_interop import pack_to_device, torch_to_numpy

    g = sbr_conv_genstats(n=32, c=64, k=64, hw=56)
    plan = g.build(device="cuda")
    assert len(plan.steps) == 1, plan.describe()
    f = g.final
    y, s1, s2 = (f.tensor(n).uid for n in ("Y", "genstats::sum", "genstats::sq_sum"))
    pack = og.testing.random_pack(f, rng)
    want = og.testing.reference_outputs(f, pack)
    dev = pack_to_device(pack, "cuda")
    plan.execute(dev)
    got = {u: torch_to_numpy(dev[u]).astype(np.float64) for u in (y, s1, s2)}
    assert og.testing.compare(f.tensors[y], got[y], want[y], rtol=1e-2, atol=1.3e-1) is None
    own_sum, own_sq = got[y].sum((0, 2, 3)), (got[y] ** 2).sum((0, 2, 3))
    np.testing.assert_allclose(
        got[s1].ravel(), own_sum, rtol=1e-5, atol=1e-3 * np.abs(got[y]).sum((0, 2, 3)).max() ** 0.5
    )
    np.testing.assert_allclose(got[s2].ravel(), own_sq, rtol=1e-5)
    scale = np.abs(want[y].astype(np.float64)).sum((0, 2, 3))
    assert np.all(np.abs(got[s1].ravel() - want[s1].astype(np.float64).ravel()) <= 1e-3 * scale)


@pytest.mark.gpu
@requires_cuda
def test_gpu_int8_conv(rng):
    g, _, _, y = conv_graph((8, 64, 14, 14), (64, 64, 3, 3), dt=DT.INT8, padding=[1, 1])
    y.set_output(True).set_data_type(DT.INT32)
    assert_engine_matches(g, rng, device="cuda", expect_steps=1, rtol=0, atol=0)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("seed", range(8))
def test_gpu_fuzz(seed, rng):
    assert_engine_matches(
        fuzz_graph(seed), rng, device="cuda", expect_steps=1, integers=True, low=-2, high=2, rtol=0, atol=0
    )


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize(
    "knobs",
    [
        {},
        {"SPLIT_K": 4, "BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 16},
        {"SPLIT_K": 7, "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 16, "num_stages": 2},
    ],
    ids=["heuristic", "split4", "split7"],
)
def test_gpu_resnet_stem_ragged_channels_split_k(knobs, rng):
    """The ResNet stem at batch 1 (3 channels in a BLOCK_K of 16, split-K): Triton 3.6 on Hopper
    computed wrong sums (relative error ~1) when the image load's mask combined pixels and channels;
    the channel tail is now wrapped in the loads and zeroed by selects (TileIndexer's select)."""
    g, _, _, y = conv_graph((1, 3, 224, 224), (64, 3, 7, 7), dt=DT.HALF, padding=[3, 3], stride=[2, 2])
    y.set_output(True)
    plan = g.build(device="cuda", engines=["triton"])
    if knobs:
        (step,) = plan.steps
        plan = step_plan(
            plan, step, og.engines.EngineConfig("triton", tuple(sorted({**dict(step.config.knobs), **knobs}.items())))
        )
    bad = og.testing.check_plan(plan, rng, rtol=1e-2, atol=1e-2)
    assert not bad, "\n".join(map(str, bad))


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("split", [1, 4])
def test_gpu_dgrad_ragged_filters_split_k(split, rng):
    """conv_dgrad with 3 filters in a BLOCK_K of 16 (the stem's backward): the filter tail wrapped
    and selected, like the forward's channels."""
    g = og.Graph("dgrad", io_data_type=DT.HALF, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    dy = g.tensor(dim=[1, 3, 56, 56], stride=layout_stride((1, 3, 56, 56), "nhwc"), name="dy")
    w = g.tensor(dim=[3, 64, 3, 3], stride=layout_stride((3, 64, 3, 3), "nhwc"), name="w")
    g.conv_dgrad(dy, w, padding=[1, 1], name="dgrad").set_output(True).set_dim([1, 64, 56, 56]).set_stride(
        list(layout_stride((1, 64, 56, 56), "nhwc"))
    )
    plan = g.build(device="cuda", engines=["triton"])
    (step,) = plan.steps
    knobs = {**dict(step.config.knobs), "SPLIT_K": split, "BLOCK_K": 16}
    plan = step_plan(plan, step, og.engines.EngineConfig("triton", tuple(sorted(knobs.items()))))
    bad = og.testing.check_plan(plan, rng, rtol=1e-2, atol=1e-2)
    assert not bad, "\n".join(map(str, bad))


@pytest.mark.gpu
@requires_cuda
def test_gpu_ragged_channels_1x1_big_tiles_deterministic(rng):
    """MobileNetV2's 96 -> 576 1x1 conv (a channel tail of 32 in BLOCK_K 64, 128 x 128 tiles): a tail
    clamped with tl.minimum gave sums that changed from run to run; wrapped by %, it matches."""
    g, x, w, y = conv_graph((64, 96, 14, 14), (576, 96, 1, 1), dt=DT.HALF)
    y.set_output(True)
    plan = g.build(device="cuda", engines=["triton"])
    (step,) = plan.steps
    knobs = {
        **dict(step.config.knobs),
        "BLOCK_M": 128,
        "BLOCK_N": 128,
        "BLOCK_K": 64,
        "SPLIT_K": 1,
        "num_stages": 3,
        "num_warps": 8,
    }
    plan = step_plan(plan, step, og.engines.EngineConfig("triton", tuple(sorted(knobs.items()))))
    for _ in range(2):
        bad = og.testing.check_plan(plan, rng, rtol=1e-2, atol=1e-2)
        assert not bad, "\n".join(map(str, bad))


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("mode", ["neg", "abs"])
@pytest.mark.parametrize("what", ["conv_tap_outer", "conv_nwc", "matmul_kmajor"])
def test_gpu_sign_epilogue_on_the_accumulator(what, mode, rng):
    """NEG and ABS right on a GEMM accumulator, every candidate config: ptxas (CUDA 12.8/12.9) compiled
    LLVM's sign-bit xor / and of a wgmma accumulator to -0.0 / 0 (fuzz seed 20261125508880: 4 channels,
    2 filters, 64 x 32 x 16 tiles, num_stages 1, 2 or 4, on an H100); they are emitted as neg.f32 and
    abs.f32 since (expr._og_neg, _og_abs)."""
    g = og.Graph("sign", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    if what == "matmul_kmajor":
        a = g.tensor(dim=[1, 2, 12], name="a")
        b = g.tensor(dim=[1, 12, 2], stride=[24, 1, 12], name="b")
        y = g.matmul(a, b)
    else:
        x = g.tensor(dim=[2, 4, 3], stride=[12, 1, 4], name="x")
        w = g.tensor(dim=[2, 4, 3], stride=[4, 1, 8] if what == "conv_tap_outer" else [12, 1, 4], name="w")
        y = g.conv_fprop(x, w, padding=[0], stride=[1], dilation=[1])
    (g.neg(y) if mode == "neg" else g.abs(y)).set_output(True).set_data_type(DT.FLOAT)
    plan = g.build(device="cuda", engines=["triton"])
    (step,) = plan.steps
    template = dict(step.config.knobs)["template"]
    candidates = next(t for t in TEMPLATES if t.name == template).candidates(step.piece, plan.device)
    for knobs in candidates:
        config = og.engines.EngineConfig("triton", tuple(sorted({"template": template, **knobs}.items())))
        bad = og.testing.check_plan(step_plan(plan, step, config), rng, rtol=1e-2, atol=1e-2)
        assert not bad, f"{knobs}: " + "\n".join(map(str, bad))
