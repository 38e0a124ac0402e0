"""The Triton pointwise template against the reference engine: under the interpreter on the CPU
(small shapes) and, marked gpu, on CUDA at realistic sizes."""

from __future__ import annotations

import pytest

import opgraph as og
from opgraph.ops.pointwise import PointwiseMode
from opgraph.tools.samples import nhwc

from ..helpers import assert_engine_matches, pointwise_graph, requires_cuda, requires_interpreter

pytestmark = pytest.mark.interpreter
DT = og.DataType
M = PointwiseMode

SKIP = {M.GEN_INDEX}


@pytest.mark.parametrize("mode", [m for m in PointwiseMode if m not in SKIP], ids=lambda m: m.name)
def test_every_mode_fp32_nhwc(mode, rng):
    assert_engine_matches(pointwise_graph(mode, DT.FLOAT, "nhwc"), rng, expect_steps=1)


@pytest.mark.parametrize("dt", [DT.FLOAT, DT.HALF, DT.BFLOAT16], ids=lambda d: d.name)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("mode", [M.ADD, M.RELU_FWD, M.GELU_FWD, M.SIGMOID_BWD, M.CMP_GE, M.DIV])
def test_modes_by_dtype_and_layout(mode, dt, layout, rng):
    assert_engine_matches(pointwise_graph(mode, dt, layout), rng, expect_steps=1)


def test_gen_index(rng):
    g = og.Graph("gi", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[2, 3, 4], name="x")
    g.gen_index(x, axis=1).set_output(True).set_data_type(DT.INT32)
    g.add(g.gen_index(x, axis=2), x).set_output(True)
    assert_engine_matches(g, rng, expect_steps=1)


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_fused_dag_broadcast_scalars_casts_and_two_outputs(layout, rng):
    """relu(x*s + b + r) with s a pass-by-value scalar, b per channel, r a residual in the other layout,
    a device-memory clip, a mask output and a cast to int8."""
    dims = [2, 8, 5, 6]
    other = None if layout == "nhwc" else nhwc(dims)
    mine = nhwc(dims) if layout == "nhwc" else None
    g = og.Graph("dag", io_data_type=DT.HALF)
    x = g.tensor(dim=dims, stride=mine, name="x")
    r = g.tensor(dim=dims, stride=other, name="r")
    b = g.tensor(dim=[1, 8, 1, 1], name="b")
    s = g.tensor(dim=[1], data_type=DT.FLOAT, is_pass_by_value=True, name="s")
    clip = g.tensor(dim=[1], data_type=DT.FLOAT, name="clip")  # read from memory at run time
    t = g.add(g.bias(g.mul(x, s), b), r)
    y = g.relu(t, upper_clip=clip, name="relu").set_output(True).set_name("y")
    g.cmp_gt(t, 0.25).set_output(True).set_name("mask")
    g.identity(g.mul(y, 10.0)).set_output(True).set_data_type(DT.INT8).set_name("q")
    assert_engine_matches(g, rng, expect_steps=1)


def test_half_intermediate_is_rounded_like_the_reference(rng):
    g = og.Graph("round", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[64], name="x")
    h = g.mul(x, 1.0 / 3.0).set_data_type(DT.HALF)  # a virtual fp16 intermediate
    g.sub(g.mul(h, 3.0), x).set_output(True)
    assert_engine_matches(g, rng, expect_steps=1, rtol=0, atol=1e-7)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("dt", [DT.FLOAT, DT.HALF, DT.BFLOAT16], ids=lambda d: d.name)
def test_gpu_fused_dag(dt, rng):
    dims = [8, 64, 56, 56]
    g = og.Graph("dag", io_data_type=dt)
    x = g.tensor(dim=dims, stride=nhwc(dims), name="x")
    r = g.tensor(dim=dims, stride=nhwc(dims), name="r")
    b = g.tensor(dim=[1, 64, 1, 1], name="b")
    s = g.tensor(dim=[1, 64, 1, 1], name="s")
    g.relu(g.add(g.bias(g.mul(x, s), b), r)).set_output(True)
    assert_engine_matches(g, rng, device="cuda", expect_steps=1)


# -- slices and transposes of tensors in memory, read in place ------------------------------------------


def test_a_transposed_and_sliced_input_is_read_in_place(rng):
    g = og.Graph("views", io_data_type=og.DataType.HALF)
    x = g.tensor(dim=[2, 4, 8], name="x")
    b = g.tensor(dim=[1, 8, 1], name="b")
    view = g.slice(g.transpose(x, [0, 2, 1]), [slice(None), slice(None), slice(1, 4)])
    g.relu(g.add(view, b)).set_output(True)
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert plan.steps[0].config.knob("template") == "pointwise" and plan.workspace_size == 0
    assert "(p1 + 8)" in plan.source(0)  # the slice's start: column 1 of the transposed rows (stride 8)


def test_a_view_of_a_computed_value_or_a_view_written_out_is_not_this_templates():
    from opgraph.core.device import CPU
    from opgraph.engines.triton.templates.pointwise import TEMPLATE
    from opgraph.core.piece import make_piece

    g = og.Graph("computed", io_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[4, 8], name="x")
    g.add(g.transpose(g.relu(x), [1, 0]), 1.0).set_output(True)
    fg = g.final
    verdict = TEMPLATE.match(make_piece(fg, 0, list(fg.nodes)), CPU)
    assert not verdict and "takes a computed value" in verdict.reason
    g = og.Graph("copy", io_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[4, 8], name="x")
    g.transpose(x, [1, 0]).set_output(True)
    fg = g.final
    verdict = TEMPLATE.match(make_piece(fg, 0, list(fg.nodes)), CPU)
    assert not verdict and "does not copy them" in verdict.reason


def test_a_view_read_by_two_pieces_runs_and_matches(rng):
    g = og.Graph("two_readers", io_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[4, 8], name="x")
    b = g.tensor(dim=[8, 1], name="b")
    y = g.tensor(dim=[8, 3], name="y")
    t = g.transpose(x, [1, 0])
    g.relu(g.add(t, b)).set_output(True)
    g.add(g.slice(t, [slice(None), slice(1, 4)]), y).set_output(True)
    assert_engine_matches(g, rng, engines=("triton", "torch"))
