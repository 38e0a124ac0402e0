"""The Triton pointwise template against the reference engine: under the interpreter on the CPU
(small shapes) and, marked gpu, on CUDA at realistic sizes."""

from __future__ import annotations

import numpy as np
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


@pytest.mark.parametrize("out_type", [DT.INT32, DT.INT64, DT.FLOAT])
def test_integer_compares_and_indices_beside_fp32_math(out_type, rng):
    """A cross-entropy backward's shape: (exp(x - m) / s - (gen_index == target)) * seed, with INT64
    targets; gen_index also stored as `out_type` and compared with an INT32 tensor (every comparison
    mode). Integer values stay exact, the float math runs in fp32 (no float64 in the kernel body
    where no tensor is DOUBLE: see test_triton_reduction's test_integer_ops_keep_the_float_math_fp32)."""
    from opgraph.core.device import Device
    from opgraph.core.piece import make_piece
    from opgraph.engines.triton.templates.pointwise import TEMPLATE

    g = og.Graph("ceb", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    x = g.tensor(dim=[3, 2, 11], name="x")
    m = g.tensor(dim=[3, 2, 1], name="m", data_type=DT.FLOAT)
    s = g.tensor(dim=[3, 2, 1], name="s", data_type=DT.FLOAT)
    t = g.tensor(dim=[3, 2, 1], name="t", data_type=DT.INT64)
    k = g.tensor(dim=[3, 2, 11], name="k", data_type=DT.INT32)
    soft = g.div(g.exp(g.sub(x, m)), s)
    idx = g.gen_index(x, axis=2).set_data_type(DT.INT32)
    onehot = g.cmp_eq(idx, t).set_data_type(DT.FLOAT)
    g.mul(g.sub(soft, onehot), 0.5).set_output(True).set_name("dx")
    g.gen_index(x, axis=2).set_data_type(out_type).set_output(True).set_name("i")
    for mode in (M.CMP_NEQ, M.CMP_GT, M.CMP_GE, M.CMP_LT, M.CMP_LE):
        g.pointwise(idx, k, mode=mode).set_data_type(DT.FLOAT).set_output(True)

    def prepare(pack):
        final = g.final
        for uid, v in pack.items():
            if final.tensors[uid].data_type in (DT.INT64, DT.INT32) and uid in final.inputs:
                v[...] = np.arange(v.size).reshape(v.shape) * 5 % 11

    assert_engine_matches(g, rng, expect_steps=1, prepare=prepare)
    final = g.final
    piece = make_piece(final, 0, final.nodes)
    h100 = Device("cuda", 0, "H100", (9, 0), 132)
    body = TEMPLATE.generate(piece, TEMPLATE.candidates(piece, h100)[0], h100).source
    body = body[body.index("def kernel("):]
    assert "tl.exp(" in body and ".to(tl.int64) ==" in body, body
    exp_line = next(line for line in body.splitlines() if "tl.exp(" in line)
    assert "float64" not in exp_line, body


def _transposed(dims, perm, out_dt=DT.BFLOAT16, io=DT.FLOAT):
    """y = x * 2 + b (+ gen_index along the first axis) with x packed in axis order `perm` and y
    packed row-major: the tiled walk reads x and writes y along their contiguous axes."""
    g = og.Graph("t", io_data_type=io)
    strides, acc = [0] * len(dims), 1
    for a in reversed(perm):
        strides[a] = acc
        acc *= dims[a]
    x = g.tensor(dim=list(dims), stride=strides, name="x")
    b = g.tensor(dim=[1] * (len(dims) - 1) + [dims[-1]], name="b")
    lead = g.tensor(dim=[dims[0]] + [1] * (len(dims) - 1), stride=[0] * len(dims), name="lead")
    i = g.gen_index(x, axis=0).set_data_type(DT.FLOAT)
    y = g.add(g.add(g.mul(x, 2.0), b), g.mul(i, lead)).set_output(True).set_data_type(out_dt)
    y.set_stride(list(np.cumprod([1, *dims[::-1]])[:-1][::-1].tolist()))
    return g


@pytest.mark.parametrize("dims,perm", [((300, 260), (1, 0)), ((3, 70, 130), (0, 2, 1)),
                                       ((2, 3, 40, 50), (0, 3, 1, 2)), ((5, 130, 33), (2, 0, 1))])
def test_transposed_input_walks_tiles(dims, perm, rng):
    """A cast of a transposed weight (GPT-2's tied lm_head: [50304, 768] fp32 read as its transpose)
    reads with a stride in the flat walk; the template tiles the two contiguous axes instead."""
    plan = assert_engine_matches(_transposed(dims, perm), rng, expect_steps=1)
    assert plan.steps[0].config.knob("TILE_I") is not None, plan.describe()


def test_flat_walk_where_nothing_is_transposed(rng):
    plan = assert_engine_matches(_transposed((40, 300), (0, 1)), rng, expect_steps=1)
    assert plan.steps[0].config.knob("BLOCK") is not None, plan.describe()


HOPPER_CASES = {
    "transposed_cast": (lambda: _transposed((50304, 768), (1, 0)), "pointwise", None),
}


def test_kernels_compile_for_hopper():
    from .hopper_compile import compile_for_hopper

    out = compile_for_hopper(__name__)
    assert out.count("compiled") >= len(HOPPER_CASES), out
    assert " spills 0 " in out, out
