"""Inference over dynamic dims, op family by op family: each graph is built twice, once with
opgraph.Dim dims and once with ints, and the static graph of the first at a shape
(`FinalGraph.at`) must be exactly the second (dims, strides, types, attributes); then the dynamic
graph is built once on the reference engine and run at those shapes against the reference engine
on the static graph. Rules that cannot decide over a range give typed errors naming the op."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import opgraph as og
from opgraph.testing import compare, random_pack, reference_outputs
from tests.helpers import check_rule

N, T = og.Dim("n", 1, 9), og.Dim("t", 1, 13)
SHAPES = [{"n": 1, "t": 1}, {"n": 2, "t": 7}, {"n": 9, "t": 13}, {"n": 5, "t": 2}]
F32 = og.DataType.FLOAT


def mlp(g, n, t):
    x = g.tensor(dim=[n, t, 8], name="x")
    w = g.tensor(dim=[1, 8, 6], name="w")
    h = g.matmul(x, w)
    g.gelu(h).set_output(True).set_name("y")


def batched_matmul(g, n, t):
    a = g.tensor(dim=[n, t, 4], name="a")
    b = g.tensor(dim=[n, 4, t], name="b")
    g.matmul(a, b).set_output(True).set_name("scores")


def row_sums(g, n, t):
    x = g.tensor(dim=[n, t, 8], name="x")
    y = g.reduction(x, mode=og.ReductionMode.ADD).set_output(True).set_name("y")
    y.set_dim([n, t, 1])
    z = g.reduction(x, mode=og.ReductionMode.MAX).set_output(True).set_name("z")
    z.set_dim([1, 1, 8])  # a reduction over the dynamic axes


def norms(g, n, t):
    x = g.tensor(dim=[n, t, 16], name="x")
    scale = g.tensor(dim=[1, 1, 16], name="scale")
    bias = g.tensor(dim=[1, 1, 16], name="bias")
    y, _, _ = g.layernorm("inference", x, scale, bias, epsilon=1e-5)
    r, _ = g.rmsnorm("inference", y, scale, epsilon=1e-5)
    r.set_output(True).set_name("y")


def layout(g, n, t):
    x = g.tensor(dim=[n, t, 4, 2], name="x")
    y = g.transpose(x, permutation=[0, 2, 1, 3])
    r = g.reshape(y, dim=[-1, 2])
    g.relu(r).set_output(True).set_name("flat")
    c = g.concatenate([x, x], axis=1)
    g.neg(c).set_output(True).set_name("cat")


def lookup(g, n, t):
    w = g.tensor(dim=[11, 6], name="table")
    i = g.tensor(dim=[n, t], name="ids", data_type=og.DataType.INT32)
    g.embedding(w, i).set_output(True).set_name("rows")


def attention(g, n, t):
    q = g.tensor(dim=[n, 2, t, 8], name="q")
    k = g.tensor(dim=[n, 2, t, 8], name="k")
    v = g.tensor(dim=[n, 2, t, 8], name="v")
    o, _ = g.sdpa(q, k, v, attn_scale=0.35, use_causal_mask=True, is_inference=True)
    o.set_output(True).set_name("o")


def convolution(g, n, t):
    x = g.tensor(dim=[n, 3, 5, 5], name="x")
    w = g.tensor(dim=[4, 3, 3, 3], name="w")
    y = g.conv_fprop(x, w, padding=1)
    g.resample(y, mode=og.ResampleMode.MAX, window=[2, 2], stride=[2, 2])[0].set_output(True).set_name("p")


def norm_training(g, n, t):
    x = g.tensor(dim=[n, t, 16], name="x")
    scale = g.tensor(dim=[1, 1, 16], name="scale")
    bias = g.tensor(dim=[1, 1, 16], name="bias")
    y, mean, inv_var = g.layernorm("training", x, scale, bias, epsilon=1e-5)
    dy = g.tensor(dim=[n, t, 16], name="dy")
    dx, dscale, dbias = g.layernorm_backward(dy, x, scale, mean, inv_var)
    for name, out in (("y", y), ("dx", dx), ("dscale", dscale), ("dbias", dbias)):
        out.set_output(True).set_name(name)
    ry, rms_inv = g.rmsnorm("training", x, scale, epsilon=1e-5)
    ry.set_output(True).set_name("ry")
    rdx, rdscale, _ = g.rmsnorm_backward(dy, x, scale, rms_inv, has_dbias=False)
    rdx.set_output(True).set_name("rdx")
    rdscale.set_output(True).set_name("rdscale")


def image_stats(g, n, t):
    x = g.tensor(dim=[n, 4, 3, 3], name="x")
    s, sq = g.genstats(x)
    s.set_output(True).set_name("sum")
    sq.set_output(True).set_name("sq")
    stats = [g.tensor(dim=[1, 4, 1, 1], name=name) for name in ("mean", "inv_var", "scale", "bias")]
    g.batchnorm_inference(x, *stats).set_output(True).set_name("y")


def scan(g, n, t):
    x = g.tensor(dim=[n, t], name="x")
    g.cumsum(x, axis=1).set_output(True).set_name("forward")
    g.cumsum(x, axis=0, reverse=True).set_output(True).set_name("backward")


def slices(g, n, t):
    x = g.tensor(dim=[n, t + 3, 6], name="x")  # at least 4 long on axis 1
    g.slice(x, [slice(None), slice(1, 4), slice(0, 6, 2)]).set_output(True).set_name("window")
    g.slice(x, [slice(None), slice(2, None)]).set_output(True).set_name("tail")
    g.slice(x, [slice(None), slice(1, t + 2)]).set_output(True).set_name("inner")  # a dynamic stop: x[:, 1:-1]


def image_norms(g, n, t):
    x = g.tensor(dim=[n, 4, 3, 3], name="x")
    scale, bias, rm, rv = (g.tensor(dim=[1, 4, 1, 1], name=name) for name in ("scale", "bias", "rm", "rv"))
    y, mean, inv_var, next_rm, next_rv = g.batchnorm(x, scale, bias, rm, rv, epsilon=1e-5, momentum=0.1)
    dy = g.tensor(dim=[n, 4, 3, 3], name="dy")
    dx, dscale, dbias = g.batchnorm_backward(dy, x, scale, mean, inv_var)
    iy, imean, iinv = g.instancenorm("training", x, scale, bias, epsilon=1e-5)
    idx, idscale, idbias = g.instancenorm_backward(dy, x, scale, imean, iinv)
    for name, out in (
        ("y", y),
        ("next_rm", next_rm),
        ("next_rv", next_rv),
        ("dx", dx),
        ("dscale", dscale),
        ("dbias", dbias),
        ("iy", iy),
        ("idx", idx),
        ("idscale", idscale),
        ("idbias", idbias),
    ):
        out.set_output(True).set_name(name)


FAMILIES: dict[str, Callable] = {
    "batch and instance norms": image_norms,
    "slice": slices,
    "cumsum": scan,
    "norm training and backward": norm_training,
    "image statistics": image_stats,
    "pointwise and matmul": mlp,
    "batched matmul": batched_matmul,
    "reduction": row_sums,
    "norms": norms,
    "layout": layout,
    "embedding": lookup,
    "attention": attention,
    "conv and pooling": convolution,
}


def build(make, n, t) -> og.Graph:
    g = og.Graph("family", io_data_type=F32)
    make(g, n, t)
    return g


@pytest.mark.parametrize("family", list(FAMILIES))
def test_inference_at_a_shape_is_the_static_inference(family):
    make = FAMILIES[family]
    dynamic = build(make, N, T).final
    assert dynamic.is_dynamic
    for env in SHAPES:
        static = build(make, env["n"], env["t"]).final
        assert str(dynamic.at(env)) == str(static), env
        assert dynamic.at(env).nodes == static.nodes


@pytest.mark.parametrize("family", list(FAMILIES))
def test_one_build_matches_the_reference_at_every_shape(family):
    g = build(FAMILIES[family], N, T)
    plan = g.build(device="cpu", engines=["reference"])
    rng = np.random.default_rng(5)
    for env in SHAPES:
        static = g.final.at(env)
        pack = random_pack(static, rng)
        want = reference_outputs(static, pack)
        plan.execute(pack)
        bad = [m for u in static.outputs if (m := compare(static.tensors[u], pack[u], want[u])) is not None]
        assert not bad, f"{env}: " + "\n".join(map(str, bad))


def test_matmul_k_of_two_dims_is_refused_naming_both():
    g = og.Graph(io_data_type=F32)
    a = g.tensor(dim=[1, 4, og.Dim("k1", 1, 8)], name="A")
    b = g.tensor(dim=[1, og.Dim("k2", 1, 8), 4], name="B")
    g.matmul(a, b, name="mm").set_output(True)
    with pytest.raises(og.ShapeError) as info:
        g.validate()
    check_rule(info.value, "matmul.k", "B", "mm")


def test_a_reshape_that_divides_a_dynamic_count_unevenly_is_refused():
    g = og.Graph(io_data_type=F32)
    x = g.tensor(dim=[N, 6], name="x")
    g.reshape(x, dim=[-1, 4], name="r").set_output(True)
    with pytest.raises(og.ShapeError) as info:
        g.validate()
    check_rule(info.value, "reshape.numel", "x", "r")


@pytest.mark.parametrize("window", [slice(0, 4), slice(-3, None), slice(0, None, 2), slice(1, T)])
def test_a_slice_whose_length_depends_on_the_size_is_refused(window):
    g = og.Graph(io_data_type=F32)
    x = g.tensor(dim=[N, T], name="x")
    g.slice(x, [slice(None), window], name="window").set_output(True)  # t may be below 4
    with pytest.raises(og.ShapeError) as info:
        g.validate()
    check_rule(info.value, "slice.dynamic", "x", "window")


@pytest.mark.parametrize(
    "image, weight, names",
    [
        ([N, 3, T, 5], [4, 3, 3, 3], ("x", "conv")),
        ([1, T, 5, 5], [4, T, 3, 3], ("x", "conv")),
    ],
)
def test_convolution_takes_a_dynamic_batch_only(image, weight, names):
    g = og.Graph(io_data_type=F32)
    x = g.tensor(dim=image, name="x")
    w = g.tensor(dim=weight, name="w")
    g.conv_fprop(x, w, padding=1, name="conv").set_output(True)
    with pytest.raises(og.ShapeError) as info:
        g.validate()
    err = check_rule(info.value, "op.dynamic_dims", *names)
    assert "dynamic batch" in str(err)


def test_running_statistics_need_two_values_per_channel_over_the_whole_range():
    g = og.Graph(io_data_type=F32)
    x = g.tensor(dim=[N, 4, 1, 1], name="x")  # n = 1 leaves one value per channel
    stats = [g.tensor(dim=[1, 4, 1, 1], name=name) for name in ("scale", "bias", "rm", "rv")]
    outs = g.batchnorm(x, *stats, epsilon=1e-5, momentum=0.1, name="bn")
    for out in outs:
        out.set_output(True)
    with pytest.raises(og.ShapeError) as info:
        g.validate()
    check_rule(info.value, "norm.reduction_size", "x", "bn")
