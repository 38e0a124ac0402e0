"""The Triton normalization templates (norm_stats: batchnorm training/inference/backward and
instancenorm; rownorm: layernorm and rmsnorm) against the reference engine: under the interpreter on
the CPU (small shapes), alone and fused with pointwise prologues and epilogues, NCHW and NHWC,
fp32/fp16/bf16, scalars given three ways; marked gpu, on CUDA at the benchmark shapes."""

from __future__ import annotations

import ast

import numpy as np
import pytest

import opgraph as og
from opgraph.core.device import Device
from opgraph.engines import get_engine
from opgraph.core.config import EngineConfig
from opgraph.engines.triton.templates import norm_stats, rownorm
from opgraph.runtime.plan import ExecutionPlan
from opgraph.build.planner import Step
from opgraph.tools.samples import nhwc
from opgraph.testing import check_plan

from ..helpers import assert_engine_matches, layout_stride, outputs, per_channel, requires_cuda, requires_interpreter
from .hopper_compile import compile_for_hopper

# CPU tests run the kernels in Triton's interpreter (requires_interpreter), GPU tests compile them
# (gpu + requires_cuda); neither kind runs on the other machine.
DT = og.DataType
FLOAT, HALF, BF16 = DT.FLOAT, DT.HALF, DT.BFLOAT16
DTYPES = [FLOAT, HALF, BF16]
TRAIN, INFER = og.NormForwardPhase.TRAINING, og.NormForwardPhase.INFERENCE
H100 = Device("cuda", 0, "H100", (9, 0), 132)
CPU = Device("cpu")
EPS, MOMENTUM = 2.0**-10, 0.125


def scalar(g, kind, name):
    """epsilon/momentum as a Python number, a pass-by-value tensor or a 1-element device tensor."""
    if kind == "number":
        return EPS if name == "eps" else MOMENTUM
    return g.tensor(dim=[1], data_type=FLOAT, is_pass_by_value=kind == "by_value", name=name)


def setter(values):
    """A `prepare` hook: overwrite the named inputs (tensor handle -> value) in the pack."""

    def prepare(pack):
        for t, v in values.items():
            if isinstance(t, og.Tensor):
                if isinstance(pack[t.uid], np.ndarray):
                    pack[t.uid][...] = np.asarray(v)
                else:
                    pack[t.uid] = float(v)

    return prepare


def template_of(plan, step=0):
    return plan.steps[step].config.knob("template")


def run_knobs(g, rng, template, knobs, **kw):
    """Run g's single piece with explicit knobs (e.g. the GPU heuristic's) under the interpreter."""
    plan = g.build(device="cpu", engines=["triton"])
    assert len(plan.steps) == 1
    piece = plan.steps[0].piece
    cfg = EngineConfig("triton", (("template", template), *sorted(knobs.items())))
    kernel = get_engine("triton").compile(piece, cfg, plan.device)
    plan = ExecutionPlan(plan.graph, plan.device, (Step(0, piece, cfg, kernel),), ())
    bad = check_plan(plan, rng, **kw)
    assert not bad, "\n".join(map(str, bad))


# -- batchnorm training forward ---------------------------------------------------------------------


def bn_graph(
    dims, layout, dt, *, eps="number", momentum="number", running=True, stats_out=True, relu=True, y_out=False
):
    g = og.Graph("bn", io_data_type=dt)
    c = per_channel(dims)
    x = g.tensor(dim=list(dims), stride=layout_stride(dims, layout), name="x")
    scale, bias = g.tensor(dim=c, data_type=FLOAT, name="scale"), g.tensor(dim=c, data_type=FLOAT, name="bias")
    rm = rv = mom = None
    if running:
        rm, rv = g.tensor(dim=c, data_type=FLOAT, name="rm"), g.tensor(dim=c, data_type=FLOAT, name="rv")
        mom = scalar(g, momentum, "momentum")
    e = scalar(g, eps, "eps")
    y, mean, inv, nrm, nrv = g.batchnorm(x, scale, bias, rm, rv, epsilon=e, momentum=mom, name="bn")
    if stats_out:
        outputs(mean, inv)
    outputs(nrm, nrv)
    if relu:
        g.relu(y, name="relu").set_output(True).set_name("out")
    if y_out or not relu:
        y.set_output(True)
    values = {e: EPS, mom: MOMENTUM} if running else {e: EPS}
    if running:
        values[rv] = np.random.default_rng(1).uniform(0.5, 2.0, c)
    return g, setter(values)


@pytest.mark.parametrize("kind", ["number", "by_value", "tensor"])
@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@requires_interpreter
def test_batchnorm_relu_running_stats(layout, dt, kind, rng):
    """Statistics, saved mean/inv_variance, running-stat update and relu as one step."""
    g, prep = bn_graph([2, 6, 5, 6], layout, dt, eps=kind, momentum=kind)
    plan = assert_engine_matches(g, rng, expect_steps=1, prepare=prep)
    assert template_of(plan) == "norm_stats"
    assert len(plan.steps[0].kernel.generated.launches) == 3


@pytest.mark.parametrize(
    "dims,layout",
    [
        ([7, 5], "nchw"),
        ([3, 4, 5], "nhwc"),
        ([2, 3, 2, 3, 4], "nhwc"),
        ([2, 3, 2, 3, 4], "nchw"),
        ([2, 1, 3, 5], "nchw"),
        ([1, 3, 1, 1], "nchw"),
    ],
)
@requires_interpreter
def test_batchnorm_ranks_and_edge_shapes(dims, layout, rng):
    g, prep = bn_graph(dims, layout, FLOAT, running=int(np.prod(dims)) // dims[1] > 1, y_out=True)
    assert_engine_matches(g, rng, expect_steps=1, prepare=prep)


@requires_interpreter
def test_batchnorm_optional_outputs_absent(rng):
    """No running stats and y virtual: mean, inv_variance and relu's output are written."""
    g, prep = bn_graph([2, 5, 3, 4], "nhwc", HALF, running=False)
    plan = assert_engine_matches(g, rng, expect_steps=1, prepare=prep)
    assert len(plan.graph.outputs) == 3


@requires_interpreter
def test_batchnorm_inplace_running_stats(rng):
    """next_running_* reuse the UIDs of in_running_* (a cuDNN-style in-place update)."""
    g = og.Graph("bn", io_data_type=FLOAT)
    dims, c = [4, 3, 2, 2], [1, 3, 1, 1]
    x = g.tensor(dim=dims, stride=nhwc(dims), name="x")
    scale, bias = g.tensor(dim=c, name="s"), g.tensor(dim=c, name="b")
    rm, rv = g.tensor(dim=c, name="rm", uid=100), g.tensor(dim=c, name="rv", uid=101)
    y, mean, inv, nrm, nrv = g.batchnorm(x, scale, bias, rm, rv, epsilon=EPS, momentum=MOMENTUM)
    outputs(y, mean, inv, nrm, nrv)
    nrm.set_uid(100)
    nrv.set_uid(101)
    assert_engine_matches(g, rng, expect_steps=1, prepare=setter({rv: np.full(c, 2.0)}))


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@requires_interpreter
def test_batchnorm_prologue_epilogue_several_outputs(layout, rng):
    """relu(bn(x + r) + r2) with a clip read from memory, the sum x + r also written, an int8 cast and a
    mask output: one step, x read twice (stats pass, apply pass)."""
    dims = [2, 6, 5, 6]
    other = None if layout == "nhwc" else nhwc(dims)
    g = og.Graph("bn_fused", io_data_type=HALF)
    x = g.tensor(dim=dims, stride=layout_stride(dims, layout), name="x")
    r = g.tensor(dim=dims, stride=other, name="r")  # the residual in the other layout
    r2 = g.tensor(dim=dims, stride=layout_stride(dims, layout), name="r2")
    c = per_channel(dims)
    scale, bias = g.tensor(dim=c, data_type=FLOAT, name="s"), g.tensor(dim=c, data_type=FLOAT, name="b")
    clip = g.tensor(dim=[1], data_type=FLOAT, name="clip")
    s = g.add(x, r, name="residual")
    s.set_output(True)
    y, mean, inv, _, _ = g.batchnorm(s, scale, bias, epsilon=1e-5, name="bn")
    z = g.relu(g.add(y, r2, name="add2"), upper_clip=clip, name="relu").set_output(True)
    g.cmp_gt(y, 0.0, name="mask").set_output(True)
    g.identity(g.mul(z, 10.0), name="q").set_output(True).set_data_type(DT.INT8)
    outputs(mean, inv)
    plan = assert_engine_matches(g, rng, expect_steps=1, prepare=setter({clip: 1.5}))
    assert template_of(plan) == "norm_stats"


@requires_interpreter
def test_batchnorm_large_mean_small_variance(rng):
    """Statistics stay accurate in fp32 when |mean| >> std (shifted sums and an exact chunk merge)."""
    g, prep = bn_graph([4, 3, 8, 8], "nhwc", FLOAT, running=False, relu=False)
    x = g.final.tensor("x")

    def prepare(pack):
        prep(pack)
        pack[x.uid][...] = 1000.0 + np.random.default_rng(5).uniform(-1, 1, x.dim)

    # unshifted sums of squares in fp32 would get the variance wrong by ~10%, and (x - mean) with mean
    # rounded to fp32 near 1000 would be off by ~3e-5
    assert_engine_matches(g, rng, expect_steps=1, prepare=prepare)


@requires_interpreter
def test_batchnorm_mean_near_zero_keeps_its_relative_precision(rng):
    """bench v2 found batchnorm's mean 29x less accurate than cuDNN's (relative L2 8.9e-6 vs 1e-7 on
    zero-mean data): the shifted sums give the mean as K + (mean - K), precise to ~eps |K| only, which
    is far from the mean's own precision where |mean| << |K|. The unshifted sums give it here."""
    dims = [8, 4, 16, 16]
    g, prep = bn_graph(dims, "nhwc", FLOAT, running=False, relu=False)
    final = g.final
    x = final.tensor("x")
    mean_uid = next(u for u in final.outputs if final.tensors[u].name == "bn::mean")
    data = np.random.default_rng(7).standard_normal(dims).astype(np.float32)
    data[0, :, 0, 0] = [4.0, -4.0, 3.0, -3.5]  # the shift K: x at the slot's first element
    plan = g.build(device="cpu", engines=["triton"])
    assert template_of(plan) == "norm_stats"
    pack = og.testing.random_pack(final, rng)
    prep(pack)
    pack[x.uid][...] = data
    pack[mean_uid][...] = np.nan
    plan.execute(pack)
    exact = data.astype(np.float64).mean(axis=(0, 2, 3))
    got = np.asarray(pack[mean_uid], dtype=np.float64).reshape(-1)
    rel = np.linalg.norm(got - exact) / np.linalg.norm(exact)
    assert rel < 1e-6, (rel, got, exact)  # K + (mean - K): 4e-6 here


@requires_interpreter
def test_statistic_read_by_a_pointwise_op_is_a_separate_piece(rng):
    """An op reading bn's mean cannot join the fused piece: the plan cuts there and says why."""
    g, prep = bn_graph([2, 4, 3, 3], "nchw", FLOAT, running=False)
    mean = next(t for t in g._tensors if t.name == "bn::mean")
    g.mul(mean, 2.0, name="twice").set_output(True)
    plan = assert_engine_matches(g, rng, expect_steps=2, prepare=prep)
    assert "reads a statistic of batchnorm" in plan.describe()


# -- batchnorm backward -----------------------------------------------------------------------------


def bn_bwd_graph(
    dims, layout, dt, *, saved=True, drelu=True, eps="number", kind="batchnorm", grads_out=("dscale", "dbias")
):
    g = og.Graph("bnb", io_data_type=dt)
    st = layout_stride(dims, layout)
    c = per_channel(dims)
    stats = c if kind == "batchnorm" else list(dims[:2]) + [1] * (len(dims) - 2)
    x = g.tensor(dim=list(dims), stride=st, name="x")
    dy = g.tensor(dim=list(dims), stride=st, name="dy")
    scale = g.tensor(dim=c, data_type=FLOAT, name="scale")
    values = {}
    if drelu:
        yf = g.tensor(dim=list(dims), stride=st, name="y_fwd")
        dy = g.relu_backward(dy, yf, name="drelu")
    build = g.batchnorm_backward if kind == "batchnorm" else g.instancenorm_backward
    if saved:
        mean, inv = g.tensor(dim=stats, data_type=FLOAT, name="mean"), g.tensor(dim=stats, data_type=FLOAT, name="inv")
        dx, dscale, dbias = build(dy, x, scale, mean, inv, name="bwd")
    else:
        e = scalar(g, eps, "eps")
        values[e] = EPS
        dx, dscale, dbias = build(dy, x, scale, epsilon=e, name="bwd")
    dx.set_output(True)
    for name, t in (("dscale", dscale), ("dbias", dbias)):
        if name in grads_out:
            t.set_output(True)
    return g, setter(values)


@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("saved", [True, False], ids=["saved", "recompute"])
@requires_interpreter
def test_batchnorm_backward_drelu(saved, layout, dt, rng):
    """dx, dscale, dbias with relu_backward producing the gradient: one step, two passes."""
    g, prep = bn_bwd_graph([2, 6, 5, 6], layout, dt, saved=saved)
    plan = assert_engine_matches(g, rng, expect_steps=1, prepare=prep)
    assert template_of(plan) == "norm_stats"


@pytest.mark.parametrize("kind", ["by_value", "tensor"])
@requires_interpreter
def test_batchnorm_backward_epsilon_tensor(kind, rng):
    g, prep = bn_bwd_graph([3, 5, 4, 2], "nhwc", FLOAT, saved=False, drelu=False, eps=kind)
    assert_engine_matches(g, rng, expect_steps=1, prepare=prep)


@requires_interpreter
def test_batchnorm_backward_dscale_feeds_the_next_piece(rng):
    """dscale and dbias virtual, read by an update of the parameters (a separate pointwise piece):
    they cross pieces through the workspace."""
    g, prep = bn_bwd_graph([2, 3, 4, 4], "nchw", HALF, grads_out=())
    dscale, dbias = (next(t for t in g._tensors if t.name == f"bwd::{n}") for n in ("dscale", "dbias"))
    scale = next(t for t in g._tensors if t.name == "scale")
    g.sub(scale, g.mul(g.add(dscale, dbias), 0.5), name="update").set_output(True).set_data_type(FLOAT)
    plan = assert_engine_matches(g, rng, expect_steps=2, prepare=prep)
    assert plan.workspace_size > 0


@requires_interpreter
def test_batchnorm_backward_with_dx_epilogue(rng):
    """dx + a second gradient (a residual branch) written as one tensor."""
    dims = [2, 4, 3, 5]
    g, prep = bn_bwd_graph(dims, "nhwc", HALF, drelu=False)
    dx = next(t for t in g._tensors if t.name == "bwd::dx")
    dx.set_output(False)
    other = g.tensor(dim=dims, stride=nhwc(dims), name="other_grad")
    g.add(dx, other, name="sum_grads").set_output(True)
    assert_engine_matches(g, rng, expect_steps=1, prepare=prep)


# -- batchnorm inference ----------------------------------------------------------------------------


@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@requires_interpreter
def test_batchnorm_inference_fused(layout, dt, rng):
    """relu(bn_inference(x + r)): one pass."""
    dims = [2, 6, 3, 5]
    g = og.Graph("bni", io_data_type=dt)
    x = g.tensor(dim=dims, stride=layout_stride(dims, layout), name="x")
    r = g.tensor(dim=dims, stride=layout_stride(dims, layout), name="r")
    c = per_channel(dims)
    mean, inv, scale, bias = (g.tensor(dim=c, data_type=FLOAT, name=n) for n in ("m", "iv", "s", "b"))
    y = g.batchnorm_inference(g.add(x, r), mean, inv, scale, bias, name="bni")
    g.relu(y).set_output(True)
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert len(plan.steps[0].kernel.generated.launches) == 1


@requires_interpreter
def test_batchnorm_inference_alone_2d(rng):
    g = og.Graph("bni", io_data_type=HALF)
    x = g.tensor(dim=[9, 5], name="x")
    c = [1, 5]
    mean, inv, scale, bias = (g.tensor(dim=c, data_type=FLOAT, name=n) for n in ("m", "iv", "s", "b"))
    g.batchnorm_inference(x, mean, inv, scale, bias).set_output(True)
    assert_engine_matches(g, rng, expect_steps=1)


# -- instancenorm ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("phase", [TRAIN, INFER], ids=["training", "inference"])
@requires_interpreter
def test_instancenorm_forward(phase, layout, dt, rng):
    dims = [3, 5, 4, 3]
    g = og.Graph("in", io_data_type=dt)
    x = g.tensor(dim=dims, stride=layout_stride(dims, layout), name="x")
    c = per_channel(dims)
    scale, bias = g.tensor(dim=c, data_type=FLOAT, name="s"), g.tensor(dim=c, data_type=FLOAT, name="b")
    eps = scalar(g, "by_value" if dt is HALF else "tensor" if dt is BF16 else "number", "eps")
    y, mean, inv = g.instancenorm(phase, x, scale, bias, eps, name="in")
    outputs(mean, inv)
    g.gelu(y, name="gelu").set_output(True)
    assert_engine_matches(g, rng, expect_steps=1, prepare=setter({eps: EPS}))


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("saved", [True, False], ids=["saved", "recompute"])
@requires_interpreter
def test_instancenorm_backward(saved, layout, rng):
    g, prep = bn_bwd_graph([3, 5, 4, 3], layout, HALF, saved=saved, kind="instancenorm", drelu=saved)
    plan = assert_engine_matches(g, rng, expect_steps=1, prepare=prep)
    assert template_of(plan) == "norm_stats"


# -- layernorm / rmsnorm ------------------------------------------------------------------------------

LN_CASES = {  # name: (input dims, scale dims, layout)
    "2d": ([6, 20], [1, 20], "nchw"),
    "3d_last": ([2, 3, 8], [1, 1, 8], "nchw"),
    "4d_nchw": ([3, 3, 4, 5], [1, 3, 4, 5], "nchw"),
    "4d_nhwc": ([3, 3, 4, 5], [1, 3, 4, 5], "nhwc"),
    "4d_nhwc_channels": ([2, 6, 2, 3], [1, 6, 1, 1], "nhwc"),
}


def stats_dims(dims, sdims):
    return [d if s == 1 else 1 for d, s in zip(dims, sdims)]


@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("case", LN_CASES)
@requires_interpreter
def test_layernorm_forward(case, dt, rng):
    dims, sdims, layout = LN_CASES[case]
    g = og.Graph("ln", io_data_type=dt)
    x = g.tensor(dim=dims, stride=layout_stride(dims, layout), name="x")
    scale, bias = g.tensor(dim=sdims, data_type=FLOAT, name="s"), g.tensor(dim=sdims, data_type=FLOAT, name="b")
    y, mean, inv = g.layernorm(TRAIN, x, scale, bias, epsilon=EPS, name="ln")
    outputs(y, mean, inv)
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert template_of(plan) == "rownorm"


@pytest.mark.parametrize("dims", [[1, 20], [1, 1, 6], [3, 1]])
@requires_interpreter
def test_layernorm_single_row_or_column(dims, rng):
    g = og.Graph("ln", io_data_type=HALF)
    x = g.tensor(dim=dims, name="x")
    sdims = [1] + dims[1:]
    scale, bias = (
        (None, None)
        if dims[-1] == 1
        else (g.tensor(dim=sdims, data_type=FLOAT, name="s"), g.tensor(dim=sdims, data_type=FLOAT, name="b"))
    )
    outputs(*g.layernorm(TRAIN, x, scale, bias, epsilon=EPS))
    assert_engine_matches(g, rng, expect_steps=1)


@pytest.mark.parametrize("kind", ["number", "by_value", "tensor"])
@requires_interpreter
def test_layernorm_residual_prologue_gelu_epilogue(kind, rng):
    """h = x + r (written: the residual stream), y = gelu(layernorm(h)), inference phase."""
    dims = [5, 24]
    g = og.Graph("ln", io_data_type=BF16)
    x, r = g.tensor(dim=dims, name="x"), g.tensor(dim=dims, name="r")
    scale, bias = g.tensor(dim=[1, 24], data_type=FLOAT, name="s"), g.tensor(dim=[1, 24], data_type=FLOAT, name="b")
    eps = scalar(g, kind, "eps")
    h = g.add(x, r, name="residual").set_output(True)
    y, _, _ = g.layernorm(INFER, h, scale, bias, epsilon=eps, name="ln")
    g.gelu(y, name="gelu").set_output(True)
    assert_engine_matches(g, rng, expect_steps=1, prepare=setter({eps: EPS}))


@pytest.mark.parametrize("params", ["none", "scale", "bias"])
@requires_interpreter
def test_layernorm_without_scale_or_bias(params, rng):
    dims = [4, 3, 5]
    g = og.Graph("ln", io_data_type=FLOAT)
    x = g.tensor(dim=dims, name="x")
    scale = g.tensor(dim=[1, 3, 5], name="s") if params == "scale" else None
    bias = g.tensor(dim=[1, 3, 5], name="b") if params == "bias" else None
    y, mean, inv = g.layernorm(TRAIN, x, scale, bias, epsilon=EPS)
    outputs(y, mean, inv)
    assert_engine_matches(g, rng, expect_steps=1)


@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("case", ["2d", "4d_nchw", "4d_nhwc"])
@requires_interpreter
def test_layernorm_backward(case, dt, rng):
    dims, sdims, layout = LN_CASES[case]
    st = layout_stride(dims, layout)
    g = og.Graph("lnb", io_data_type=dt)
    x, dy = g.tensor(dim=dims, stride=st, name="x"), g.tensor(dim=dims, stride=st, name="dy")
    scale = g.tensor(dim=sdims, data_type=FLOAT, name="s")
    mean, inv = (g.tensor(dim=stats_dims(dims, sdims), data_type=FLOAT, name=n) for n in ("m", "iv"))
    outputs(*g.layernorm_backward(dy, x, scale, mean, inv, name="lnb"))
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert len(plan.steps[0].kernel.generated.launches) == 2


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: d.name)
@requires_interpreter
def test_rmsnorm_forward(dt, bias, rng):
    dims = [7, 12]
    g = og.Graph("rms", io_data_type=dt)
    x = g.tensor(dim=dims, name="x")
    scale = g.tensor(dim=[1, 12], data_type=FLOAT, name="s")
    b = g.tensor(dim=[1, 12], data_type=FLOAT, name="b") if bias else None
    y, inv = g.rmsnorm(TRAIN, x, scale, b, epsilon=EPS)
    outputs(y, inv)
    assert_engine_matches(g, rng, expect_steps=1)


@pytest.mark.parametrize("dbias", [False, True], ids=["no_dbias", "dbias"])
@pytest.mark.parametrize("case", ["2d", "4d_nhwc"])
@requires_interpreter
def test_rmsnorm_backward(case, dbias, rng):
    dims, sdims, layout = LN_CASES[case]
    st = layout_stride(dims, layout)
    g = og.Graph("rmsb", io_data_type=HALF)
    x, dy = g.tensor(dim=dims, stride=st, name="x"), g.tensor(dim=dims, stride=st, name="dy")
    scale = g.tensor(dim=sdims, data_type=FLOAT, name="s")
    inv = g.tensor(dim=stats_dims(dims, sdims), data_type=FLOAT, name="iv")
    dx, dscale, db = g.rmsnorm_backward(dy, x, scale, inv, has_dbias=dbias)
    outputs(dx, dscale, db)
    assert_engine_matches(g, rng, expect_steps=1)


@pytest.mark.parametrize("dt", [FLOAT, BF16], ids=lambda d: d.name)
@requires_interpreter
def test_layernorm_of_a_strided_row(dt, rng):
    """NCHW input normalized over C alone (ConvNeXt's channels-last layernorm on an NCHW tensor; ViT's
    over the hidden axis of a tensor laid out [1, 64, 2]): each column read with a stride, with every
    candidate of the GPU and CPU heuristics."""
    for dims, stride in (([2, 6, 2, 3], None), ([2, 5, 6], [1, 12, 2])):
        g = og.Graph("ln", io_data_type=dt)
        x = g.tensor(dim=dims, stride=stride, name="x")
        sdims = [1, 6, 1, 1] if len(dims) == 4 else [1, 1, 6]
        scale, bias = g.tensor(dim=sdims, data_type=FLOAT, name="s"), g.tensor(dim=sdims, data_type=FLOAT, name="b")
        outputs(*g.layernorm(TRAIN, x, scale, bias, epsilon=EPS))
        plan = assert_engine_matches(g, rng, expect_steps=1)
        assert template_of(plan) == "rownorm"
        assert rownorm.TEMPLATE.match(plan.steps[0].piece, CPU).g.strided
        every_candidate(g, rng, "rownorm")


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
@requires_interpreter
def test_norm_backward_of_a_strided_row(kind, rng):
    """The backward over the channels of an NCHW tensor: dx, dscale (and dbias) with row tiles."""
    dims = [2, 6, 3, 3]
    g = og.Graph("lnb", io_data_type=FLOAT)
    x, dy = g.tensor(dim=dims, name="x"), g.tensor(dim=dims, name="dy")
    scale = g.tensor(dim=[1, 6, 1, 1], name="s")
    inv = g.tensor(dim=[2, 1, 3, 3], name="iv")
    if kind == "layernorm":
        mean = g.tensor(dim=[2, 1, 3, 3], name="m")
        outputs(*g.layernorm_backward(dy, x, scale, mean, inv, name="lnb"))
    else:
        outputs(*g.rmsnorm_backward(dy, x, scale, inv, has_dbias=True))
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert template_of(plan) == "rownorm"
    every_candidate(g, rng, "rownorm")


# -- views: read in place, written through ----------------------------------------------------------


def _affine(g, n, dt=FLOAT):
    return g.tensor(dim=[1, 1, n], data_type=dt, name="s"), g.tensor(dim=[1, 1, n], data_type=dt, name="b")


@requires_interpreter
def test_layernorm_reads_a_reshape_with_a_residual_view(rng):
    """OPT's pattern: layernorm(reshape(h)) where h is in memory, and a residual add reading another
    reshape: one rownorm step, no copy of the views."""
    g = og.Graph("ln", io_data_type=FLOAT)
    h, r = g.tensor(dim=[2, 3, 16], name="h"), g.tensor(dim=[2, 3, 16], name="r")
    s = g.tensor(dim=[1, 16], name="s")
    b = g.tensor(dim=[1, 16], name="b")
    x = g.add(g.reshape(h, [6, 16], name="flat"), g.reshape(r, [6, 16], name="flat_r"), name="residual")
    y, _, _ = g.layernorm(INFER, x, s, b, epsilon=EPS, name="ln")
    y.set_output(True)
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert template_of(plan) == "rownorm"
    every_candidate(g, rng, "rownorm")


@pytest.mark.parametrize("token", [0, 3])
@requires_interpreter
def test_layernorm_of_the_class_token_slice(token, rng):
    """The class token of a sequence (or another): layernorm(x[:, t, :]), a slice read in place (a
    strided view, from an offset)."""
    g = og.Graph("ln", io_data_type=HALF)
    x = g.tensor(dim=[3, 5, 24], name="x")
    cls = g.slice(x, [slice(None), slice(token, token + 1), slice(None)], name="cls")
    s, b = _affine(g, 24, FLOAT)
    y, mean, inv = g.layernorm(TRAIN, cls, s, b, epsilon=EPS, name="ln")
    outputs(y, mean, inv)
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert template_of(plan) == "rownorm"


@pytest.mark.parametrize("back", [False, True], ids=["nhwc_out", "permuted_back"])
@requires_interpreter
def test_channels_last_layernorm_of_an_nchw_tensor(back, rng):
    """ConvNeXt's layernorm: permute NCHW -> NHWC, layernorm over C, (permuted back to NCHW): the input
    read through the transpose, the output written through the inverse one."""
    g = og.Graph("ln", io_data_type=FLOAT)
    x = g.tensor(dim=[2, 6, 3, 5], name="x")
    nhwc_x = g.transpose(x, [0, 2, 3, 1], name="to_nhwc")
    s, b = g.tensor(dim=[1, 1, 1, 6], name="s"), g.tensor(dim=[1, 1, 1, 6], name="b")
    y, _, _ = g.layernorm(INFER, nhwc_x, s, b, epsilon=EPS, name="ln")
    if back:
        out = g.transpose(g.gelu(y, name="gelu"), [0, 3, 1, 2], name="to_nchw")
        out.set_output(True)
    else:
        y.set_output(True)
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert template_of(plan) == "rownorm"
    every_candidate(g, rng, "rownorm")


@requires_interpreter
def test_layernorm_output_reshaped_and_kept(rng):
    """y written twice: as itself and through a reshape to a graph output ([6, 16] -> [2, 3, 16])."""
    g = og.Graph("ln", io_data_type=BF16)
    x = g.tensor(dim=[6, 16], name="x")
    s, b = g.tensor(dim=[1, 16], data_type=FLOAT, name="s"), g.tensor(dim=[1, 16], data_type=FLOAT, name="b")
    y, _, _ = g.layernorm(INFER, x, s, b, epsilon=EPS, name="ln")
    y.set_output(True)
    g.reshape(y, [2, 3, 16], name="unflat").set_output(True)
    plan = assert_engine_matches(g, rng)
    assert all(template_of(plan, i) in ("rownorm", "pointwise") for i in range(len(plan.steps)))


@requires_interpreter
def test_rownorm_refuses_a_view_of_a_value_it_computes(rng):
    """A reshape of a value computed in the piece, before the norm, needs a copy: rownorm says why, and
    the plan runs the add and the layernorm as two generated kernels."""
    g = og.Graph("ln", io_data_type=FLOAT)
    h, r = g.tensor(dim=[2, 3, 16], name="h"), g.tensor(dim=[2, 3, 16], name="r")
    s, b = g.tensor(dim=[1, 16], name="s"), g.tensor(dim=[1, 16], name="b")
    x = g.reshape(g.add(h, r, name="residual"), [6, 16], name="flat")
    g.layernorm(INFER, x, s, b, epsilon=EPS, name="ln")[0].set_output(True)
    plan = assert_engine_matches(g, rng, expect_steps=2)
    assert [template_of(plan, i) for i in range(2)] == ["pointwise", "rownorm"]
    assert any("takes a computed value" in why for c in plan.cuts for _, why in c.reasons), plan.describe()


# -- knob variants (the GPU heuristics' tiles, run by the interpreter) -------------------------------


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@requires_interpreter
def test_norm_stats_gpu_and_alternative_knobs(layout, rng):
    """Every candidate the templates propose, on the GPU (big tiles, mostly masked here) and on the
    CPU (small tiles, several chunks: each apply order)."""
    for dims, device in (([2, 40, 3, 5], H100), ([2, 12, 5, 7], Device("cpu"))):
        g, prep = bn_graph(dims, layout, HALF)
        piece = g.build(device="cpu", engines=["triton"]).steps[0].piece
        for k in norm_stats.TEMPLATE.candidates(piece, device):
            run_knobs(g, rng, "norm_stats", k, prepare=prep)


def every_candidate(g, rng, template, devices=(H100, CPU), **kw):
    """Run g's single piece with every candidate `template` proposes for each of `devices`."""
    piece = g.build(device="cpu", engines=["triton"]).steps[0].piece
    tpl = {"norm_stats": norm_stats, "rownorm": rownorm}[template].TEMPLATE
    seen = []
    for device in devices:
        for k in tpl.candidates(piece, device):
            if k not in seen:
                seen.append(k)
                run_knobs(g, rng, template, k, **kw)
    return seen


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize(
    "case", ["fused_forward", "backward_saved", "backward_recompute", "instancenorm", "instancenorm_backward"]
)
@requires_interpreter
def test_norm_stats_stats_loop_variants(case, layout, rng):
    """The stats loop's variants (plain, pipelined (ST), register double buffering (PF)) with several
    chunk iterations and ragged tiles, on pieces whose loop loads more than x: a residual prologue,
    dy through relu_backward, per-sample statistics."""
    dims = [2, 12, 5, 7]
    if case == "fused_forward":
        g = og.Graph("bn", io_data_type=HALF)
        x = g.tensor(dim=dims, stride=layout_stride(dims, layout), name="x")
        r = g.tensor(dim=dims, stride=None if layout == "nhwc" else nhwc(dims), name="r")
        c = per_channel(dims)
        y, mean, inv, _, _ = g.batchnorm(
            g.add(x, r), g.tensor(dim=c, data_type=FLOAT), g.tensor(dim=c, data_type=FLOAT), epsilon=1e-5
        )
        outputs(mean, inv)
        g.relu(y).set_output(True)
        prep = None
    elif case.startswith("backward"):
        g, prep = bn_bwd_graph(dims, layout, HALF, saved=case == "backward_saved")
    elif case == "instancenorm":
        g = og.Graph("in", io_data_type=BF16)
        x = g.tensor(dim=dims, stride=layout_stride(dims, layout), name="x")
        c = per_channel(dims)
        outputs(*g.instancenorm(TRAIN, x, g.tensor(dim=c, data_type=FLOAT), g.tensor(dim=c, data_type=FLOAT), EPS))
        prep = None
    else:
        g, prep = bn_bwd_graph(dims, layout, HALF, saved=False, kind="instancenorm")
    seen = every_candidate(g, rng, "norm_stats", prepare=prep)
    assert any(k["PF"] for k in seen) and any(k["ST"] > 1 for k in seen)


@pytest.mark.parametrize("case", ["layernorm", "layernorm_fused", "rmsnorm"])
@pytest.mark.parametrize("backward", [False, True])
@requires_interpreter
def test_rownorm_gpu_and_alternative_knobs(case, backward, rng):
    """Every candidate (one tile or a row loop per program, pipelined or register double-buffered
    backward) on rows that several loop iterations walk, with a ragged last tile."""
    dims = [9, 40]
    g = og.Graph("ln", io_data_type=HALF)
    x = g.tensor(dim=dims, name="x")
    scale = g.tensor(dim=[1, 40], data_type=FLOAT, name="s")
    if case == "layernorm_fused":  # a residual prologue and an epilogue
        x = g.add(x, g.tensor(dim=dims, name="r"), name="residual")
    rms = case == "rmsnorm"
    if backward:
        dy = g.tensor(dim=dims, name="dy")
        inv = g.tensor(dim=[9, 1], data_type=FLOAT, name="iv")
        if rms:
            outputs(*g.rmsnorm_backward(dy, x, scale, inv, has_dbias=True))
        else:
            mean = g.tensor(dim=[9, 1], data_type=FLOAT, name="m")
            dx, ds, db = g.layernorm_backward(dy, x, scale, mean, inv)
            outputs(ds, db)
            (g.mul(dx, 2.0, name="twice") if case == "layernorm_fused" else dx).set_output(True)
    elif rms:
        outputs(*g.rmsnorm(TRAIN, x, scale, epsilon=EPS))
    else:
        y, mean, inv = g.layernorm(TRAIN, x, scale, None, epsilon=EPS)
        outputs(mean, inv)
        (g.gelu(y, name="gelu") if case == "layernorm_fused" else y).set_output(True)
    seen = every_candidate(g, rng, "rownorm")
    assert any(k["PF"] for k in seen) if backward else any(k["FP"] for k in seen)


# -- on the GPU, at the benchmark shapes ----------------------------------------------------------


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
def test_gpu_batchnorm_relu(layout, rng):
    g, prep = bn_graph([32, 256, 56, 56], layout, HALF)
    assert_engine_matches(g, rng, device="cuda", expect_steps=1, prepare=prep)


@pytest.mark.gpu
@requires_cuda
def test_gpu_batchnorm_backward_drelu(rng):
    g, prep = bn_bwd_graph([32, 256, 56, 56], "nhwc", HALF)
    assert_engine_matches(g, rng, device="cuda", expect_steps=1, prepare=prep)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("backward", [False, True])
def test_gpu_layernorm(backward, rng):
    dims = [8192, 4096]
    g = og.Graph("ln", io_data_type=BF16)
    x = g.tensor(dim=dims, name="x")
    scale = g.tensor(dim=[1, 4096], data_type=FLOAT, name="s")
    if backward:
        dy = g.tensor(dim=dims, name="dy")
        mean, inv = (g.tensor(dim=[8192, 1], data_type=FLOAT, name=n) for n in ("m", "iv"))
        outputs(*g.layernorm_backward(dy, x, scale, mean, inv))
    else:
        bias = g.tensor(dim=[1, 4096], data_type=FLOAT, name="b")
        outputs(*g.layernorm(TRAIN, x, scale, bias, epsilon=1e-5))
    # dscale/dbias sum 8192 rows in fp32 in another order than the float64 reference: cancellation
    # makes elementwise relative error meaningless near 0, so allow an absolute 1e-4
    assert_engine_matches(g, rng, device="cuda", expect_steps=1, atol=1e-4)


@pytest.mark.gpu
@requires_cuda
def test_gpu_instancenorm_and_rmsnorm(rng):
    g = og.Graph("in", io_data_type=HALF)
    dims = [8, 64, 56, 56]
    x = g.tensor(dim=dims, stride=nhwc(dims), name="x")
    c = per_channel(dims)
    y, mean, inv = g.instancenorm(TRAIN, x, g.tensor(dim=c, data_type=FLOAT), g.tensor(dim=c, data_type=FLOAT), 1e-5)
    outputs(y, mean, inv)
    assert_engine_matches(g, rng, device="cuda", expect_steps=1)
    g = og.Graph("rms", io_data_type=BF16)
    x = g.tensor(dim=[4096, 8192], name="x")
    outputs(*g.rmsnorm(TRAIN, x, g.tensor(dim=[1, 8192], data_type=FLOAT), epsilon=1e-6))
    assert_engine_matches(g, rng, device="cuda", expect_steps=1)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("backward", [False, True])
def test_gpu_channels_last_layernorm_of_nchw(backward, rng):
    """ConvNeXt-T's first stage: layernorm over the 96 channels of an NCHW [32, 96, 56, 56] bf16 tensor,
    read through the permute to NHWC and (forward) written back through the inverse permute; the
    backward over the strided rows. Prints the kernel's time against PyTorch's permute + layer_norm."""
    dims = [32, 96, 56, 56]
    g = og.Graph("ln", io_data_type=BF16)
    x = g.tensor(dim=dims, name="x")
    s = g.tensor(dim=[1, 1, 1, 96], data_type=FLOAT, name="s")
    if backward:
        dy = g.tensor(dim=dims, name="dy")
        xt, dyt = g.transpose(x, [0, 2, 3, 1]), g.transpose(dy, [0, 2, 3, 1])
        mean, inv = (g.tensor(dim=[32, 56, 56, 1], data_type=FLOAT, name=n) for n in ("m", "iv"))
        outputs(*g.layernorm_backward(dyt, xt, s, mean, inv))
    else:
        b = g.tensor(dim=[1, 1, 1, 96], data_type=FLOAT, name="b")
        y, _, _ = g.layernorm(INFER, g.transpose(x, [0, 2, 3, 1]), s, b, epsilon=1e-6)
        g.transpose(y, [0, 3, 1, 2]).set_output(True)
    plan = assert_engine_matches(g, rng, device="cuda", expect_steps=1, atol=1e-4)
    assert template_of(plan) == "rownorm"
    import torch

    pack = {
        u: torch.empty_strided(t.dim, t.stride, device="cuda")
        .normal_()
        .to(torch.bfloat16 if t.data_type is BF16 else torch.float32)
        for u, t in plan.graph.tensors.items()
        if not t.is_virtual
    }
    for _ in range(3):
        plan.execute(pack)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        plan.execute(pack)
    end.record()
    torch.cuda.synchronize()
    xs = torch.randn(dims, device="cuda", dtype=torch.bfloat16)
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0.record()
    for _ in range(20):
        torch.nn.functional.layer_norm(xs.permute(0, 2, 3, 1), [96]).permute(0, 3, 1, 2).contiguous()
    t1.record()
    torch.cuda.synchronize()
    print(f"opgraph {start.elapsed_time(end) / 20 * 1e3:.0f} us, torch {t0.elapsed_time(t1) / 20 * 1e3:.0f} us")


# -- compiled for Hopper (no GPU needed): the benchmark shapes' kernels compile for sm_90 without
# spilling, and the loops the knobs pipeline (ST > 1) are pipelined (cp.async) --------------------------


def _with(**want):
    """A HOPPER_CASES selector: the heuristic's choice and the first other candidate with `want`."""

    def pick(cands):
        return [cands[0], next(c for c in cands[1:] if all(c.get(k) == v for k, v in want.items()))]

    return pick


def _bn(layout="nhwc"):
    return lambda: bn_graph([32, 256, 56, 56], layout, HALF, relu=True)[0]


def _bn_bwd(saved=True):
    return lambda: bn_bwd_graph([32, 256, 56, 56], "nhwc", HALF, saved=saved, drelu=False)[0]


def _instancenorm(backward=False):
    def build():
        dims = [8, 64, 56, 56]
        if backward:
            return bn_bwd_graph(dims, "nhwc", HALF, kind="instancenorm", drelu=False)[0]
        g = og.Graph("in", io_data_type=HALF)
        x = g.tensor(dim=dims, stride=nhwc(dims), name="x")
        c = per_channel(dims)
        outputs(*g.instancenorm(TRAIN, x, g.tensor(dim=c, data_type=FLOAT), g.tensor(dim=c, data_type=FLOAT), 1e-5))
        return g

    return build


def _rownorm(backward=False, rms=False, dims=(8192, 4096)):
    def build():
        r, h = dims
        g = og.Graph("ln", io_data_type=BF16)
        x = g.tensor(dim=[r, h], name="x")
        scale = g.tensor(dim=[1, h], data_type=BF16, name="s")
        if backward:
            dy = g.tensor(dim=[r, h], name="dy")
            inv = g.tensor(dim=[r, 1], data_type=FLOAT, name="iv")
            if rms:
                outputs(*g.rmsnorm_backward(dy, x, scale, inv, has_dbias=False))
            else:
                outputs(*g.layernorm_backward(dy, x, scale, g.tensor(dim=[r, 1], data_type=FLOAT, name="m"), inv))
        elif rms:
            outputs(*g.rmsnorm(TRAIN, x, scale, epsilon=1e-6))
        else:
            outputs(*g.layernorm(TRAIN, x, scale, g.tensor(dim=[1, h], data_type=BF16, name="b"), epsilon=1e-5))
        return g

    return build


def _channels_last_layernorm(backward=False):
    """ConvNeXt-T's: layernorm over the 96 channels of NCHW [32, 96, 56, 56] through permutes (strided rows)."""

    def build():
        dims = [32, 96, 56, 56]
        g = og.Graph("ln", io_data_type=BF16)
        x = g.transpose(g.tensor(dim=dims, name="x"), [0, 2, 3, 1])
        s = g.tensor(dim=[1, 1, 1, 96], data_type=FLOAT, name="s")
        if backward:
            dy = g.transpose(g.tensor(dim=dims, name="dy"), [0, 2, 3, 1])
            mean, inv = (g.tensor(dim=[32, 56, 56, 1], data_type=FLOAT, name=n) for n in ("m", "iv"))
            outputs(*g.layernorm_backward(dy, x, s, mean, inv))
        else:
            y, _, _ = g.layernorm(INFER, x, s, g.tensor(dim=[1, 1, 1, 96], data_type=FLOAT), epsilon=1e-6)
            g.transpose(y, [0, 3, 1, 2]).set_output(True)
        return g

    return build


HOPPER_CASES = {  # name: (graph, template, knobs: see hopper_compile.compile_cases)
    "bn_nhwc": (_bn(), "norm_stats", _with(PF=1)),
    "bn_nchw": (_bn("nchw"), "norm_stats", _with(PF=1)),
    "bn_bwd_saved": (_bn_bwd(), "norm_stats", _with(PF=1)),
    "bn_bwd_recompute": (_bn_bwd(False), "norm_stats", None),
    "instancenorm": (_instancenorm(), "norm_stats", None),
    "instancenorm_bwd": (_instancenorm(True), "norm_stats", None),
    # the heuristic's one-tile forward and the first persistent one (FP > 0: its ST loop must pipeline)
    "layernorm": (_rownorm(), "rownorm", lambda cands: [cands[0], next(c for c in cands[1:] if c["FP"])]),
    "layernorm_bwd": (_rownorm(True), "rownorm", _with(PF=1)),
    "rmsnorm": (_rownorm(rms=True, dims=(4096, 8192)), "rownorm", None),
    "rmsnorm_bwd": (_rownorm(True, rms=True, dims=(4096, 8192)), "rownorm", None),
    "layernorm_nchw_channels": (_channels_last_layernorm(), "rownorm", 2),
    "layernorm_bwd_nchw_channels": (_channels_last_layernorm(True), "rownorm", None),
}
LOOPS = {"kernel_stats", "kernel_rownorm_bwd", "kernel_rownorm"}  # the kernels whose loop ST pipelines
FORWARD_STATS = {"bn_nhwc", "bn_nchw", "instancenorm"}


def test_kernels_compile_for_hopper():
    lines = [line for line in compile_for_hopper(__name__).splitlines() if line.startswith("compiled")]
    assert {line.split()[1] for line in lines} == set(HOPPER_CASES)
    seen: set[str] = set()
    for line in lines:
        words = line.split()
        kernel, spills, cp_async = words[2], int(words[6]), int(words[10])
        knobs = ast.literal_eval(line[line.index("{") :])
        assert spills == 0, line
        if kernel == "kernel_stats" and words[1] in FORWARD_STATS and words[1] not in seen:
            # the heuristic's forward stats programs (3 tile accumulators since the mean keeps its own
            # unshifted sum) are planned 3 to an SM, all in one wave: their registers must allow it
            assert int(words[4]) * 32 * int(knobs["W"]) * 3 <= 65536, line
        seen.add(words[1])
        if kernel in LOOPS and int(knobs.get("ST", 0)) > 1 and (kernel != "kernel_rownorm" or knobs.get("FP")):
            assert cp_async > 0, f"the loop was not pipelined: {line}"


@requires_interpreter
def test_layernorm_epilogue_with_integer_tensors(rng):
    """An fp64 piece (INT32 tensors in the epilogue): the epilogue's integer compares in int64, the
    INT32 output through fp64, the float math beside them."""
    g = og.Graph("ln", io_data_type=FLOAT)
    x, kk = g.tensor(dim=[5, 24], name="x"), g.tensor(dim=[5, 24], name="kk", data_type=og.DataType.INT32)
    scale, bias = g.tensor(dim=[1, 24], data_type=FLOAT, name="s"), g.tensor(dim=[1, 24], data_type=FLOAT, name="b")
    y, mean, inv = g.layernorm(TRAIN, x, scale, bias, epsilon=EPS)
    outputs(mean, inv)
    g.mul(y, g.cmp_ge(kk, 1.0).set_data_type(FLOAT)).set_output(True)
    g.add(y, g.gen_index(y, axis=1).set_data_type(og.DataType.INT32)).set_data_type(og.DataType.INT32).set_output(True)

    def ints(pack):
        for v in pack.values():
            if isinstance(v, np.ndarray) and v.dtype.kind == "i":
                v[...] = np.arange(v.size).reshape(v.shape) * 7 % 11 - 3

    plan = assert_engine_matches(g, rng, expect_steps=1, prepare=ints)
    assert template_of(plan) == "rownorm"
