"""Normalization ops on the reference engine: against PyTorch float64 (forward ops and autograd for
the backward ops) and independent formulas, over shapes, dtypes, NCHW/NHWC strides and the three
kinds of scalar epsilon/momentum; fused graphs; the builder API; one test per validation rule."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph import DataType, NormForwardPhase
from opgraph.core.tensor import channels_last_order, packed_strides
from opgraph.testing import compare, random_pack
from tests.helpers import outputs, per_channel

torch = pytest.importorskip("torch")
F = torch.nn.functional

FLOAT, HALF, BF16, DOUBLE = DataType.FLOAT, DataType.HALF, DataType.BFLOAT16, DataType.DOUBLE
TRAIN, INFER = NormForwardPhase.TRAINING, NormForwardPhase.INFERENCE
EPS = 2.0**-10  # exact in FLOAT, so a 1-element FLOAT tensor holds the same value as the number
MOMENTUM = 0.125

# (input dtype, how epsilon/momentum are given): every dtype, every scalar kind
DTYPE_SCALARS = [(FLOAT, "number"), (FLOAT, "by_value"), (HALF, "tensor"), (BF16, "by_value")]
# (dims, layout); logical dims stay [N, C, spatial...], the layout is in the strides
NC_SHAPES = [
    ([6, 5], "nchw"),
    ([3, 4, 5], "nhwc"),
    ([2, 3, 4, 5], "nchw"),
    ([2, 3, 4, 5], "nhwc"),
    ([2, 3, 2, 3, 4], "nhwc"),
]
SPATIAL_SHAPES = [s for s in NC_SHAPES if len(s[0]) >= 3] + [([2, 3, 5], "nchw")]
# (input dims, scale dims, layout) for layernorm / rmsnorm
LN_SHAPES = [
    ([6, 16], [1, 16], "nchw"),
    ([2, 3, 8], [1, 1, 8], "nchw"),
    ([2, 3, 4, 5], [1, 3, 4, 5], "nchw"),
    ([2, 3, 4, 5], [1, 3, 4, 5], "nhwc"),
    ([2, 3, 2, 3, 4], [1, 1, 2, 3, 4], "nhwc"),
]


# -- helpers ---------------------------------------------------------------------------------------


def graph(dtype: DataType = FLOAT) -> og.Graph:
    return og.Graph(io_data_type=dtype, intermediate_data_type=FLOAT, compute_data_type=FLOAT)


def strides(dim, layout):
    return packed_strides(dim, channels_last_order(len(dim)) if layout == "nhwc" else None)


def scalar(g, kind, name):
    """epsilon/momentum as a Python number, a pass-by-value tensor or a 1-element tensor."""
    if kind == "number":
        return EPS if name == "eps" else MOMENTUM
    return g.tensor(dim=[1], data_type=FLOAT, is_pass_by_value=kind == "by_value", name=name)


def T(a) -> torch.Tensor:
    return torch.from_numpy(np.array(a, dtype=np.float64))


class Pack:
    """Random non-zero inputs and NaN-poisoned outputs (opgraph.testing.random_pack) for g; `set`
    overrides inputs (scalars and stats), `run` executes on the reference engine."""

    def __init__(self, g: og.Graph, rng: np.random.Generator) -> None:
        self.g = g
        self.data = random_pack(g.final, rng)

    def set(self, t, value) -> None:
        if not isinstance(t, og.Tensor):  # a Python-number scalar is baked into the graph
            return
        if isinstance(self.data[t.uid], np.ndarray):
            self.data[t.uid][...] = np.asarray(value)
        else:
            self.data[t.uid] = float(value)

    def set_scalars(self, eps=None, momentum=None) -> None:
        self.set(eps, EPS)
        self.set(momentum, MOMENTUM)

    def __getitem__(self, t) -> np.ndarray:
        return np.asarray(self.data[t.uid]).astype(np.float64)

    def run(self) -> Pack:
        self.g.build(device="cpu").execute(self.data)
        return self

    def check(self, t, want) -> None:
        want = want.detach().numpy() if isinstance(want, torch.Tensor) else np.asarray(want)
        desc = self.g.final.tensors[t.uid]
        mismatch = compare(desc, self.data[t.uid], want.reshape(desc.dim))
        assert mismatch is None, str(mismatch)


def moments(x: np.ndarray, axes):
    mean = x.mean(axis=axes, keepdims=True)
    return mean, 1.0 / np.sqrt(((x - mean) ** 2).mean(axis=axes, keepdims=True) + EPS)


def autograd(fn, dy, *leaves):
    """Gradients of sum(fn(*leaves) * dy) w.r.t. the leaves, in float64."""
    leaves = [T(a).requires_grad_(True) for a in leaves]
    fn(*leaves).backward(T(dy))
    return [t.grad for t in leaves]


# -- batchnorm --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype,kind", DTYPE_SCALARS)
@pytest.mark.parametrize("dim,layout", NC_SHAPES)
def test_batchnorm_training_matches_torch(dim, layout, dtype, kind, rng):
    g = graph(dtype)
    c = per_channel(dim)
    x = g.tensor(dim=dim, stride=strides(dim, layout), name="x")
    scale, bias, rm, rv = (g.tensor(dim=c, data_type=FLOAT, name=n) for n in ("scale", "bias", "rm", "rv"))
    eps, momentum = scalar(g, kind, "eps"), scalar(g, kind, "momentum")
    y, mean, inv, next_rm, next_rv = g.batchnorm(x, scale, bias, rm, rv, epsilon=eps, momentum=momentum)
    outputs(y, mean, inv, next_rm, next_rv)
    p = Pack(g, rng)
    p.set_scalars(eps, momentum)
    p.set(rv, rng.uniform(0.5, 2.0, c))
    p.run()

    run_mean, run_var = T(p[rm]).flatten(), T(p[rv]).flatten()  # updated in place by torch
    want = F.batch_norm(
        T(p[x]),
        run_mean,
        run_var,
        T(p[scale]).flatten(),
        T(p[bias]).flatten(),
        training=True,
        momentum=MOMENTUM,
        eps=EPS,
    )
    axes = tuple(i for i in range(len(dim)) if i != 1)
    var, mu = torch.var_mean(T(p[x]), dim=axes, unbiased=False, keepdim=True)
    p.check(y, want)
    p.check(mean, mu)
    p.check(inv, torch.rsqrt(var + EPS))
    p.check(next_rm, run_mean)
    p.check(next_rv, run_var)
    assert y.stride == x.stride and y.data_type is dtype
    assert {t.data_type for t in (mean, inv, next_rm, next_rv)} == {FLOAT}


def test_batchnorm_stat_semantics_by_formula(rng):
    """Saved inv_variance uses the biased variance, the running variance the unbiased one."""
    g = graph(DOUBLE)
    dim = [3, 2, 2, 2]
    c = per_channel(dim)
    x, scale, bias, rm, rv = (
        g.tensor(dim=d, name=n) for d, n in ((dim, "x"), (c, "s"), (c, "b"), (c, "rm"), (c, "rv"))
    )
    y, mean, inv, next_rm, next_rv = g.batchnorm(x, scale, bias, rm, rv, epsilon=0.0, momentum=0.5)
    outputs(y, mean, inv, next_rm, next_rv)
    p = Pack(g, rng)
    p.set(x, rng.integers(-4, 5, dim))
    p.set(rv, np.ones(c))
    p.set(rm, np.zeros(c))
    p.run()
    xs = p[x].transpose(1, 0, 2, 3).reshape(2, -1)  # [C, M], M = 12
    biased, unbiased = xs.var(axis=1), xs.var(axis=1, ddof=1)
    assert not np.allclose(biased, unbiased)
    p.check(inv, (1.0 / np.sqrt(biased)).reshape(c))
    p.check(next_rm, 0.5 * xs.mean(axis=1).reshape(c))
    p.check(next_rv, (0.5 + 0.5 * unbiased).reshape(c))


def test_batchnorm_inplace_running_stats(rng):
    """cuDNN-style in-place update: next_running_* reuse the UIDs of in_running_* (single-op graph)."""
    g = graph(FLOAT)
    dim, c = [4, 3, 2, 2], [1, 3, 1, 1]
    x = g.tensor(dim=dim, name="x")
    scale, bias = g.tensor(dim=c, name="s"), g.tensor(dim=c, name="b")
    rm, rv = g.tensor(dim=c, name="rm", uid=100), g.tensor(dim=c, name="rv", uid=101)
    y, mean, inv, next_rm, next_rv = g.batchnorm(x, scale, bias, rm, rv, epsilon=EPS, momentum=MOMENTUM)
    outputs(y, mean, inv, next_rm, next_rv)
    next_rm.set_uid(100)
    next_rv.set_uid(101)
    p = Pack(g, rng)
    p.set(rm, np.full(c, 0.5))  # the shared buffers were poisoned as outputs
    p.set(rv, np.full(c, 2.0))
    want_m, want_v = torch.full((3,), 0.5, dtype=torch.float64), torch.full((3,), 2.0, dtype=torch.float64)
    F.batch_norm(T(p[x]), want_m, want_v, training=True, momentum=MOMENTUM, eps=EPS)
    p.run()
    p.check(rm, want_m)
    p.check(rv, want_v)


@pytest.mark.parametrize("dtype", [FLOAT, HALF, BF16])
@pytest.mark.parametrize("dim,layout", NC_SHAPES)
def test_batchnorm_inference_matches_torch(dim, layout, dtype, rng):
    g = graph(dtype)
    c = per_channel(dim)
    x = g.tensor(dim=dim, stride=strides(dim, layout), name="x")
    mean, inv, scale, bias = (g.tensor(dim=c, data_type=FLOAT, name=n) for n in ("mean", "inv", "s", "b"))
    y = g.batchnorm_inference(x, mean, inv, scale, bias).set_output(True)
    p = Pack(g, rng)
    p.set(inv, rng.uniform(0.5, 2.0, c))
    p.run()
    var = 1.0 / p[inv] ** 2  # eval-mode torch takes the variance: inv = 1/sqrt(var + 0)
    want = F.batch_norm(
        T(p[x]),
        T(p[mean]).flatten(),
        T(var).flatten(),
        T(p[scale]).flatten(),
        T(p[bias]).flatten(),
        training=False,
        eps=0.0,
    )
    p.check(y, want)
    assert y.stride == x.stride


@pytest.mark.parametrize(
    "dtype,stats",
    [(FLOAT, "saved"), (HALF, "saved"), (BF16, "saved"), (FLOAT, "number"), (HALF, "tensor"), (FLOAT, "by_value")],
)
@pytest.mark.parametrize("dim,layout", NC_SHAPES)
def test_batchnorm_backward_matches_autograd(dim, layout, dtype, stats, rng):
    g = graph(dtype)
    c = per_channel(dim)
    x = g.tensor(dim=dim, stride=strides(dim, layout), name="x")
    dy = g.tensor(dim=dim, stride=strides(dim, layout), name="dy")
    scale = g.tensor(dim=c, data_type=FLOAT, name="scale")
    if stats == "saved":
        mean, inv = g.tensor(dim=c, data_type=FLOAT, name="mean"), g.tensor(dim=c, data_type=FLOAT, name="inv")
        eps = None
    else:
        mean = inv = None
        eps = scalar(g, stats, "eps")
    dx, dscale, dbias = g.batchnorm_backward(dy, x, scale, mean, inv, epsilon=eps)
    outputs(dx, dscale, dbias)
    p = Pack(g, rng)
    axes = tuple(i for i in range(len(dim)) if i != 1)
    if stats == "saved":
        m, iv = moments(p[x], axes)
        p.set(mean, m)
        p.set(inv, iv)
    p.set_scalars(eps)
    p.run()
    gx, gs, gb = autograd(
        lambda x_, w, b: F.batch_norm(x_, None, None, w, b, training=True, eps=EPS),
        p[dy],
        p[x],
        p[scale].flatten(),
        np.zeros(dim[1]),
    )
    p.check(dx, gx)
    p.check(dscale, gs)
    p.check(dbias, gb)
    assert dx.stride == x.stride and dscale.data_type is FLOAT


# -- layernorm --------------------------------------------------------------------------------------


def _trailing(scale_dim):
    """The normalized shape torch takes: scale's dims after its leading 1s."""
    k = next(i for i, d in enumerate(scale_dim) if d != 1)
    return tuple(scale_dim[k:])


@pytest.mark.parametrize("dtype,kind", DTYPE_SCALARS)
@pytest.mark.parametrize("dim,sdim,layout", LN_SHAPES)
def test_layernorm_matches_torch(dim, sdim, layout, dtype, kind, rng):
    g = graph(dtype)
    x = g.tensor(dim=dim, stride=strides(dim, layout), name="x")
    scale, bias = g.tensor(dim=sdim, name="scale"), g.tensor(dim=sdim, name="bias")
    eps = scalar(g, kind, "eps")
    y, mean, inv = g.layernorm(TRAIN, x, scale, bias, epsilon=eps)
    outputs(y, mean, inv)
    p = Pack(g, rng)
    p.set_scalars(eps)
    p.run()
    ns = _trailing(sdim)
    want, mu, rstd = torch.native_layer_norm(T(p[x]), ns, T(p[scale]).reshape(ns), T(p[bias]).reshape(ns), EPS)
    p.check(y, want)
    p.check(mean, mu)
    p.check(inv, rstd)
    assert mean.dim == tuple(1 if s != 1 else d for d, s in zip(dim, sdim))
    assert y.stride == x.stride and inv.data_type is FLOAT


@pytest.mark.parametrize("affine", ["none", "scale", "bias"])
def test_layernorm_inference_and_optional_affine(affine, rng):
    """INFERENCE gives [y, None, None]; without scale and bias every axis but the first is normalized."""
    g = graph(FLOAT)
    dim = [3, 4, 5]
    x = g.tensor(dim=dim, name="x")
    p_dim = [1, 4, 5]
    scale = g.tensor(dim=p_dim, name="scale") if affine == "scale" else None
    bias = g.tensor(dim=p_dim, name="bias") if affine == "bias" else None
    y, mean, inv = g.layernorm(norm_forward_phase="inference", input=x, scale=scale, bias=bias, epsilon=EPS)
    assert mean is None and inv is None
    y.set_output(True)
    p = Pack(g, rng).run()
    w = None if scale is None else T(p[scale]).reshape(4, 5)
    b = None if bias is None else T(p[bias]).reshape(4, 5)
    p.check(y, F.layer_norm(T(p[x]), (4, 5), w, b, eps=EPS))


@pytest.mark.parametrize("dtype", [FLOAT, HALF, BF16])
@pytest.mark.parametrize("dim,sdim,layout", LN_SHAPES)
def test_layernorm_backward_matches_autograd(dim, sdim, layout, dtype, rng):
    g = graph(dtype)
    x = g.tensor(dim=dim, stride=strides(dim, layout), name="x")
    dy = g.tensor(dim=dim, stride=strides(dim, layout), name="dy")
    scale = g.tensor(dim=sdim, name="scale")
    stats = [1 if s != 1 else d for d, s in zip(dim, sdim)]
    mean, inv = g.tensor(dim=stats, data_type=FLOAT, name="mean"), g.tensor(dim=stats, data_type=FLOAT, name="inv")
    dx, dscale, dbias = g.layernorm_backward(dy, x, scale, mean, inv)
    outputs(dx, dscale, dbias)
    p = Pack(g, rng)
    m, iv = moments(p[x], tuple(i for i, s in enumerate(stats) if s == 1))
    p.set(mean, m)
    p.set(inv, iv)
    p.run()
    ns = _trailing(sdim)
    gx, gs, gb = autograd(
        lambda x_, w, b: F.layer_norm(x_, ns, w, b, eps=EPS), p[dy], p[x], p[scale].reshape(ns), np.zeros(ns)
    )
    p.check(dx, gx)
    p.check(dscale, gs)
    p.check(dbias, gb)
    assert dx.stride == x.stride and dscale.dim == tuple(sdim)


# -- rmsnorm ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype,kind", DTYPE_SCALARS)
@pytest.mark.parametrize("dim,sdim,layout", LN_SHAPES)
def test_rmsnorm_matches_torch(dim, sdim, layout, dtype, kind, rng):
    g = graph(dtype)
    x = g.tensor(dim=dim, stride=strides(dim, layout), name="x")
    scale, bias = g.tensor(dim=sdim, name="scale"), g.tensor(dim=sdim, name="bias")
    eps = scalar(g, kind, "eps")
    y, inv = g.rmsnorm(TRAIN, x, scale, bias, epsilon=eps)
    outputs(y, inv)
    p = Pack(g, rng)
    p.set_scalars(eps)
    p.run()
    ns = _trailing(sdim)
    axes = tuple(range(len(dim) - len(ns), len(dim)))
    want = F.rms_norm(T(p[x]), ns, T(p[scale]).reshape(ns), eps=EPS) + T(p[bias])
    p.check(y, want)
    p.check(inv, 1.0 / np.sqrt((p[x] ** 2).mean(axis=axes, keepdims=True) + EPS))
    assert y.stride == x.stride and inv.data_type is FLOAT


def test_rmsnorm_inference_without_bias(rng):
    g = graph(FLOAT)
    x, scale = g.tensor(dim=[5, 8], name="x"), g.tensor(dim=[1, 8], name="scale")
    y, inv = g.rmsnorm(INFER, x, scale, epsilon=EPS)
    assert inv is None
    y.set_output(True)
    p = Pack(g, rng).run()
    p.check(y, F.rms_norm(T(p[x]), (8,), T(p[scale]).reshape(8), eps=EPS))


@pytest.mark.parametrize("has_dbias", [True, False])
@pytest.mark.parametrize("dtype", [FLOAT, HALF, BF16])
@pytest.mark.parametrize("dim,sdim,layout", LN_SHAPES)
def test_rmsnorm_backward_matches_autograd(dim, sdim, layout, dtype, has_dbias, rng):
    g = graph(dtype)
    x = g.tensor(dim=dim, stride=strides(dim, layout), name="x")
    dy = g.tensor(dim=dim, stride=strides(dim, layout), name="dy")
    scale = g.tensor(dim=sdim, name="scale")
    stats = [1 if s != 1 else d for d, s in zip(dim, sdim)]
    inv = g.tensor(dim=stats, data_type=FLOAT, name="inv")
    dx, dscale, dbias = g.rmsnorm_backward(dy, x, scale, inv, has_dbias=has_dbias)
    assert (dbias is not None) == has_dbias
    outputs(dx, dscale, dbias)
    p = Pack(g, rng)
    axes = tuple(i for i, s in enumerate(stats) if s == 1)
    p.set(inv, 1.0 / np.sqrt((p[x] ** 2).mean(axis=axes, keepdims=True) + EPS))
    p.run()
    ns = _trailing(sdim)
    gx, gs, gb = autograd(
        lambda x_, w, b: F.rms_norm(x_, ns, w, eps=EPS) + b, p[dy], p[x], p[scale].reshape(ns), np.zeros(ns)
    )
    p.check(dx, gx)
    p.check(dscale, gs)
    if has_dbias:
        p.check(dbias, gb)


# -- instancenorm -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype,kind", DTYPE_SCALARS)
@pytest.mark.parametrize("dim,layout", SPATIAL_SHAPES)
def test_instancenorm_matches_torch(dim, layout, dtype, kind, rng):
    g = graph(dtype)
    c = per_channel(dim)
    x = g.tensor(dim=dim, stride=strides(dim, layout), name="x")
    scale, bias = g.tensor(dim=c, name="scale"), g.tensor(dim=c, name="bias")
    eps = scalar(g, kind, "eps")
    y, mean, inv = g.instancenorm(TRAIN, x, scale, bias, eps)
    outputs(y, mean, inv)
    p = Pack(g, rng)
    p.set_scalars(eps)
    p.run()
    want = F.instance_norm(T(p[x]), weight=T(p[scale]).flatten(), bias=T(p[bias]).flatten(), eps=EPS)
    var, mu = torch.var_mean(T(p[x]), dim=tuple(range(2, len(dim))), unbiased=False, keepdim=True)
    p.check(y, want)
    p.check(mean, mu)
    p.check(inv, torch.rsqrt(var + EPS))
    assert mean.dim == tuple(dim[:2]) + (1,) * (len(dim) - 2)
    assert y.stride == x.stride and mean.data_type is FLOAT


def test_instancenorm_inference(rng):
    g = graph(FLOAT)
    x = g.tensor(dim=[2, 3, 4, 4], name="x")
    scale, bias = g.tensor(dim=[1, 3, 1, 1], name="s"), g.tensor(dim=[1, 3, 1, 1], name="b")
    y, mean, inv = g.instancenorm(INFER, x, scale, bias, EPS)
    assert mean is None and inv is None
    y.set_output(True)
    p = Pack(g, rng).run()
    p.check(y, F.instance_norm(T(p[x]), weight=T(p[scale]).flatten(), bias=T(p[bias]).flatten(), eps=EPS))


@pytest.mark.parametrize("dtype,stats", [(FLOAT, "saved"), (HALF, "saved"), (BF16, "saved"), (FLOAT, "tensor")])
@pytest.mark.parametrize("dim,layout", SPATIAL_SHAPES)
def test_instancenorm_backward_matches_autograd(dim, layout, dtype, stats, rng):
    g = graph(dtype)
    c = per_channel(dim)
    sdim = dim[:2] + [1] * (len(dim) - 2)
    x = g.tensor(dim=dim, stride=strides(dim, layout), name="x")
    dy = g.tensor(dim=dim, stride=strides(dim, layout), name="dy")
    scale = g.tensor(dim=c, name="scale")
    if stats == "saved":
        mean, inv, eps = g.tensor(dim=sdim, data_type=FLOAT), g.tensor(dim=sdim, data_type=FLOAT), None
    else:
        mean, inv, eps = None, None, scalar(g, stats, "eps")
    dx, dscale, dbias = g.instancenorm_backward(dy, x, scale, mean, inv, epsilon=eps)
    outputs(dx, dscale, dbias)
    p = Pack(g, rng)
    if stats == "saved":
        m, iv = moments(p[x], tuple(range(2, len(dim))))
        p.set(mean, m)
        p.set(inv, iv)
    p.set_scalars(eps)
    p.run()
    gx, gs, gb = autograd(
        lambda x_, w, b: F.instance_norm(x_, weight=w, bias=b, eps=EPS),
        p[dy],
        p[x],
        p[scale].flatten(),
        np.zeros(dim[1]),
    )
    p.check(dx, gx)
    p.check(dscale, gs)
    p.check(dbias, gb)


# -- fused graphs -----------------------------------------------------------------------------------


def test_fused_batchnorm_relu(rng):
    g = graph(HALF)
    dim, c = [4, 3, 3, 3], [1, 3, 1, 1]
    x = g.tensor(dim=dim, stride=strides(dim, "nhwc"), name="x")
    scale, bias = g.tensor(dim=c, data_type=FLOAT, name="s"), g.tensor(dim=c, data_type=FLOAT, name="b")
    y, mean, inv, _, _ = g.batchnorm(x, scale, bias, epsilon=EPS)
    out = g.relu(y).set_output(True)
    outputs(mean, inv)
    p = Pack(g, rng).run()
    assert y.is_virtual and y.data_type is FLOAT and out.stride == x.stride
    bn = F.batch_norm(T(p[x]), None, None, T(p[scale]).flatten(), T(p[bias]).flatten(), training=True, eps=EPS)
    # y is an fp32 intermediate: round it as the graph does before the relu
    p.check(out, F.relu(bn.float().double()))


def test_fused_relu_backward_batchnorm_backward(rng):
    g = graph(FLOAT)
    dim, c = [4, 3, 3, 3], [1, 3, 1, 1]
    x, y_fwd, dy = (g.tensor(dim=dim, name=n) for n in ("x", "y", "dy"))
    scale = g.tensor(dim=c, name="scale")
    mean, inv = g.tensor(dim=c, name="mean"), g.tensor(dim=c, name="inv")
    d_y = g.relu_backward(dy, y_fwd)
    dx, dscale, dbias = g.batchnorm_backward(d_y, x, scale, mean, inv)
    outputs(dx, dscale, dbias)
    p = Pack(g, rng)
    m, iv = moments(p[x], (0, 2, 3))
    p.set(mean, m)
    p.set(inv, iv)
    p.set(y_fwd, (p[x] - m) * iv * p[scale] + 0.25)  # the forward's y (bias 0.25)
    p.run()
    assert d_y.is_virtual
    gx, gs, gb = autograd(
        lambda x_, w, b: F.relu(F.batch_norm(x_, None, None, w, b, training=True, eps=EPS)),
        p[dy],
        p[x],
        p[scale].flatten(),
        np.full(3, 0.25),
    )
    p.check(dx, gx)
    p.check(dscale, gs)
    p.check(dbias, gb)


def test_json_round_trip():
    g = graph(HALF)
    x = g.tensor(dim=[2, 3, 4, 4], name="x")
    c = [1, 3, 1, 1]
    s, b, rm, rv = (g.tensor(dim=c, data_type=FLOAT, name=n) for n in ("s", "b", "rm", "rv"))
    outputs(*g.batchnorm(x, s, b, rm, rv, epsilon=EPS, momentum=MOMENTUM, name="bn"))
    outputs(*g.layernorm(INFER, x, g.tensor(dim=[1, 3, 4, 4], name="g"), epsilon=EPS, name="ln"))
    again = og.Graph.from_json(g.to_json())
    assert str(again.final) == str(g.final)
    assert again.final.nodes[1].op.norm_forward_phase is INFER


# -- builder API --------------------------------------------------------------------------------------


def test_builder_outputs_and_phase_forms():
    g = graph(FLOAT)
    x, c = g.tensor(dim=[2, 3, 4, 4], name="x"), [1, 3, 1, 1]
    s, b = g.tensor(dim=c, name="s"), g.tensor(dim=c, name="b")
    outs = g.batchnorm(x, s, b, epsilon=EPS)
    assert len(outs) == 5 and outs[3] is None and outs[4] is None
    assert isinstance(g.batchnorm_inference(x, s, s, s, b), og.Tensor)
    for phase in (TRAIN, "TRAINING", "training"):
        assert None not in g.layernorm(phase, x, epsilon=EPS)
    assert g.rmsnorm(norm_forward_phase="inference", input=x, scale=s, epsilon=EPS)[1] is None
    with pytest.raises(TypeError, match="epsilon"):
        g.layernorm(TRAIN, x)


# -- validation rules: one test each ------------------------------------------------------------------


def _raises(cls, rule, build, *names):
    """build() then validate must raise `cls` with `rule`, naming each of `names` in the message."""
    with pytest.raises(cls) as info:
        g = build()
        g.validate()
    assert info.value.rule == rule and f"[rule {rule}]" in str(info.value), str(info.value)
    for name in names:
        assert name in str(info.value), str(info.value)


def _bn(dim=(2, 3, 4, 4), sdim=None, bdim=None, x_type=None, running=(True, True, True), eps=EPS, momentum=MOMENTUM):
    g = graph(FLOAT)
    c = per_channel(dim) if len(dim) > 1 else [1]
    x = g.tensor(dim=dim, data_type=x_type, name="x")
    s, b = g.tensor(dim=sdim or c, name="gamma"), g.tensor(dim=bdim or c, name="beta")
    rm = g.tensor(dim=c, name="rmean") if running[0] else None
    rv = g.tensor(dim=c, name="rvar") if running[1] else None
    outputs(*g.batchnorm(x, s, b, rm, rv, epsilon=eps, momentum=momentum if running[2] else None, name="bn"))
    return g


def _ln(sdim=(1, 3, 4, 4), bdim=None, phase=TRAIN):
    g = graph(FLOAT)
    x = g.tensor(dim=[2, 3, 4, 4], name="x")
    s = g.tensor(dim=sdim, name="gamma")
    b = g.tensor(dim=bdim, name="beta") if bdim else None
    outputs(*g.layernorm(phase, x, s, b, epsilon=EPS, name="ln"))
    return g


def _backward(op="batchnorm", mean=True, inv=True, eps=None, grad_dim=(2, 3, 4, 4), stats_dim=None):
    g = graph(FLOAT)
    x, dy = g.tensor(dim=[2, 3, 4, 4], name="x"), g.tensor(dim=grad_dim, name="dy")
    if op == "layernorm":
        sdim, default_stats = [1, 3, 4, 4], [2, 1, 1, 1]
    else:
        sdim, default_stats = [1, 3, 1, 1], ([1, 3, 1, 1] if op == "batchnorm" else [2, 3, 1, 1])
    s = g.tensor(dim=sdim, name="gamma")
    m = g.tensor(dim=stats_dim or default_stats, name="saved_mean") if mean else None
    iv = g.tensor(dim=stats_dim or default_stats, name="saved_inv") if inv else None
    if op == "layernorm":
        outs = g.layernorm_backward(dy, x, s, m, iv, name="bwd")
    elif op == "instancenorm":
        outs = g.instancenorm_backward(dy, x, s, m, iv, name="bwd", epsilon=eps)
    else:
        outs = g.batchnorm_backward(dy, x, s, m, iv, epsilon=eps, name="bwd")
    outputs(*outs)
    return g


def test_rule_rank():
    _raises(og.ShapeError, "norm.rank", lambda: _bn(dim=(8,), sdim=(1,), bdim=(1,), running=(0, 0, 0)), "'x'")

    def instancenorm_2d():
        g = graph(FLOAT)
        x, s = g.tensor(dim=[4, 3], name="x"), g.tensor(dim=[1, 3], name="gamma")
        outputs(*g.instancenorm(TRAIN, x, s, s, EPS))
        return g

    _raises(og.ShapeError, "norm.rank", instancenorm_2d, "'x'", "rank >= 3")


def test_rule_dtype():
    _raises(og.DataTypeError, "norm.dtype", lambda: _bn(x_type=DataType.INT8), "'x'", "INT8")


@pytest.mark.parametrize(
    "build",
    [
        lambda: _bn(sdim=(3,)),  # not [1, C, 1, 1]
        lambda: _ln(sdim=(1, 3, 4, 5)),  # 5 is neither 1 nor the input's 4
        lambda: _ln(sdim=(1, 1, 1, 1)),  # normalizes nothing
    ],
    ids=["batchnorm_rank", "layernorm_dim", "layernorm_all_ones"],
)
def test_rule_scale_dims(build):
    _raises(og.ShapeError, "norm.scale_dims", build, "'gamma'", "input 'scale'")


def test_rule_bias_dims():
    _raises(og.ShapeError, "norm.bias_dims", lambda: _ln(bdim=(1, 3, 1, 1)), "'beta'", "input 'bias'")


def test_rule_channels():
    _raises(og.ShapeError, "norm.channels", lambda: _bn(sdim=(1, 4, 1, 1)), "'gamma'", "4 channels")


@pytest.mark.parametrize(
    "build",
    [
        lambda: _backward("layernorm", stats_dim=[2, 3, 1, 1]),
        lambda: _backward("instancenorm", stats_dim=[1, 3, 1]),
    ],
    ids=["layernorm", "instancenorm"],
)
def test_rule_stats_dims(build):
    _raises(og.ShapeError, "norm.stats_dims", build, "'saved_mean'", "input 'mean'")


def test_rule_grad_dims():
    _raises(og.ShapeError, "norm.grad_dims", lambda: _backward("layernorm", grad_dim=(2, 3, 4, 5)), "'dy'")


def test_rule_phase():
    with pytest.raises(og.AttributeValueError) as info:
        _ln(phase="warmup")
    text = str(info.value)
    assert info.value.rule == "norm.phase" and "[rule norm.phase]" in text
    assert "layernorm 'ln'" in text and "'warmup'" in text


@pytest.mark.parametrize("running", [(0, 0, 1), (1, 0, 1), (1, 1, 0)], ids=["momentum_only", "no_var", "no_momentum"])
def test_rule_running_stats(running):
    _raises(og.AttributeValueError, "norm.running_stats", lambda: _bn(running=running), "in_running_mean")


@pytest.mark.parametrize(
    "build",
    [
        lambda: _backward(mean=False, inv=False),
        lambda: _backward(inv=False),
        lambda: _backward("instancenorm", eps=EPS),
    ],
    ids=["neither", "mean_only", "both_and_epsilon"],
)
def test_rule_saved_stats(build):
    _raises(og.AttributeValueError, "norm.saved_stats", build, "bwd", "mean and inv_variance")


def test_rule_peer_stats():
    g = graph(FLOAT)
    x, s = g.tensor(dim=[2, 3, 4, 4], name="x"), g.tensor(dim=[1, 3, 1, 1], name="s")
    peer = [g.tensor(dim=[2, 12, 1, 1], name="peer")]
    with pytest.raises(og.AttributeValueError) as info:
        g.batchnorm(x, s, s, epsilon=EPS, peer_stats=peer, name="bn")
    assert info.value.rule == "norm.peer_stats" and "multi-GPU" in str(info.value)
    with pytest.raises(og.AttributeValueError, match="norm.peer_stats"):
        g.batchnorm_backward(x, x, s, s, s, peer_stats=peer)
    assert g.batchnorm(x, s, s, epsilon=EPS, peer_stats=[])[0] is not None


def test_rule_epsilon():
    _raises(og.AttributeValueError, "norm.epsilon", lambda: _bn(eps=-1e-5), "epsilon=-1e-05")


def test_rule_momentum():
    _raises(og.AttributeValueError, "norm.momentum", lambda: _bn(momentum=1.5), "momentum=1.5")


def test_rule_reduction_size():
    _raises(og.ShapeError, "norm.reduction_size", lambda: _bn(dim=(1, 3)), "'x'", "one value per channel")


def test_scalar_inputs_take_one_value():
    """epsilon is a SCALAR_INPUT: the core rejects a many-element tensor there."""

    def build():
        g = graph(FLOAT)
        x, s = g.tensor(dim=[2, 3, 4, 4], name="x"), g.tensor(dim=[1, 3, 1, 1], name="s")
        outputs(*g.batchnorm(x, s, s, epsilon=g.tensor(dim=[2], name="eps2")))
        return g

    _raises(og.ShapeError, "op.scalar_input", build, "'eps2'", "'epsilon'")
