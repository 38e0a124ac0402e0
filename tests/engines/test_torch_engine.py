"""The torch engine (every op, one by one, through PyTorch) against the reference engine: every op
family on the CPU (device="cpu", engines=["torch"]) over NCHW/NHWC, FLOAT/HALF/BFLOAT16 and scalars
given three ways; multi-op and mixed-engine plans; the host fallback; configs and notes. GPU
versions at realistic sizes are marked gpu."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

import opgraph as og
from opgraph import BehaviorNote, ConvolutionMode, NormForwardPhase, NumericalNote, ReductionMode, ResampleMode
from opgraph.ops.pointwise import PointwiseMode
from opgraph.core.piece import make_piece
from opgraph.build.planner import engine_configs
from opgraph.tools.samples import nhwc

from ..helpers import (
    assert_engine_matches,
    layout_stride,
    outputs,
    per_channel,
    pointwise_graph,
    requires_cuda,
    requires_interpreter,
)

torch = pytest.importorskip("torch")

DT = og.DataType
M = PointwiseMode
FLOAT, HALF, BF16, DOUBLE = DT.FLOAT, DT.HALF, DT.BFLOAT16, DT.DOUBLE
DTYPES = [FLOAT, HALF, BF16]
TRAIN, INFER = NormForwardPhase.TRAINING, NormForwardPhase.INFERENCE
CROSS, CONV = ConvolutionMode.CROSS_CORRELATION, ConvolutionMode.CONVOLUTION
EPS = 2.0**-10  # exact in every float type, so the three kinds of scalar hold the same value
SCALAR_KINDS = ["number", "by_value", "tensor"]


def check(g: og.Graph, rng, **kw):
    return assert_engine_matches(g, rng, engines=("torch",), **kw)


def graph(io=FLOAT, name="g", compute=FLOAT) -> og.Graph:
    return og.Graph(name, io_data_type=io, intermediate_data_type=FLOAT, compute_data_type=compute)


def scalar(g: og.Graph, kind: str, value: float, name: str):
    """A scalar operand as a Python number, a pass-by-value tensor or a 1-element device tensor."""
    if kind == "number":
        return value
    return g.tensor(dim=[1], data_type=FLOAT, is_pass_by_value=kind == "by_value", name=name)


def setter(**values):
    """A `prepare` for check_plan: give the named scalar tensors their values (whatever kind)."""

    def prepare(pack):
        for t, value in values.values():
            if not isinstance(t, og.Tensor):
                continue
            if isinstance(pack[t.uid], np.ndarray):
                pack[t.uid][...] = value
            else:
                pack[t.uid] = float(value)

    return prepare


# -- pointwise ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [m for m in PointwiseMode if m is not M.GEN_INDEX], ids=lambda m: m.name)
def test_pointwise_every_mode(mode, rng):
    check(pointwise_graph(mode, FLOAT, "nhwc"), rng, expect_steps=1)


@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("mode", [M.ADD, M.GELU_FWD, M.SWISH_BWD, M.CMP_GE, M.DIV, M.TANH_FWD])
def test_pointwise_dtypes_and_layouts(mode, dt, layout, rng):
    check(pointwise_graph(mode, dt, layout), rng)


@pytest.mark.parametrize("kind", SCALAR_KINDS)
def test_relu_clips_slope_and_backward_boundaries(kind, rng):
    """Clipped leaky relu and its backward with the clips given three ways; integer inputs hit the
    clips exactly (the RELU_BWD boundaries); slope 0 is the plain clip."""
    g = graph(FLOAT, "relu")
    x = g.tensor(dim=[3, 4, 5], name="x")
    dy = g.tensor(dim=[3, 4, 5], name="dy")
    lo, hi, k = scalar(g, kind, -1.0, "lo"), scalar(g, kind, 2.0, "hi"), scalar(g, kind, 0.25, "k")
    zero = scalar(g, kind, 0.0, "zero")
    g.relu(x, negative_slope=k, lower_clip=lo, upper_clip=hi).set_output(True)
    g.relu(x, negative_slope=zero, lower_clip=lo).set_output(True)
    g.relu_backward(dy, x, negative_slope=k, lower_clip=lo, upper_clip=hi).set_output(True)
    g.leaky_relu_backward(dy, x, negative_slope=k).set_output(True)
    prep = setter(lo=(lo, -1.0), hi=(hi, 2.0), k=(k, 0.25), zero=(zero, 0.0))
    check(g, rng, prepare=prep, integers=True, low=-3, high=3)


@pytest.mark.parametrize("kind", SCALAR_KINDS)
def test_parametrised_activations(kind, rng):
    g = graph(FLOAT, "act")
    x = g.tensor(dim=[4, 6], name="x")
    dy = g.tensor(dim=[4, 6], name="dy")
    a, b, s = scalar(g, kind, 0.5, "a"), scalar(g, kind, 1.5, "b"), scalar(g, kind, 0.75, "s")
    outputs(
        g.elu(x, alpha=a),
        g.softplus(x, beta=b),
        g.swish(x, swish_beta=s),
        g.pointwise(dy, x, mode=M.ELU_BWD, alpha=a),
        g.pointwise(dy, x, mode=M.SOFTPLUS_BWD, beta=b),
        g.pointwise(dy, x, mode=M.SWISH_BWD, swish_beta=s),
    )
    check(g, rng, prepare=setter(a=(a, 0.5), b=(b, 1.5), s=(s, 0.75)))


def test_a_literal_beyond_the_compute_type_is_its_infinity(rng):
    """1e308 in an fp32 op is +inf in its compute type (torch refuses such a Python scalar for a
    float32 tensor: fuzz seed 20261127008254, a damaged plan's softplus beta)."""
    g = graph(FLOAT, "big")
    x = g.tensor(dim=[4, 6], name="x")
    dy = g.tensor(dim=[4, 6], name="dy")
    outputs(g.mul(x, 1e308), g.pointwise(dy, x, mode=M.SOFTPLUS_BWD, beta=1e308))
    check(g, rng)


def test_gen_index_comparisons_and_integer_casts(rng):
    g = graph(FLOAT, "gi")
    x = g.tensor(dim=[2, 3, 4], name="x")
    g.gen_index(x, axis=1).set_output(True).set_data_type(DT.INT32)
    g.add(g.gen_index(x, axis=2), x).set_output(True)
    g.cmp_lt(x, 0.5).set_output(True)  # BOOLEAN
    g.cmp_ge(x, 0.0).set_output(True).set_data_type(FLOAT)
    g.mul(x, 0.5).set_output(True).set_data_type(DT.BOOLEAN)  # nonzero, negatives included
    g.identity(g.mul(x, 100.0)).set_output(True).set_data_type(DT.INT8)  # saturates
    g.identity(g.mul(x, 2.5)).set_output(True).set_data_type(DT.INT32)  # truncates toward zero
    g.identity(g.mul(x, 1000.0)).set_output(True).set_data_type(DT.FP8_E4M3)  # saturates to +-448
    g.identity(g.mul(x, 1e19)).set_output(True).set_data_type(DT.INT64)  # saturates, 2**63 included
    check(g, rng, expect_steps=1)


def test_broadcast_per_channel_rows_and_scalars(rng):
    dims = [2, 8, 3, 4]
    g = graph(HALF, "bcast")
    x = g.tensor(dim=dims, stride=nhwc(dims), name="x")
    b = g.tensor(dim=[1, 8, 1, 1], name="b")
    row = g.tensor(dim=[1, 1, 1, 4], name="row")
    s = g.tensor(dim=[1], data_type=FLOAT, is_pass_by_value=True, name="s")
    one = g.tensor(dim=[1, 1, 1, 1], data_type=FLOAT, name="one")
    g.add(g.mul(g.bias(g.mul(x, s), b), row), one).set_output(True)
    check(g, rng)


def test_half_intermediate_is_rounded_like_the_reference(rng):
    g = graph(FLOAT, "round")
    x = g.tensor(dim=[64], name="x")
    h = g.mul(x, 1.0 / 3.0).set_data_type(HALF)  # a virtual fp16 intermediate
    g.sub(g.mul(h, 3.0), x).set_output(True)
    check(g, rng, rtol=0, atol=1e-7)


def test_double_graph_computes_in_float64(rng):
    g = graph(DOUBLE, "f64", compute=DOUBLE)
    x = g.tensor(dim=[5, 7], name="x")
    g.gelu(g.mul(g.exp(x), 1.0 / 3.0)).set_output(True)
    plan = check(g, rng)
    assert NumericalNote.FP64_ACCUMULATION in plan.steps[0].config.numerical_notes


# -- convolutions ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Conv:
    id: str
    n: int
    c: int
    k: int
    x: tuple[int, ...]
    r: tuple[int, ...]
    pre: tuple[int, ...]
    post: tuple[int, ...]
    stride: tuple[int, ...] | None = None
    dilation: tuple[int, ...] | None = None
    groups: int = 1
    mode: ConvolutionMode = CROSS

    def dims(self):
        ones = (1,) * len(self.x)
        s, d = self.stride or ones, self.dilation or ones
        y = tuple(
            (x + p0 + p1 - ((r - 1) * dd + 1)) // ss + 1
            for x, r, p0, p1, ss, dd in zip(self.x, self.r, self.pre, self.post, s, d)
        )
        return {
            "X": [self.n, self.c, *self.x],
            "W": [self.k, self.c // self.groups, *self.r],
            "DY": [self.n, self.k, *y],
        }

    def kwargs(self):
        pad = (
            {"padding": list(self.pre)}
            if self.pre == self.post
            else {"pre_padding": list(self.pre), "post_padding": list(self.post)}
        )
        return {
            **pad,
            "stride": list(self.stride or ()) or None,
            "dilation": list(self.dilation or ()) or None,
            "convolution_mode": self.mode,
        }


CONVS = [
    Conv("1d", 2, 4, 6, (11,), (3,), (1,), (1,)),
    Conv("1d_s3_d2_g3_asym_conv", 2, 6, 9, (17,), (3,), (2,), (0,), (3,), (2,), groups=3, mode=CONV),
    Conv("2d", 2, 4, 8, (9, 10), (3, 3), (1, 1), (1, 1)),
    Conv("2d_stride_dilation", 2, 4, 4, (13, 12), (3, 3), (0, 1), (0, 1), (2, 3), (2, 1)),
    Conv("2d_depthwise", 2, 4, 8, (8, 8), (3, 3), (1, 1), (1, 1), groups=4),
    Conv("2d_asym_pad_convolution", 2, 3, 5, (8, 9), (3, 2), (0, 2), (1, 0), mode=CONV),
    Conv("3d", 1, 2, 3, (5, 6, 4), (3, 2, 2), (1, 0, 1), (1, 1, 0), (1, 2, 1), (1, 1, 2)),
    Conv("3d_groups_conv", 2, 4, 4, (4, 5, 5), (2, 3, 3), (0, 1, 1), (0, 1, 1), (2, 1, 1), groups=2, mode=CONV),
]
CONV_IO = {"conv_fprop": ("X", "W", "DY"), "conv_dgrad": ("DY", "W", "X"), "conv_wgrad": ("X", "DY", "W")}


def conv_graph(op, case: Conv, layout="nchw", io=FLOAT, out_type=None, compute=FLOAT):
    g = graph(io, op, compute)
    dims = case.dims()
    first, second, result = CONV_IO[op]
    a, b = (g.tensor(dim=dims[n], stride=layout_stride(dims[n], layout), name=n) for n in (first, second))
    out = getattr(g, op)(a, b, **case.kwargs(), name="conv").set_output(True).set_dim(dims[result])
    if out_type is not None:
        out.set_data_type(out_type)
    return g


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("case", CONVS, ids=lambda c: c.id)
@pytest.mark.parametrize("op", list(CONV_IO))
def test_conv_geometries(op, case, layout, rng):
    check(conv_graph(op, case, layout), rng, expect_steps=1)


@pytest.mark.parametrize(
    ("io", "out_type"),
    [
        (HALF, None),
        (BF16, None),
        (HALF, FLOAT),
        (DT.FP8_E4M3, FLOAT),
        (DT.INT8, DT.INT32),
        (DT.UINT8, DT.INT32),
    ],
    ids=["f16", "bf16", "f16_to_f32", "fp8_to_f32", "i8_to_i32", "u8_to_i32"],
)
@pytest.mark.parametrize("op", list(CONV_IO))
def test_conv_dtypes(op, io, out_type, rng):
    compute = DT.INT32 if io.is_integer else FLOAT
    check(conv_graph(op, CONVS[3], "nhwc", io, out_type, compute), rng)


# -- matmul --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: d.name)
def test_matmul_broadcast_batch_and_transposed_operands(dt, rng):
    g = graph(dt, "mm")
    a = g.tensor(dim=[2, 1, 5, 7], name="A")
    b = g.tensor(dim=[1, 3, 7, 4], stride=[84, 28, 1, 7], name="B")  # column-major K x N
    g.matmul(a, b).set_output(True)
    check(g, rng)


def test_matmul_gapped_rows_and_int8_exact(rng):
    g = og.Graph("mm8", io_data_type=DT.INT8, intermediate_data_type=DT.INT32, compute_data_type=DT.INT32)
    a = g.tensor(dim=[3, 6, 40], stride=[600, 100, 1], name="A")  # gapped rows
    b = g.tensor(dim=[3, 40, 5], name="B")
    g.matmul(a, b).set_output(True).set_data_type(DT.INT32)
    g.matmul(a, b).set_output(True).set_data_type(DT.INT8)  # saturates
    check(g, rng)


def test_int32_data_stays_exact_beyond_float32(rng):
    """INT32 data computes in float64 (matmul in int64 on the CPU): values and sums above 2**24 stay
    exact."""
    g = og.Graph("i32", io_data_type=DT.INT32, intermediate_data_type=DT.INT32, compute_data_type=DT.INT32)
    a = g.tensor(dim=[4, 40], name="A")
    b = g.tensor(dim=[40, 3], name="B")
    big = g.tensor(dim=[4, 40], name="big")
    g.matmul(a, b).set_output(True)
    g.add(big, 1).set_output(True)

    def prepare(pack):
        sign = rng.choice([-1, 1], size=(4, 40))
        pack[a.uid][...] = rng.integers(2**20, 2**21, size=(4, 40)) * sign
        pack[big.uid][...] = rng.integers(2**28, 2**30, size=(4, 40)) * sign

    check(g, rng, prepare=prepare)


# -- reductions ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", list(ReductionMode), ids=lambda m: m.name)
@pytest.mark.parametrize(
    "out_dim", [[1, 3, 1, 1], [2, 1, 1, 5], [1, 1, 1, 1], [2, 3, 4, 5]], ids=["per_channel", "middle", "full", "none"]
)
def test_reduction_modes_and_axes(mode, out_dim, rng):
    dims = [2, 3, 4, 5]
    g = graph(HALF, "red")
    x = g.tensor(dim=dims, stride=nhwc(dims), name="x")
    g.reduction(x, mode).set_output(True).set_dim(out_dim)

    def prepare(pack):  # signs and zeros (AMAX, NORM1, MUL_NO_ZEROS); products of 120 values stay finite
        v = pack[x.uid]
        v[...] = (np.abs(v.astype(np.float64)) * 0.5 + 0.5) * rng.choice([-1, 1], size=dims)
        v[rng.random(dims) < 0.2] = 0

    check(g, rng, prepare=prepare)


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_genstats(layout, rng):
    dims = [3, 4, 5, 6]
    g = graph(BF16, "gs")
    x = g.tensor(dim=dims, stride=layout_stride(dims, layout), name="x")
    outputs(*g.genstats(x))
    check(g, rng)


# -- normalizations ------------------------------------------------------------------------------------


def positive(*tensors, value=EPS):
    """prepare: positive values for scalars/variances given as tensors."""

    def prepare(pack):
        for t in tensors:
            if isinstance(t, og.Tensor):
                if isinstance(pack[t.uid], np.ndarray):
                    pack[t.uid][...] = np.abs(pack[t.uid].astype(np.float64)) + value
                else:
                    pack[t.uid] = value

    return prepare


@pytest.mark.parametrize("kind", SCALAR_KINDS)
@pytest.mark.parametrize("dt,layout", [(FLOAT, "nchw"), (HALF, "nhwc"), (BF16, "nhwc")])
def test_batchnorm_training_with_running_stats(dt, layout, kind, rng):
    dims = [3, 4, 5, 6]
    g = graph(dt, "bn")
    x = g.tensor(dim=dims, stride=layout_stride(dims, layout), name="x")
    c = per_channel(dims)
    scale, bias, rm, rv = (g.tensor(dim=c, data_type=FLOAT, name=n) for n in ("s", "b", "rm", "rv"))
    eps, mom = scalar(g, kind, EPS, "eps"), scalar(g, kind, 0.125, "mom")
    outputs(*g.batchnorm(x, scale, bias, rm, rv, epsilon=eps, momentum=mom))
    check(g, rng, prepare=setter(eps=(eps, EPS), mom=(mom, 0.125)))


def test_batchnorm_in_place_running_stats(rng):
    g = graph(FLOAT, "bn_inplace")
    dim, c = [4, 3, 2, 2], [1, 3, 1, 1]
    x = g.tensor(dim=dim, name="x")
    scale, bias = g.tensor(dim=c, name="s"), g.tensor(dim=c, name="b")
    rm, rv = g.tensor(dim=c, name="rm", uid=100), g.tensor(dim=c, name="rv", uid=101)
    y, mean, inv, next_rm, next_rv = g.batchnorm(x, scale, bias, rm, rv, epsilon=EPS, momentum=0.25)
    outputs(y, mean, inv, next_rm, next_rv)
    next_rm.set_uid(100)
    next_rv.set_uid(101)
    check(g, rng)


@pytest.mark.parametrize("dt,layout", [(FLOAT, "nchw"), (HALF, "nhwc"), (BF16, "nchw")])
def test_batchnorm_inference(dt, layout, rng):
    dims = [2, 3, 4, 5]
    g = graph(dt, "bni")
    x = g.tensor(dim=dims, stride=layout_stride(dims, layout), name="x")
    c = per_channel(dims)
    mean, inv, s, b = (g.tensor(dim=c, data_type=FLOAT, name=n) for n in ("m", "iv", "s", "b"))
    g.batchnorm_inference(x, mean, inv, s, b).set_output(True)
    check(g, rng)


@pytest.mark.parametrize("stats", ["saved", "recomputed"])
@pytest.mark.parametrize("dt,layout", [(FLOAT, "nhwc"), (HALF, "nchw"), (BF16, "nhwc")])
def test_batchnorm_backward(dt, layout, stats, rng):
    dims = [3, 4, 3, 5]
    g = graph(dt, "bnb")
    x = g.tensor(dim=dims, stride=layout_stride(dims, layout), name="x")
    dy = g.tensor(dim=dims, stride=layout_stride(dims, layout), name="dy")
    c = per_channel(dims)
    s = g.tensor(dim=c, data_type=FLOAT, name="s")
    if stats == "saved":
        mean, inv = (g.tensor(dim=c, data_type=FLOAT, name=n) for n in ("m", "iv"))
        outs = g.batchnorm_backward(dy, x, s, mean=mean, inv_variance=inv)
    else:
        eps = g.tensor(dim=[1], data_type=FLOAT, name="eps")
        outs = g.batchnorm_backward(dy, x, s, epsilon=eps)
    outputs(*outs)
    check(g, rng, prepare=None if stats == "saved" else positive(eps))


LN = [([6, 16], [1, 16], "nchw"), ([2, 3, 8], [1, 1, 8], "nchw"), ([2, 3, 4, 5], [1, 3, 4, 5], "nhwc")]


@pytest.mark.parametrize("kind", SCALAR_KINDS)
@pytest.mark.parametrize("dim,sdim,layout", LN)
def test_layernorm_and_rmsnorm_forward(dim, sdim, layout, kind, rng):
    g = graph(HALF, "ln")
    x = g.tensor(dim=dim, stride=layout_stride(dim, layout), name="x")
    s, b = (g.tensor(dim=sdim, data_type=FLOAT, name=n) for n in ("s", "b"))
    eps = scalar(g, kind, EPS, "eps")
    outputs(*g.layernorm(TRAIN, x, s, b, epsilon=eps))
    outputs(*g.rmsnorm(TRAIN, x, s, b, epsilon=eps))
    outputs(*g.layernorm(INFER, x, None, None, epsilon=eps))
    outputs(*g.rmsnorm(INFER, x, s, epsilon=eps))
    check(g, rng, prepare=setter(eps=(eps, EPS)))


@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("dim,sdim,layout", LN)
def test_layernorm_and_rmsnorm_backward(dim, sdim, layout, dt, rng):
    stats = [1 if s == d else d for s, d in zip(sdim, dim)]
    g = graph(dt, "lnb")
    x = g.tensor(dim=dim, stride=layout_stride(dim, layout), name="x")
    dy = g.tensor(dim=dim, stride=layout_stride(dim, layout), name="dy")
    s = g.tensor(dim=sdim, data_type=FLOAT, name="s")
    mean, inv = (g.tensor(dim=stats, data_type=FLOAT, name=n) for n in ("m", "iv"))
    outputs(*g.layernorm_backward(dy, x, s, mean, inv))
    outputs(*g.rmsnorm_backward(dy, x, s, inv, has_dbias=True))
    outputs(*g.rmsnorm_backward(dy, x, s, inv, has_dbias=False))
    check(g, rng)


@pytest.mark.parametrize("dt,layout", [(FLOAT, "nhwc"), (HALF, "nchw"), (BF16, "nhwc")])
def test_instancenorm_forward_and_backward(dt, layout, rng):
    dims = [2, 3, 4, 5]
    c, stats = per_channel(dims), [2, 3, 1, 1]
    g = graph(dt, "in")
    x = g.tensor(dim=dims, stride=layout_stride(dims, layout), name="x")
    dy = g.tensor(dim=dims, stride=layout_stride(dims, layout), name="dy")
    s, b = (g.tensor(dim=c, data_type=FLOAT, name=n) for n in ("s", "b"))
    mean, inv = (g.tensor(dim=stats, data_type=FLOAT, name=n) for n in ("m", "iv"))
    eps = g.tensor(dim=[1], data_type=FLOAT, is_pass_by_value=True, name="eps")
    outputs(*g.instancenorm(TRAIN, x, s, b, epsilon=eps))
    outputs(*g.instancenorm(INFER, x, s, b, epsilon=EPS))
    outputs(*g.instancenorm_backward(dy, x, s, mean, inv))
    outputs(*g.instancenorm_backward(dy, x, s, epsilon=eps))
    check(g, rng, prepare=positive(eps))


# -- pooling -------------------------------------------------------------------------------------------

POOLS = [
    ("1d", [2, 3, 11], [3], [2], [1], [0]),
    ("2d", [2, 3, 7, 8], [3, 2], [2, 2], [1, 0], [2, 1]),
    ("2d_overlap", [1, 4, 6, 6], [3, 3], [1, 1], [2, 1], [1, 2]),
    ("3d", [1, 2, 5, 4, 6], [2, 2, 3], [1, 2, 2], [1, 0, 2], [0, 1, 1]),
]


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize(
    "mode", [ResampleMode.MAX, ResampleMode.AVG_INCLUDE_PADDING, ResampleMode.AVG_EXCLUDE_PADDING], ids=lambda m: m.name
)
@pytest.mark.parametrize("case", POOLS, ids=lambda c: c[0])
def test_resample(case, mode, layout, rng):
    _, dims, window, stride, pre, post = case
    g = graph(HALF, "pool")
    x = g.tensor(dim=dims, stride=layout_stride(dims, layout), name="x")
    index = mode is ResampleMode.MAX
    y, idx = g.resample(
        x, mode=mode, window=window, stride=stride, pre_padding=pre, post_padding=post, generate_index=index
    )
    outputs(y, idx)
    if idx is not None:
        idx.set_data_type(DT.INT32)
    check(g, rng, expect_steps=1)


def test_max_pool_index_ties_pick_the_first(rng):
    g = graph(FLOAT, "ties")
    x = g.tensor(dim=[1, 2, 6, 6], name="x")
    outputs(*g.resample(x, mode="max", window=[3, 3], stride=[2, 2], padding=[1, 1], generate_index=True))
    check(g, rng, integers=True, low=-1, high=1)  # many equal maxima per window


# -- layout ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dt", [FLOAT, BF16, DT.INT32], ids=lambda d: d.name)
def test_layout_ops(dt, rng):
    dims = [2, 3, 4, 5]
    g = graph(dt, "layout")
    x = g.tensor(dim=dims, stride=nhwc(dims), name="x")
    z = g.tensor(dim=[2, 2, 4, 5], name="z")
    g.reshape(x, [6, -1]).set_output(True)
    g.transpose(x, [0, 2, 3, 1]).set_output(True)
    g.slice(x, [slice(None), slice(1, None), slice(0, 4, 2), slice(-3, None)]).set_output(True)
    g.concatenate([x, z], axis=1).set_output(True)
    g.transpose(g.reshape(x, [6, 20]), [1, 0]).set_output(True).set_stride([1, 20])
    check(g, rng, expect_steps=1)


def test_in_place_transpose_reads_its_input_before_writing(rng):
    """A single-op in-place update whose result is a view of the buffer it overwrites."""
    g = graph(FLOAT, "inplace_t")
    x = g.tensor(dim=[4, 4], name="x", uid=7)
    g.transpose(x, [1, 0]).set_output(True).set_uid(7).set_stride([4, 1])
    check(g, rng)


# -- graphs of several ops, several engines ------------------------------------------------------------


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_conv_bias_relu_batchnorm_reduction(layout, rng):
    dims, wdims = [2, 4, 6, 6], [8, 4, 3, 3]
    g = og.Graph("multi", io_data_type=HALF, intermediate_data_type=FLOAT, compute_data_type=FLOAT)
    x = g.tensor(dim=dims, stride=layout_stride(dims, layout), name="x")
    w = g.tensor(dim=wdims, stride=layout_stride(wdims, layout), name="w")
    c = [1, 8, 1, 1]
    b, s, sb = (g.tensor(dim=c, data_type=FLOAT, name=n) for n in ("b", "s", "sb"))
    rm, rv = (g.tensor(dim=c, data_type=FLOAT, name=n) for n in ("rm", "rv"))
    mom = g.tensor(dim=[1], data_type=FLOAT, is_pass_by_value=True, name="mom")
    h = g.relu(g.bias(g.conv_fprop(x, w, padding=1), b))
    y, mean, inv, nrm, nrv = g.batchnorm(h, s, sb, rm, rv, epsilon=EPS, momentum=mom)
    outputs(y, mean, inv, nrm, nrv)
    g.reduction(y, ReductionMode.AVG).set_output(True).set_dim([2, 1, 1, 1])
    plan = check(g, rng, expect_steps=1)
    assert [n.kind for n in plan.steps[0].piece.nodes] == [
        "conv_fprop",
        "pointwise",
        "pointwise",
        "batchnorm",
        "reduction",
    ]


@requires_interpreter
@pytest.mark.parametrize("templates", ["pointwise_only", "all"])
def test_mixed_engines_triton_first_torch_for_the_rest(templates, monkeypatch, rng):
    """engines=["triton", "torch"]: Triton takes what its templates run, torch the rest. With only the
    pointwise template, the pointwise prologue is a Triton piece, the conv a torch piece, the relu after
    it a Triton piece again (a torch piece never absorbs an op the preferred engine runs) and the
    reduction torch; with every template the plan still matches the reference."""
    import opgraph.engines.triton as triton_engine

    if templates == "pointwise_only":
        monkeypatch.setattr(triton_engine, "TEMPLATES", [t for t in triton_engine.TEMPLATES if t.name == "pointwise"])
    dims, wdims = [2, 4, 5, 5], [6, 4, 3, 3]
    g = graph(FLOAT, "mixed")
    x = g.tensor(dim=dims, stride=nhwc(dims), name="x")
    w = g.tensor(dim=wdims, name="w")
    s = g.tensor(dim=[1, 4, 1, 1], name="s")
    y = g.conv_fprop(g.relu(g.mul(x, s)), w, padding=1)
    g.relu(y).set_output(True)
    g.reduction(y, ReductionMode.MAX).set_output(True).set_dim([1, 6, 1, 1])
    plan = assert_engine_matches(g, rng, engines=("triton", "torch"))
    engines = [st.config.engine for st in plan.steps]
    assert set(engines) <= {"triton", "torch"} and engines[0] == "triton", plan.describe()
    if templates == "pointwise_only":
        assert engines == ["triton", "torch", "triton", "torch"], plan.describe()
        assert set(plan.steps[0].piece.kinds) == {"pointwise"} and plan.workspace_size > 0


def test_strict_build_is_one_torch_kernel(rng):
    g = graph(FLOAT, "strict")
    x = g.tensor(dim=[2, 4, 3, 3], name="x")
    r = g.reduction(g.relu(x), ReductionMode.MAX).set_dim([1, 4, 1, 1])
    g.exp(r).set_output(True)
    plan = g.build(device="cpu", engines=["torch"], allow_partition=False)
    assert len(plan.steps) == 1 and plan.steps[0].config.engine == "torch"


def test_host_fallback_runs_unmapped_ops_on_the_reference(monkeypatch, rng):
    from opgraph.engines.torch_engine import IMPLS

    monkeypatch.delitem(IMPLS, "genstats")
    dims = [2, 3, 4, 4]
    g = graph(HALF, "fallback")
    x = g.tensor(dim=dims, stride=nhwc(dims), name="x")
    outputs(*g.genstats(g.relu(x)))
    plan = check(g, rng, expect_steps=1)
    config = plan.steps[0].config
    assert BehaviorNote.HOST_EXECUTION in config.behavior_notes
    assert BehaviorNote.DEVICE_SCALARS not in config.behavior_notes
    assert "genstats" in config.why and "host" in config.why


def test_a_failing_torch_call_is_a_typed_error(monkeypatch, rng):
    from opgraph.engines.torch_engine import IMPLS

    def broken(call):
        raise RuntimeError("no kernel for this dtype")

    monkeypatch.setitem(IMPLS, "reduction", broken)
    g = graph(FLOAT, "broken")
    x = g.tensor(dim=[2, 3], name="x")
    g.reduction(x, ReductionMode.ADD).set_output(True).set_dim([2, 1])
    plan = g.build(device="cpu", engines=["torch"])
    with pytest.raises(og.ExecutionError, match="no kernel for this dtype") as err:
        og.testing.check_plan(plan, rng)
    assert err.value.rule == "torch.op_failed" and "reduction" in err.value.op


def test_config_notes_on_the_cpu():
    g = graph(FLOAT, "notes")
    g.relu(g.tensor(dim=[4], name="x")).set_output(True)
    configs = engine_configs(g.final, device="cpu", engines=["torch"])
    (only,) = configs[0].configs
    assert only.engine == "torch" and only.knobs == ()
    assert only.behavior_notes == {BehaviorNote.HOST_EXECUTION, BehaviorNote.DEVICE_SCALARS}
    assert not only.numerical_notes


def test_variant_pack_of_cpu_torch_tensors(rng):
    g = graph(BF16, "tt")
    x = g.tensor(dim=[3, 8], name="x")
    w = g.tensor(dim=[8, 4], name="w")
    y = g.matmul(g.relu(x), w).set_output(True)
    plan = g.build(device="cpu", engines=["torch"])
    xs = torch.randn(3, 8).to(torch.bfloat16)
    ws = torch.randn(8, 4).to(torch.bfloat16)
    out = torch.full((3, 4), float("nan"), dtype=torch.bfloat16)
    plan.execute({x: xs, w: ws, y: out})
    want = (torch.relu(xs.float()) @ ws.float()).to(torch.bfloat16)
    torch.testing.assert_close(out, want, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("dt", [HALF, BF16], ids=lambda d: d.name)
def test_tensor_cores_gemms(dt, rng):
    """The CUDA paths of fp16/bf16 convs and matmuls (operands in their own type; fp32 for an fp32
    output), exercised on the CPU."""
    g = graph(dt, "native")
    x = g.tensor(dim=[2, 4, 6, 6], stride=nhwc([2, 4, 6, 6]), name="x")
    w = g.tensor(dim=[4, 4, 3, 3], stride=nhwc([4, 4, 3, 3]), name="w")
    conv = g.conv_fprop(x, w, padding=1).set_data_type(dt)
    g.relu(conv).set_output(True)
    g.conv_fprop(x, w, padding=1).set_output(True).set_data_type(FLOAT)  # the fp32-with-TF32 path on CUDA
    a = g.tensor(dim=[5, 16], name="a")
    b = g.tensor(dim=[16, 3], name="b")
    g.matmul(a, b).set_output(True)
    plan = g.build(device="cpu", engines=["torch"])
    for step in plan.steps:
        step.kernel.tensor_cores = True
    bad = og.testing.check_plan(plan, rng)
    assert not bad, "\n".join(map(str, bad))


def test_config_notes_on_cuda():
    """Notes as a CUDA device gets them (configs need no GPU to be made)."""
    from opgraph.engines.torch_engine import make_config

    cuda = og.Device("cuda", 0, "H100", (9, 0), 132)
    g = graph(HALF, "cuda_notes")
    x = g.tensor(dim=[2, 8, 4, 4], stride=nhwc([2, 8, 4, 4]), name="x")
    w = g.tensor(dim=[8, 8, 3, 3], stride=nhwc([8, 8, 3, 3]), name="w")
    g.relu(g.conv_fprop(x, w, padding=1)).set_output(True)  # the conv output is a FLOAT intermediate
    dy = g.tensor(dim=[2, 8, 4, 4], stride=nhwc([2, 8, 4, 4]), name="dy")
    g.conv_wgrad(x, dy, padding=1).set_output(True)
    pieces = [make_piece(g.final, 0, g.final.nodes)]
    config = make_config(pieces[0], cuda, og.HeurMode.A)
    assert config.behavior_notes == {BehaviorNote.DEVICE_SCALARS, BehaviorNote.CUDA_GRAPH_CAPTURABLE}
    assert config.numerical_notes == {
        NumericalNote.TENSOR_CORE,
        NumericalNote.NONDETERMINISTIC,
        NumericalNote.DOWN_CONVERT_INPUTS,
    }  # fp32 conv outputs: TF32-level
    assert config.estimate_us is not None and config.estimate_us > 3 * 3.0  # three ops' launches at least
    g32 = graph(FLOAT, "fp32")
    g32.matmul(g32.tensor(dim=[4, 4], name="a"), g32.tensor(dim=[4, 4], name="b")).set_output(True)
    notes = make_config(make_piece(g32.final, 0, g32.final.nodes), cuda, og.HeurMode.A).numerical_notes
    assert notes == {NumericalNote.DOWN_CONVERT_INPUTS}


def test_exact_math_pins_and_restores_torch_flags():
    from opgraph.engines.torch_engine.gemm import math_mode
    from opgraph.engines.torch_engine.precision import exact_gemm16, exact_math

    mm, conv = torch.backends.cuda.matmul, torch.backends.cudnn.conv

    def state():
        return (
            torch.get_float32_matmul_precision(),
            mm.fp32_precision,
            conv.fp32_precision,
            mm.allow_fp16_reduced_precision_reduction,
            mm.allow_fp16_reduced_precision_reduction_split_k,
            mm.allow_bf16_reduced_precision_reduction,
        )

    before = state()
    torch.set_float32_matmul_precision("high")  # a caller that allows TF32
    try:
        caller = state()
        with exact_math(True):
            assert state()[:3] == ("highest", "ieee", "none") and not mm.allow_tf32
            assert not mm.allow_fp16_reduced_precision_reduction and not mm.allow_bf16_reduced_precision_reduction
            call = type("C", (), {"device": torch.device("cuda")})()
            with math_mode(call, True):
                assert mm.allow_tf32 and conv.fp32_precision == "tf32"
            assert state()[:3] == ("highest", "ieee", "none") and not mm.allow_tf32
        assert state() == caller
        with exact_gemm16():  # the direct matmul's pin: the reductions alone, TF32 as the caller left it
            assert not mm.allow_fp16_reduced_precision_reduction and not mm.allow_bf16_reduced_precision_reduction
            assert state()[:3] == caller[:3]
        assert state() == caller
    finally:
        torch.set_float32_matmul_precision(before[0])
        mm.fp32_precision = before[1]
    assert state() == before


# -- GPU --------------------------------------------------------------------------------------------


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: d.name)
def test_gpu_conv_bias_relu_batchnorm_reduction(dt, rng):
    dims, wdims = [8, 64, 28, 28], [64, 64, 3, 3]
    g = og.Graph("multi", io_data_type=dt, intermediate_data_type=FLOAT, compute_data_type=FLOAT)
    x = g.tensor(dim=dims, stride=nhwc(dims), name="x")
    w = g.tensor(dim=wdims, stride=nhwc(wdims), name="w")
    c = [1, 64, 1, 1]
    b, s, sb, rm, rv = (g.tensor(dim=c, data_type=FLOAT, name=n) for n in ("b", "s", "sb", "rm", "rv"))
    mom = g.tensor(dim=[1], data_type=FLOAT, name="mom")  # read on the device
    h = g.relu(g.bias(g.conv_fprop(x, w, padding=1).set_data_type(dt), b))
    outputs(*g.batchnorm(h, s, sb, rm, rv, epsilon=1e-5, momentum=mom))
    g.reduction(h, ReductionMode.ADD).set_output(True).set_dim([1, 64, 1, 1])
    plan = assert_engine_matches(g, rng, engines=("torch",), device="cuda", expect_steps=1)
    notes = plan.steps[0].config.behavior_notes
    assert BehaviorNote.CUDA_GRAPH_CAPTURABLE in notes and BehaviorNote.HOST_EXECUTION not in notes


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("op", list(CONV_IO))
@pytest.mark.parametrize("io", [FLOAT, HALF, BF16, DT.INT8], ids=lambda d: d.name)
def test_gpu_conv(op, io, rng):
    case = Conv("resnet", 8, 64, 64, (28, 28), (3, 3), (1, 1), (1, 1))
    out = DT.INT32 if io.is_integer else None
    compute = DT.INT32 if io.is_integer else FLOAT
    assert_engine_matches(
        conv_graph(op, case, "nhwc", io, out, compute), rng, engines=("torch",), device="cuda", **TF32_TOL.get(io, {})
    )


# cuDNN/cuBLAS fp32 results carry TF32-level error on the GPU (measured: ~1e-4 relative, noted as
# DOWN_CONVERT_INPUTS); fp32 outputs of GEMM-class ops are checked at that tolerance.
TF32_TOL = {FLOAT: {"rtol": 2e-2, "atol": 2e-1}}


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("op", [*CONV_IO, "matmul"])
@pytest.mark.parametrize("io", [HALF, BF16], ids=lambda d: d.name)
def test_gpu_low_precision_operands_fp32_output(op, io, rng):
    """fp16/bf16 operands with an fp32 output run on tensor cores: convolutions as fp32 (gemm.py), at TF32-level
    accuracy (checked at that tolerance; the config says DOWN_CONVERT_INPUTS), a matmul as cuBLAS's fp32
    output of the 16-bit operands (gemm.widened: no input converted, no such note)."""
    if op == "matmul":
        g = og.Graph("mm", io_data_type=io, intermediate_data_type=FLOAT, compute_data_type=FLOAT)
        g.matmul(g.tensor(dim=[2, 512, 1024], name="A"), g.tensor(dim=[2, 1024, 256], name="B")).set_output(
            True
        ).set_data_type(FLOAT)
    else:
        g = conv_graph(op, Conv("resnet", 8, 64, 64, (28, 28), (3, 3), (1, 1), (1, 1)), "nhwc", io, FLOAT)
    plan = assert_engine_matches(g, rng, engines=("torch",), device="cuda", **TF32_TOL[FLOAT])
    assert NumericalNote.TENSOR_CORE in plan.steps[0].config.numerical_notes
    assert (NumericalNote.DOWN_CONVERT_INPUTS in plan.steps[0].config.numerical_notes) == (op != "matmul")


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("io", [FLOAT, HALF, BF16, DT.INT8], ids=lambda d: d.name)
def test_gpu_matmul(io, rng):
    g = og.Graph(
        "mm", io_data_type=io, intermediate_data_type=FLOAT, compute_data_type=DT.INT32 if io.is_integer else FLOAT
    )
    a = g.tensor(dim=[4, 512, 1024], name="A")
    b = g.tensor(dim=[1, 1024, 768], stride=[1024 * 768, 1, 1024], name="B")
    c = g.matmul(a, b).set_output(True)
    if io.is_integer:
        c.set_data_type(DT.INT32)
    assert_engine_matches(g, rng, engines=("torch",), device="cuda", **TF32_TOL.get(io, {}))


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("out_layout", ["contiguous", "gapped"])
@pytest.mark.parametrize("io", [HALF, BF16], ids=lambda d: d.name)
def test_gpu_lone_16_bit_matmul_writes_its_output_in_place(io, out_layout, rng):
    """A lone fp16/bf16 matmul runs as one cuBLAS call into the output buffer (TorchKernel's direct
    path; an LM head's shape: 3-D activations times a transposed weight), a gapped output too."""
    g = graph(io, "head")
    a = g.tensor(dim=[2, 128, 256], name="A")
    w = g.tensor(dim=[1, 256, 384], stride=[256 * 384, 1, 256], name="W")  # an nn.Linear weight, transposed
    c = g.matmul(a, w).set_output(True)
    if out_layout == "gapped":
        c.set_stride([128 * 400, 400, 1])
    plan = assert_engine_matches(g, rng, engines=("torch",), device="cuda")
    assert plan.steps[0].kernel.direct


def check_through_the_direct_path(plan, step, rng):
    """The plan checked against the reference with `step` taking TorchKernel's direct path (the GPU's, forced
    here), which must have run."""
    step.kernel.direct = True
    calls = []
    direct = step.kernel._direct
    step.kernel._direct = lambda *args: calls.append(1) or direct(*args)
    bad = og.testing.check_plan(plan, rng)
    assert not bad, "\n".join(str(m) for m in bad)
    assert calls


@pytest.mark.parametrize("out_layout", ["contiguous", "gapped"])
def test_the_direct_matmul_path_on_the_cpu(out_layout, rng):
    """TorchKernel's direct path (torch.matmul out= into the output buffer), taken on the GPU for a lone
    16-bit matmul, run here on the CPU in float32 (the CPU's bf16 GEMM rounds partial sums): the
    operands as views (a transposed weight, broadcast batch), a gapped output."""
    g = graph(FLOAT, "head")
    a = g.tensor(dim=[2, 24, 40], name="A")
    w = g.tensor(dim=[1, 40, 56], stride=[40 * 56, 1, 40], name="W")
    c = g.matmul(a, w).set_output(True)
    if out_layout == "gapped":
        c.set_stride([24 * 64, 64, 1])
    plan = g.build(device="cpu", engines=["torch"])
    (step,) = plan.steps
    check_through_the_direct_path(plan, step, rng)


def test_the_direct_matmul_writes_into_a_workspace_view_but_not_over_its_operand():
    """A plan's intermediates are views of one workspace: the direct path runs where the output's bytes
    miss the operands' (a view of the same storage next to A), and leaves an output written over A to
    the general path (compute, then copy)."""
    g = graph(FLOAT, "mm")
    a = g.tensor(dim=[32, 32], name="A")
    w = g.tensor(dim=[32, 32], name="W")
    c = g.matmul(a, w).set_output(True)
    plan = g.build(device="cpu", engines=["torch"])
    kernel = plan.steps[0].kernel
    ws = torch.zeros(3 * 32 * 32)
    x, wt = torch.randn(32, 32), torch.randn(32, 32)
    ws[: 32 * 32] = x.reshape(-1)
    a_view, out_view = ws[: 32 * 32].view(32, 32), ws[32 * 32 : 2 * 32 * 32].view(32, 32)
    assert kernel._direct({a.uid: a_view, w.uid: wt, c.uid: out_view}, None, torch.device("cpu"))
    assert torch.allclose(out_view, x @ wt, rtol=1e-5, atol=1e-5)
    assert not kernel._direct({a.uid: a_view, w.uid: wt, c.uid: a_view}, None, torch.device("cpu"))
    assert torch.equal(a_view, x)  # (nothing written)


def head_with_views(dt=FLOAT, m=2, s=24, k=40, n=56):
    """An LM head as AOTAutograd's linear reaches a plan: the weight [N, K] transposed and the activations
    [B, S, K] merged into rows, views of the piece's inputs before the matmul."""
    g = graph(dt, "head")
    x = g.tensor(dim=[m, s, k], name="X")
    w = g.tensor(dim=[n, k], name="W")
    rows = g.reshape(x, [m * s, k], name="batch")
    wt = g.transpose(w, [1, 0], name="wt")
    return g, x, w, g.matmul(rows, wt, name="mm").set_output(True)


@pytest.mark.parametrize("out_layout", ["contiguous", "gapped"])
def test_the_direct_matmul_path_makes_its_operands_views(out_layout, rng):
    """The direct path with views before the matmul (a transposed weight, a batch merged into rows): the
    views are made of the loaded inputs, the product written into the output buffer (CPU, float32)."""
    g, _, _, c = head_with_views()
    if out_layout == "gapped":
        c.set_stride([64, 1])
    plan = g.build(device="cpu", engines=["torch"])
    (step,) = plan.steps
    assert [n.name for n in step.piece.nodes] == ["batch", "wt", "mm"], plan.describe()
    check_through_the_direct_path(plan, step, rng)


def test_native_gemm_takes_views_of_the_pieces_inputs_before_the_matmul():
    from opgraph.engines.shared.native_gemm import native_gemm

    g, _, _, _ = head_with_views(BF16)
    final = g.final
    assert [n.kind for n in final.nodes][-1] == "matmul" and len(final.nodes) == 3
    assert native_gemm(make_piece(final, 0, final.nodes))
    g, _, _, c = head_with_views(BF16)
    g.relu(c).set_output(True)  # (an epilogue after the product)
    final = g.final
    assert not native_gemm(make_piece(final, 0, final.nodes))
    g = graph(BF16, "head")  # a view that is also the piece's output
    x, w = g.tensor(dim=[64, 32], name="X"), g.tensor(dim=[16, 32], name="W")
    wt = g.transpose(w, [1, 0], name="wt").set_output(True)
    g.matmul(x, wt).set_output(True)
    final = g.final
    assert not native_gemm(make_piece(final, 0, final.nodes))
    g = graph(BF16, "head")  # a computed operand (a scaled input) before the product
    x, w = g.tensor(dim=[64, 32], name="X"), g.tensor(dim=[32, 16], name="W")
    g.matmul(g.relu(x), w).set_output(True)
    final = g.final
    assert not native_gemm(make_piece(final, 0, final.nodes))


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("io", [HALF, BF16], ids=lambda d: d.name)
def test_gpu_a_head_with_operand_views_writes_its_output_in_place(io, rng):
    g, _, _, _ = head_with_views(io, m=2, s=128, k=256, n=384)
    plan = assert_engine_matches(g, rng, engines=("torch",), device="cuda")
    assert plan.steps[0].kernel.direct


def test_native_gemm_is_a_lone_16_bit_matmul_of_one_type():
    from opgraph.engines.shared.native_gemm import native_gemm

    def piece(dt=BF16, out=None, epilogue=False):
        g = graph(dt, "mm")
        c = g.matmul(g.tensor(dim=[64, 32], name="A"), g.tensor(dim=[32, 16], name="B"))
        if epilogue:
            c = g.relu(c)
        c.set_output(True).set_data_type(out or dt)
        final = g.final
        return make_piece(final, 0, final.nodes)

    assert native_gemm(piece()) and native_gemm(piece(HALF))
    assert not native_gemm(piece(FLOAT)) and not native_gemm(piece(out=FLOAT)) and not native_gemm(piece(out=HALF))
    assert not native_gemm(piece(epilogue=True))


@pytest.mark.gpu
@requires_cuda
def test_gpu_norms_pooling_layout(rng):
    g = og.Graph("mix", io_data_type=BF16, intermediate_data_type=FLOAT, compute_data_type=FLOAT)
    x = g.tensor(dim=[2048, 1024], name="x")
    s, b = (g.tensor(dim=[1, 1024], data_type=FLOAT, name=n) for n in ("s", "b"))
    eps = g.tensor(dim=[1], data_type=FLOAT, name="eps")
    outputs(*g.layernorm(TRAIN, x, s, b, epsilon=eps))
    outputs(*g.rmsnorm(TRAIN, x, s, epsilon=eps))
    img = g.tensor(dim=[16, 64, 56, 56], stride=nhwc([16, 64, 56, 56]), name="img")
    outputs(*g.resample(img, mode="max", window=[3, 3], stride=[2, 2], padding=[1, 1], generate_index=True))
    g.transpose(g.slice(x, [slice(0, 1024), slice(None)]), [1, 0]).set_output(True)
    assert_engine_matches(g, rng, engines=("torch",), device="cuda", prepare=positive(eps, value=1e-5))


def test_float64_results_round_once_to_half():
    """float64 -> fp16 rounds once, from the float64 value, as the reference (NumPy) does; PyTorch's own
    conversion goes through float32 and rounds twice at a tie of fp16 in fp32 (fuzz seed 20261126106267)."""
    import torch

    from opgraph.engines.torch_engine.common import round_to as torch_round_to
    from opgraph.core.rounding import round_to

    rng = np.random.default_rng(7)
    ties = (np.float32(1.3950195) + np.array([2.0**-30, -(2.0**-30)])).astype(np.float64)  # beside an fp16 tie
    x = np.concatenate(
        [
            rng.standard_normal(20000) * 10.0 ** rng.integers(-9, 6, 20000),
            ties,
            [np.inf, -np.inf, np.nan, 0.0, -0.0, 1e300, -1e300, 65519.99, 65520.0, 2.0**-25, 3e-8],
        ]
    )
    got = torch_round_to(torch.from_numpy(x), DT.HALF).numpy().astype(np.float64)
    with np.errstate(over="ignore"):
        want = round_to(x, DT.HALF).astype(np.float64)
    assert np.array_equal(got, want, equal_nan=True)
    assert got[-13] != got[-12] or ties[0] == ties[1]  # the two sides of the tie round apart


def test_pinned_tf32_flags_keep_pytorchs_legacy_getter_working():
    """The torch engine pinned cuDNN's conv flag alone (PyTorch >= 2.9's API): with conv's and rnn's
    flags apart, PyTorch's legacy getter raises, and torch.export (which calls it) failed for every
    later import of the process (the GPU tier's train_step tests)."""
    from opgraph.engines.torch_engine.gemm import math_mode
    from opgraph.engines.torch_engine.precision import exact_math

    call = type("C", (), {"device": torch.device("cuda")})()
    with exact_math(True):
        assert torch.backends.cudnn.allow_tf32 is False
        with math_mode(call, True):
            assert torch.backends.cudnn.allow_tf32 is True
        assert torch.backends.cudnn.allow_tf32 is False
    assert isinstance(torch.backends.cudnn.allow_tf32, bool)
