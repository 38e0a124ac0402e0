"""Gradient graphs against PyTorch autograd and finite differences.

Every forward graph is float64 on the reference engine; its backward graph (split mode: saved
tensors bound from the forward run; or combined: one forward + backward graph) runs there too, with
random incoming gradients, and each gradient is compared with torch.autograd.grad of the same
function written with PyTorch ops (whose forward value is checked first, so the two functions are
the same).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import opgraph as og
from opgraph.autodiff import grad, register_custom_grad, saved_pack
from opgraph.autodiff.grad import resolve
from opgraph.ops.norm import Batchnorm
from opgraph.ops.pointwise import PointwiseMode as M
from opgraph.core.tensor import channels_last_order, packed_strides
from opgraph.testing import clone, empty_like_desc, poison, random_values

from ..helpers import requires_cuda, requires_interpreter

pytestmark = pytest.mark.usefixtures("custom_ops_restored")
torch = pytest.importorskip("torch")
F = torch.nn.functional

D = og.DataType.DOUBLE
NHWC = "nhwc"


def fgraph(name: str = "f") -> og.Graph:
    return og.Graph(name, io_data_type=D, intermediate_data_type=D, compute_data_type=D)


def image(g: og.Graph, dim, name: str, layout: str = "nchw", **kw) -> og.Tensor:
    stride = packed_strides(dim, channels_last_order(len(dim))) if layout == NHWC else None
    return g.tensor(dim=dim, stride=stride, name=name, **kw)


# -- the harness -------------------------------------------------------------------------------------------------------


def _inputs(fg: og.FinalGraph, rng, prepare):
    pack = {}
    for uid in fg.inputs:
        t = fg.tensors[uid]
        pack[uid] = float(rng.uniform(0.1, 1.0)) if t.is_pass_by_value else random_values(t, rng)
    if prepare is not None:
        prepare({fg.tensors[u].name: v for u, v in pack.items()})
    return pack


def _execute(g: og.Graph, values: dict, rng=None) -> dict:
    """Run g on the reference engine: `values` binds inputs by UID (missing inputs random); returns
    every non-virtual tensor by UID."""
    f = g.final
    pack = {}
    for uid in f.inputs:
        pack[uid] = values[uid] if uid in values else random_values(f.tensors[uid], rng)
    for uid in f.outputs:
        pack[uid] = poison(empty_like_desc(f.tensors[uid]))
    g.build(device="cpu").execute(pack)
    return pack


def run_grad(g, outs, wrt, rng, *, combined=False, prepare=None, **kw):
    """Forward values, forward outputs, incoming gradients and gradients, by forward UID."""
    fg = g.final
    res = grad(g, outs, wrt, combined=combined, **kw)
    inputs = _inputs(fg, rng, prepare)
    if combined:
        pack = _execute(res.graph, inputs, rng)
    else:
        res.keep_in(g)
        fpack = _execute(g, inputs)
        assert set(res.saved) <= set(fpack), "a saved tensor is not in the forward pack"
        pack = _execute(res.graph, saved_pack(res, fpack), rng)
        pack.update({u: v for u, v in fpack.items() if u not in pack})
    out_uids = [resolve(res.forward, o, "outputs") for o in _list(outs)]
    fwd = {u: pack[u] for u in out_uids}
    dys = {u: pack[res.grad_inputs[u].uid] if u in res.grad_inputs else np.zeros(fg.tensors[u].dim) for u in out_uids}
    grads = {u: pack[t.uid] for u, t in res.grads.items()}
    return res, inputs, fwd, dys, grads


def _list(v):
    return list(v) if isinstance(v, (list, tuple)) else [v]


def _t(a):
    return torch.tensor(np.asarray(a, dtype=np.float64))


def check(g, outs, wrt, fn, rng, *, combined=False, prepare=None, rtol=1e-9, atol=1e-11, **kw):
    """Gradients of g (through grad()) against torch.autograd.grad of fn(**{input name: tensor})."""
    res, inputs, fwd, dys, grads = run_grad(g, outs, wrt, rng, combined=combined, prepare=prepare, **kw)
    fg = res.forward
    tin = {}
    for uid, v in inputs.items():
        t = _t(v)
        if uid in res.grads:
            t.requires_grad_(True)
        tin[fg.tensors[uid].name] = t
    ys = fn(**tin)
    ys = list(ys) if isinstance(ys, (list, tuple)) else [ys]
    out_uids = list(fwd)
    assert len(ys) == len(out_uids)
    for uid, y in zip(out_uids, ys):
        want_y = y.detach().numpy().reshape(fg.tensors[uid].dim)
        np.testing.assert_allclose(
            np.asarray(fwd[uid], dtype=np.float64),
            want_y,
            rtol=rtol,
            atol=atol,
            err_msg=f"forward {fg.tensors[uid].name} differs from torch",
        )
    wrt_uids = [u for u in res.grads]
    live = [(u, y) for u, y in zip(out_uids, ys) if y.requires_grad]
    want = torch.autograd.grad(
        [y for _, y in live],
        [tin[fg.tensors[u].name] for u in wrt_uids],
        [_t(dys[u]).reshape(y.shape) for u, y in live],
        allow_unused=True,
    )
    for uid, w in zip(wrt_uids, want):
        w = np.zeros(fg.tensors[uid].dim) if w is None else w.numpy()
        np.testing.assert_allclose(
            np.asarray(grads[uid], dtype=np.float64),
            w.reshape(fg.tensors[uid].dim),
            rtol=rtol,
            atol=atol,
            err_msg=f"gradient of {fg.tensors[uid].name}",
        )
    return res


def check_fd(g, outs, wrt, rng, *, prepare=None, h=1e-6, rtol=1e-6):
    """Directional central differences: <grad, v> against (L(x + h v) - L(x - h v)) / 2h, L = <dy, y>."""
    res, inputs, _, dys, grads = run_grad(g, outs, wrt, rng, prepare=prepare)
    g.validate()
    for uid in res.grads:
        v = rng.standard_normal(res.forward.tensors[uid].dim)

        def loss(sign, uid=uid, v=v):
            values = dict(inputs)
            values[uid] = clone(inputs[uid])  # same strides
            values[uid][...] = np.asarray(inputs[uid], dtype=np.float64) + sign * h * v
            pack = _execute(g, values)
            return sum(float(np.sum(dys[o] * pack[o])) for o in dys)

        numeric = (loss(1) - loss(-1)) / (2 * h)
        analytic = float(np.sum(np.asarray(grads[uid]) * v))
        assert math.isclose(numeric, analytic, rel_tol=rtol, abs_tol=1e-7), (
            res.forward.tensors[uid].name,
            numeric,
            analytic,
        )
    return res


# -- pointwise ---------------------------------------------------------------------------------------------------------

_SQRT2PI = math.sqrt(2 * math.pi)
UNARY = {
    M.IDENTITY: lambda x: x * 1.0,
    M.NEG: lambda x: -x,
    M.ABS: torch.abs,
    M.EXP: torch.exp,
    M.SIN: torch.sin,
    M.COS: torch.cos,
    M.TAN: torch.tan,
    M.ERF: torch.erf,
    M.TANH_FWD: torch.tanh,
    M.SIGMOID_FWD: torch.sigmoid,
    M.GELU_FWD: F.gelu,
    M.GELU_APPROX_TANH_FWD: lambda x: F.gelu(x, approximate="tanh"),
    M.RECIPROCAL: torch.reciprocal,
}
POSITIVE = {M.LOG: torch.log, M.SQRT: torch.sqrt, M.RSQRT: torch.rsqrt}


@pytest.mark.parametrize("mode", list(UNARY) + list(POSITIVE), ids=lambda m: m.name)
def test_unary(mode, rng):
    g = fgraph()
    x = g.tensor(dim=[3, 5], name="x")
    y = g.pointwise(x, mode=mode).set_output(True)
    prep = (lambda p: p.__setitem__("x", np.abs(p["x"]) + 0.1)) if mode in POSITIVE else None
    fn = {**UNARY, **POSITIVE}[mode]
    check(g, y, x, lambda x: fn(x), rng, prepare=prep)


BINARY = {
    M.ADD: torch.add,
    M.SUB: torch.sub,
    M.MUL: torch.mul,
    M.DIV: torch.div,
    M.MAX: torch.maximum,
    M.MIN: torch.minimum,
    M.POW: torch.pow,
    M.ADD_SQUARE: lambda a, b: a + b * b,
    M.MOD: torch.fmod,
}


@pytest.mark.parametrize("mode", list(BINARY), ids=lambda m: m.name)
def test_binary(mode, rng):
    g = fgraph()
    a = g.tensor(dim=[3, 4], name="a")
    b = g.tensor(dim=[3, 4], name="b")
    y = g.pointwise(a, b, mode=mode).set_output(True)

    def prep(p):
        if mode is M.POW:
            p["a"][...] = np.abs(p["a"]) + 0.2
        if mode is M.MOD:  # keep away from the jumps of fmod
            p["b"][...] = np.sign(p["b"]) * (np.abs(p["b"]) + 0.5)
            q = p["a"] / p["b"]
            p["a"][...] = (np.trunc(q) + 0.5) * p["b"]

    check(g, y, [a, b], lambda a, b: BINARY[mode](a, b), rng, prepare=prep)


@pytest.mark.parametrize("mode", [M.MAX, M.MIN], ids=lambda m: m.name)
def test_max_min_ties_split_like_torch(mode, rng):
    g = fgraph()
    a = g.tensor(dim=[2, 4], name="a")
    b = g.tensor(dim=[2, 4], name="b")
    y = g.pointwise(a, b, mode=mode).set_output(True)
    check(g, y, [a, b], lambda a, b: BINARY[mode](a, b), rng, prepare=lambda p: p["b"].__setitem__((0,), p["a"][0]))


def test_literal_operands(rng):
    g = fgraph()
    x = g.tensor(dim=[2, 5], name="x")
    y = g.div(g.pow(g.add(g.mul(x, 3.0), 10.0), 2.0), g.max(x, -0.5)).set_output(True)
    check(g, y, x, lambda x: torch.pow(3 * x + 10, 2.0) / torch.clamp(x, min=-0.5), rng)


ACTIVATIONS = [
    ("relu", lambda g, x: g.relu(x), lambda x: F.relu(x)),
    ("leaky", lambda g, x: g.leaky_relu(x, 0.1), lambda x: F.leaky_relu(x, 0.1)),
    ("relu6", lambda g, x: g.relu(x, upper_clip=1.0), lambda x: F.hardtanh(x, 0.0, 1.0)),
    (
        "clip_slope",
        lambda g, x: g.relu(x, lower_clip=-0.5, upper_clip=1.0, negative_slope=0.2),
        lambda x: torch.where(x < -0.5, -0.5 + 0.2 * (x + 0.5), torch.clamp(x, max=1.0)),
    ),
    ("elu", lambda g, x: g.elu(x, alpha=0.7), lambda x: F.elu(x, 0.7)),
    ("softplus", lambda g, x: g.softplus(x, beta=2.0), lambda x: F.softplus(x, beta=2.0)),
    ("swish", lambda g, x: g.swish(x, swish_beta=1.5), lambda x: x * torch.sigmoid(1.5 * x)),
    ("silu", lambda g, x: g.swish(x), lambda x: F.silu(x)),
]


@pytest.mark.parametrize("build,fn", [a[1:] for a in ACTIVATIONS], ids=[a[0] for a in ACTIVATIONS])
def test_activation(build, fn, rng):
    g = fgraph()
    x = g.tensor(dim=[4, 6], name="x")
    y = build(g, x).set_output(True)
    check(g, y, x, fn, rng)


def test_relu_with_tensor_clip(rng):
    g = fgraph()
    x = g.tensor(dim=[4, 6], name="x")
    hi = g.tensor(dim=[1], name="hi", is_pass_by_value=True)
    y = g.relu(x, upper_clip=hi).set_output(True)
    check(g, y, x, lambda x, hi: torch.clamp(x, 0.0, hi), rng)


def test_binary_select_and_comparison(rng):
    g = fgraph()
    a = g.tensor(dim=[3, 4], name="a")
    b = g.tensor(dim=[3, 4], name="b")
    y = g.binary_select(g.exp(a), g.mul(b, b), g.cmp_gt(a, b)).set_output(True)
    check(g, y, [a, b], lambda a, b: torch.where(a > b, torch.exp(a), b * b), rng)


def test_comparison_only_path_is_unused(rng):
    g = fgraph()
    a = g.tensor(dim=[3, 4], name="a")
    b = g.tensor(dim=[3, 4], name="b")
    y = g.mul(g.cmp_gt(a, 0.0).set_data_type(D), b).set_output(True)
    with pytest.raises(og.GraphError) as err:
        grad(g, y, [a, b])
    assert err.value.rule == "autodiff.unused" and "'a'" in str(err.value)
    check(g, y, [a, b], lambda a, b: (a > 0).double() * b, rng, allow_unused=True)


def test_cast_to_half_and_back(rng):
    g = og.Graph("f", io_data_type=D, intermediate_data_type=og.DataType.HALF, compute_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[4, 4], name="x")
    y = g.mul(g.identity(x), 2.0).set_output(True)
    _, _, _, dys, grads = run_grad(g, y, x, rng)
    np.testing.assert_allclose(grads[x.uid], np.asarray(dys[y.uid]) * 2.0, rtol=2e-3, atol=2e-3)


# -- broadcasting, multi-use -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("combined", [False, True], ids=["split", "combined"])
def test_broadcast_operands_are_reduced(combined, rng):
    g = fgraph()
    x = g.tensor(dim=[2, 3, 4], name="x")
    bias = g.tensor(dim=[1, 3, 1], name="bias")
    row = g.tensor(dim=[1, 1, 4], name="row")
    s = g.tensor(dim=[1], name="s")
    y = g.mul(g.add(g.mul(x, row), bias), s).set_output(True)
    check(g, y, [x, bias, row, s], lambda x, bias, row, s: (x * row + bias) * s, rng, combined=combined)


# a gradient constant along the axes a mean or sum reduced (compact: 1 in those axes) that reaches an operand
# broadcast along them: the operand's gradient sums every broadcast position, not only the compact ones
def _mean(g, t, dim):
    return g.reduction(t, mode=og.ReductionMode.AVG).set_dim(dim).set_data_type(D)


def _channels_last_block(g):  # ConvNeXt's end: a Linear's bias and a layer scale over [N, H, W, C], mean over H, W
    x, bias, gamma = (
        g.tensor(dim=[2, 3, 4, 5], name="x"),
        g.tensor(dim=[1, 1, 1, 5], name="bias"),
        g.tensor(dim=[1, 1, 1, 5], name="gamma"),
    )
    return (
        [x, bias, gamma],
        _mean(g, g.mul(g.add(x, bias), gamma), [2, 1, 1, 5]),
        lambda x, bias, gamma: ((x + bias) * gamma).mean(dim=(1, 2), keepdim=True),
    )


def _channels_first_mean(g):  # the same, permuted to [N, C, H, W] before the pooling (HF's ConvNext)
    x, bias = g.tensor(dim=[2, 3, 4, 5], name="x"), g.tensor(dim=[1, 1, 1, 5], name="bias")
    r = g.tensor(dim=[2, 5, 3, 4], name="r")
    y = _mean(g, g.add(r, g.transpose(g.add(x, bias), [0, 3, 1, 2])), [2, 5, 1, 1])
    return [x, bias, r], y, lambda x, bias, r: (r + (x + bias).permute(0, 3, 1, 2)).mean(dim=(2, 3), keepdim=True)


def _sequence(g):  # [N, T, C] with a bias and a scale subtracted, mean over T
    x, bias, s = g.tensor(dim=[2, 6, 4], name="x"), g.tensor(dim=[1, 1, 4], name="bias"), g.tensor(dim=[1], name="s")
    y = g.reduction(g.sub(g.sub(x, bias), s), mode=og.ReductionMode.ADD).set_dim([2, 1, 4]).set_data_type(D)
    return [x, bias, s], y, lambda x, bias, s: (x - bias - s).sum(dim=1, keepdim=True)


def _scalar_to_scalar(g):  # a one-element parameter, summed over everything
    x, s = g.tensor(dim=[3, 4], name="x"), g.tensor(dim=[1, 1], name="s")
    return [x, s], _mean(g, g.add(x, s), [1, 1]), lambda x, s: (x + s).mean().reshape(1, 1)


def _frozen_batchnorm(g):  # batchnorm_inference's broadcast statistics and affine, then global pooling
    x = image(g, [2, 3, 2, 4], "x", NHWC)
    mean, inv, scale, bias = (g.tensor(dim=[1, 3, 1, 1], name=n) for n in ("mean", "inv", "scale", "bias"))
    y = _mean(g, g.batchnorm_inference(x, mean, inv, scale, bias), [2, 3, 1, 1])
    return (
        [x, mean, inv, scale, bias],
        y,
        lambda x, mean, inv, scale, bias: ((x - mean) * inv * scale + bias).mean(dim=(2, 3), keepdim=True),
    )


COMPACT = {
    "channels_last_block": _channels_last_block,
    "channels_first_mean": _channels_first_mean,
    "sequence": _sequence,
    "scalar_to_scalar": _scalar_to_scalar,
    "frozen_batchnorm": _frozen_batchnorm,
}


@pytest.mark.parametrize("combined", [False, True], ids=["split", "combined"])
@pytest.mark.parametrize("case", list(COMPACT))
def test_broadcast_operand_of_a_compact_gradient_sums_every_position(case, combined, rng):
    g = fgraph()
    wrt, y, fn = COMPACT[case](g)
    y.set_output(True)
    check(g, y, wrt, fn, rng, combined=combined)


def test_pass_by_value_scalar_gets_no_gradient_but_reads(rng):
    g = fgraph()
    x = g.tensor(dim=[2, 3], name="x")
    s = g.tensor(dim=[1], name="s", is_pass_by_value=True)
    y = g.mul(g.exp(x), s).set_output(True)
    res = check(g, y, x, lambda x, s: torch.exp(x) * s, rng)
    assert s.uid in res.saved


def test_multi_use_tensor_accumulates(rng):
    g = fgraph()
    x = g.tensor(dim=[3, 4], name="x")
    w = g.tensor(dim=[3, 4], name="w")
    t = g.tanh(x)
    y = g.add(g.mul(t, t), g.mul(g.exp(x), w)).set_output(True)
    z = g.sigmoid(t).set_output(True)
    check(g, [y, z], [x, w], lambda x, w: (torch.tanh(x) ** 2 + torch.exp(x) * w, torch.sigmoid(torch.tanh(x))), rng)


def test_same_tensor_twice_in_one_op(rng):
    g = fgraph()
    x = g.tensor(dim=[5], name="x")
    y = g.mul(x, x).set_output(True)
    check(g, y, x, lambda x: x * x, rng)


def test_output_that_no_wrt_reaches_takes_no_gradient(rng):
    g = fgraph()
    x, w = g.tensor(dim=[2, 3], name="x"), g.tensor(dim=[2, 3], name="w")
    y = g.exp(x).set_output(True)
    z = g.sin(w).set_output(True)
    res = check(g, [y, z], [x], lambda x, w: (torch.exp(x), torch.sin(w)), rng)
    assert list(res.grad_inputs) == [y.uid]


def test_wrt_intermediate_and_output(rng):
    g = fgraph()
    x = g.tensor(dim=[3, 4], name="x")
    h = g.exp(x).set_name("h")
    y = g.sin(h).set_output(True).set_name("y")
    _, inputs, _, dys, grads = run_grad(g, y, [h, x, y], rng)
    hv = np.exp(inputs[x.uid].astype(np.float64))
    dh = dys[y.uid] * np.cos(hv)
    np.testing.assert_allclose(grads[h.uid], dh, rtol=1e-12)
    np.testing.assert_allclose(grads[x.uid], dh * hv, rtol=1e-12)
    np.testing.assert_allclose(grads[y.uid], dys[y.uid], rtol=0)


# -- reductions --------------------------------------------------------------------------------------------------------

REDUCTIONS = {
    og.ReductionMode.ADD: lambda x, d: x.sum(dim=d, keepdim=True),
    og.ReductionMode.AVG: lambda x, d: x.mean(dim=d, keepdim=True),
    og.ReductionMode.MAX: lambda x, d: x.amax(dim=d, keepdim=True),
    og.ReductionMode.MIN: lambda x, d: x.amin(dim=d, keepdim=True),
    og.ReductionMode.AMAX: lambda x, d: x.abs().amax(dim=d, keepdim=True),
    og.ReductionMode.NORM1: lambda x, d: x.abs().sum(dim=d, keepdim=True),
    og.ReductionMode.NORM2: lambda x, d: torch.sqrt((x * x).sum(dim=d, keepdim=True)),
    og.ReductionMode.MUL: lambda x, d: x.prod(dim=d[0], keepdim=True) if len(d) == 1 else x.prod(),
}


@pytest.mark.parametrize("mode", list(REDUCTIONS), ids=lambda m: m.name)
@pytest.mark.parametrize("axes", [(1,), (0, 2)], ids=["row", "outer"])
def test_reduction(mode, axes, rng):
    if mode is og.ReductionMode.MUL and len(axes) > 1:
        axes = (1,)
    dims = [3, 4, 5]
    g = fgraph()
    x = g.tensor(dim=dims, name="x")
    out = [1 if a in axes else d for a, d in enumerate(dims)]
    y = g.reduction(g.mul(x, 1.5), mode=mode)
    y.set_dim(out).set_data_type(D)
    z = g.mul(y, y).set_output(True)  # a consumer, so dy is not just the incoming gradient
    check(g, z, x, lambda x: REDUCTIONS[mode](x * 1.5, list(axes)).reshape(out) ** 2, rng)


def test_max_reduction_with_float_output_recomputes_exactly(rng):
    g = fgraph()
    x = g.tensor(dim=[4, 6], name="x")
    y = g.reduction(x, mode=og.ReductionMode.MAX).set_dim([4, 1])  # FLOAT: not x's values exactly
    z = g.mul(y, 2.0).set_output(True)
    _, inputs, _, dys, grads = run_grad(g, z, x, rng)
    xv = inputs[x.uid]
    want = np.where(xv == xv.max(axis=1, keepdims=True), 2.0 * dys[z.uid], 0.0)
    np.testing.assert_allclose(grads[x.uid], want, rtol=1e-12)


def test_mul_no_zeros(rng):
    g = fgraph()
    x = g.tensor(dim=[3, 4], name="x")
    y = g.reduction(x, mode=og.ReductionMode.MUL_NO_ZEROS).set_dim([3, 1]).set_data_type(D).set_output(True)

    def prep(p):
        p["x"][0, 1] = 0.0

    _, inputs, _, dys, grads = run_grad(g, y, x, rng, prepare=prep)
    xv = inputs[x.uid]
    nz = np.where(xv == 0, 1.0, xv)
    want = np.where(xv == 0, 0.0, dys[y.uid] * nz.prod(axis=1, keepdims=True) / nz)
    np.testing.assert_allclose(grads[x.uid], want, rtol=1e-12)


def test_full_reduction_to_scalar_then_broadcast(rng):
    g = fgraph()
    x = g.tensor(dim=[3, 4], name="x")
    m = g.reduction(x, mode=og.ReductionMode.AVG).set_dim([1, 1]).set_data_type(D)
    y = g.sub(x, m).set_output(True)  # the centering of a layernorm
    check(g, y, x, lambda x: x - x.mean(), rng)


def test_genstats(rng):
    g = fgraph()
    x = image(g, [2, 3, 2, 2], "x", NHWC)
    s, sq = g.genstats(x)
    s.set_data_type(D).set_output(True)
    sq.set_data_type(D).set_output(True)
    check(g, [s, sq], x, lambda x: (x.sum(dim=(0, 2, 3), keepdim=True), (x * x).sum(dim=(0, 2, 3), keepdim=True)), rng)


# -- matmul ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["plain", "batched", "broadcast_a", "broadcast_b", "transposed"])
def test_matmul(case, rng):
    g = fgraph()
    a_dim, b_dim = {
        "plain": ([3, 4], [4, 5]),
        "batched": ([2, 3, 4], [2, 4, 5]),
        "broadcast_a": ([1, 3, 4], [3, 4, 5]),
        "broadcast_b": ([2, 3, 4], [1, 4, 5]),
        "transposed": ([2, 3, 4], [2, 4, 5]),
    }[case]
    a = g.tensor(dim=a_dim, name="a")
    b_stride = [20, 1, 4] if case == "transposed" else None  # B column-major
    b = g.tensor(dim=b_dim, stride=b_stride, name="b")
    y = g.matmul(a, b).set_output(True)
    check(g, y, [a, b], lambda a, b: a @ b, rng)


def test_linear_layer_with_bias_and_gelu(rng):
    g = fgraph()
    x = g.tensor(dim=[4, 6], name="x")
    w = g.tensor(dim=[6, 3], name="w")
    bias = g.tensor(dim=[1, 3], name="bias")
    y = g.gelu(g.add(g.matmul(x, w), bias)).set_output(True)
    check(g, y, [x, w, bias], lambda x, w, bias: F.gelu(x @ w + bias), rng)


# -- convolutions ------------------------------------------------------------------------------------------------------

CONVS = {
    "basic": dict(x=[2, 3, 5, 5], w=[4, 3, 3, 3], padding=1),
    "stride2": dict(x=[2, 3, 6, 6], w=[4, 3, 3, 3], padding=1, stride=2),
    "stride_remainder": dict(x=[1, 2, 7, 6], w=[3, 2, 2, 2], stride=3),
    "asym_pad": dict(x=[1, 2, 5, 4], w=[3, 2, 3, 2], pre_padding=[2, 0], post_padding=[0, 1]),
    "dilation": dict(x=[1, 2, 7, 7], w=[2, 2, 3, 3], padding=2, dilation=2),
    "groups": dict(x=[2, 4, 5, 5], w=[6, 2, 3, 3], padding=1),
    "depthwise": dict(x=[2, 4, 5, 5], w=[4, 1, 3, 3], padding=1, stride=2),
    "conv1d": dict(x=[2, 3, 7], w=[4, 3, 3], padding=1, stride=2),
    "conv3d": dict(x=[1, 2, 3, 4, 4], w=[3, 2, 2, 3, 3], padding=1),
    "convolution_mode": dict(x=[1, 2, 5, 5], w=[3, 2, 3, 2], padding=1, convolution_mode="convolution"),
}


def _torch_conv(x, w, cfg):
    nsp = x.dim() - 2
    pre = cfg.get("pre_padding", [cfg.get("padding", 0)] * nsp)
    post = cfg.get("post_padding", [cfg.get("padding", 0)] * nsp)
    x = F.pad(x, [p for a in reversed(range(nsp)) for p in (pre[a], post[a])])
    if cfg.get("convolution_mode") == "convolution":
        w = torch.flip(w, dims=list(range(2, w.dim())))
    conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nsp]
    return conv(x, w, stride=cfg.get("stride", 1), dilation=cfg.get("dilation", 1), groups=x.shape[1] // w.shape[1])


@pytest.mark.parametrize("layout", ["nchw", NHWC])
@pytest.mark.parametrize("name", list(CONVS))
def test_conv(name, layout, rng):
    cfg = dict(CONVS[name])
    if layout == NHWC and len(cfg["x"]) != 4:
        pytest.skip("NHWC is a 2-D layout")
    g = fgraph()
    x = image(g, cfg.pop("x"), "x", layout)
    w = image(g, cfg.pop("w"), "w", layout)
    y = g.conv_fprop(x, w, **cfg).set_output(True)
    check(g, y, [x, w], lambda x, w: _torch_conv(x, w, CONVS[name]), rng)


def test_conv_dgrad_and_wgrad_are_differentiable(rng):
    """Double backward: the gradients of dgrad / wgrad (adjoints of the forward conv)."""
    g = fgraph()
    dy = g.tensor(dim=[2, 4, 3, 3], name="dy")
    w = g.tensor(dim=[4, 3, 3, 3], name="w")
    x = g.tensor(dim=[2, 3, 6, 6], name="x")
    dx = g.conv_dgrad(dy, w, padding=1, stride=2).set_dim([2, 3, 6, 6]).set_output(True)
    dw = g.conv_wgrad(x, dy, padding=1, stride=2).set_dim([4, 3, 3, 3]).set_output(True)

    def fn(dy, w, x):
        dx = torch.nn.grad.conv2d_input([2, 3, 6, 6], w, dy, stride=2, padding=1)
        dw = torch.nn.grad.conv2d_weight(x, [4, 3, 3, 3], dy, stride=2, padding=1)
        return dx, dw

    check(g, [dx, dw], [dy, w, x], fn, rng)


# -- normalizations ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["nchw", NHWC])
@pytest.mark.parametrize("stats", ["saved", "recomputed"])
def test_batchnorm_training(layout, stats, rng):
    g = fgraph()
    x = image(g, [3, 4, 3, 2], "x", layout)
    scale = g.tensor(dim=[1, 4, 1, 1], name="scale")
    bias = g.tensor(dim=[1, 4, 1, 1], name="bias")
    rm = g.tensor(dim=[1, 4, 1, 1], name="rm")
    rv = g.tensor(dim=[1, 4, 1, 1], name="rv")
    y, mean, inv, nrm, nrv = g.batchnorm(x, scale, bias, rm, rv, epsilon=1e-3, momentum=0.1)
    for t in (mean, inv, nrm, nrv):
        t.set_data_type(D).set_output(True)
    if stats == "recomputed":  # an op without stats outputs: backward with epsilon
        g = fgraph()
        x = image(g, [3, 4, 3, 2], "x", layout)
        scale = g.tensor(dim=[1, 4, 1, 1], name="scale")
        bias = g.tensor(dim=[1, 4, 1, 1], name="bias")
        y = g._add_op(Batchnorm(), [x, scale, bias, None, None, 1e-3, None], outputs=["y"])[0]
    y = g.relu(y).set_output(True)
    res = check(
        g,
        y,
        [x, scale, bias],
        lambda x, scale, bias, **_: F.relu(
            F.batch_norm(x, None, None, scale.reshape(-1), bias.reshape(-1), training=True, eps=1e-3)
        ),
        rng,
    )
    if stats == "saved":
        assert {mean.uid, inv.uid} <= set(res.saved)


def test_batchnorm_gradient_into_running_stats_is_an_error():
    g = fgraph()
    x = g.tensor(dim=[3, 4, 2, 2], name="x")
    scale, bias = g.tensor(dim=[1, 4, 1, 1], name="scale"), g.tensor(dim=[1, 4, 1, 1], name="bias")
    y, mean, inv, _, _ = g.batchnorm(x, scale, bias, epsilon=1e-3)
    y.set_output(True)
    inv.set_output(True)
    loss = g.mul(mean, 2.0).set_output(True)
    with pytest.raises(og.UnsupportedGraphError) as err:
        grad(g, [y, loss], [x])
    assert err.value.rule == "autodiff.output" and "mean" in str(err.value)


def test_batchnorm_inference(rng):
    g = fgraph()
    x = image(g, [2, 3, 2, 2], "x", NHWC)
    names = ("mean", "inv", "scale", "bias")
    mean, inv, scale, bias = (g.tensor(dim=[1, 3, 1, 1], name=n) for n in names)
    y = g.batchnorm_inference(x, mean, inv, scale, bias).set_output(True)
    check(g, y, [x, mean, inv, scale, bias], lambda x, mean, inv, scale, bias: (x - mean) * inv * scale + bias, rng)


def _torch_norm(x, axes, eps, scale=None, bias=None, center=True):
    mean = x.mean(dim=axes, keepdim=True) if center else 0.0
    xc = x - mean
    y = xc * torch.rsqrt((xc * xc).mean(dim=axes, keepdim=True) + eps)
    if scale is not None:
        y = y * scale
    return y if bias is None else y + bias


@pytest.mark.parametrize("variant", ["rows", "image", "no_scale", "inference", "no_affine"])
def test_layernorm(variant, rng):
    g = fgraph()
    dims, sdim, axes = ([4, 6], [1, 6], [1]) if variant != "image" else ([2, 3, 2, 2], [1, 3, 2, 2], [1, 2, 3])
    x = g.tensor(dim=dims, name="x")
    scale = None if variant in ("no_scale", "no_affine") else g.tensor(dim=sdim, name="scale")
    bias = None if variant == "no_affine" else g.tensor(dim=sdim, name="bias")
    phase = og.NormForwardPhase.INFERENCE if variant == "inference" else og.NormForwardPhase.TRAINING
    outs = g.layernorm(phase, x, scale, bias, epsilon=1e-4)
    for t in outs[1:]:
        if t is not None:
            t.set_data_type(D).set_output(True)
    y = g.mul(outs[0], g.exp(x)).set_output(True)
    wrt = [t for t in (x, scale, bias) if t is not None]
    check(g, y, wrt, lambda x, scale=None, bias=None: _torch_norm(x, axes, 1e-4, scale, bias) * torch.exp(x), rng)


@pytest.mark.parametrize("variant", ["bias", "no_bias", "inference"])
def test_rmsnorm(variant, rng):
    g = fgraph()
    x = g.tensor(dim=[4, 6], name="x")
    scale = g.tensor(dim=[1, 6], name="scale")
    bias = g.tensor(dim=[1, 6], name="bias") if variant != "no_bias" else None
    phase = og.NormForwardPhase.INFERENCE if variant == "inference" else og.NormForwardPhase.TRAINING
    y, inv = g.rmsnorm(phase, x, scale, bias, epsilon=1e-4)
    if inv is not None:
        inv.set_data_type(D).set_output(True)
    y = g.tanh(y).set_output(True)
    wrt = [t for t in (x, scale, bias) if t is not None]
    check(g, y, wrt, lambda x, scale, bias=None: torch.tanh(_torch_norm(x, [1], 1e-4, scale, bias, center=False)), rng)


@pytest.mark.parametrize("phase", [og.NormForwardPhase.TRAINING, og.NormForwardPhase.INFERENCE], ids=lambda p: p.name)
def test_instancenorm(phase, rng):
    g = fgraph()
    x = image(g, [2, 3, 3, 2], "x", NHWC)
    scale, bias = g.tensor(dim=[1, 3, 1, 1], name="scale"), g.tensor(dim=[1, 3, 1, 1], name="bias")
    y, mean, inv = g.instancenorm(phase, x, scale, bias, epsilon=1e-4)
    for t in (mean, inv):
        if t is not None:
            t.set_data_type(D).set_output(True)
    y.set_output(True)
    check(g, y, [x, scale, bias], lambda x, scale, bias: _torch_norm(x, [2, 3], 1e-4, scale, bias), rng)


# -- pooling -----------------------------------------------------------------------------------------------------------

POOLS = {
    "max": dict(mode="max", window=[2, 2], stride=[2, 2]),
    "max_overlap_pad": dict(mode="max", window=[3, 3], stride=[2, 2], padding=1),
    "max_asym": dict(mode="max", window=[3, 2], stride=[1, 2], pre_padding=[2, 0], post_padding=[0, 1]),
    "avg_include": dict(mode="avg_include_padding", window=[3, 3], stride=[2, 2], padding=1),
    "avg_exclude": dict(mode="avg_exclude_padding", window=[3, 3], stride=[2, 2], padding=1),
    "avg_exclude_asym": dict(
        mode="avg_exclude_padding", window=[2, 3], stride=[1, 2], pre_padding=[1, 2], post_padding=[0, 1]
    ),
    "max_1d": dict(mode="max", window=[3], stride=[2], padding=1),
    "avg_3d": dict(mode="avg_include_padding", window=[2, 2, 2], stride=[1, 2, 2]),
}


def _torch_pool(x, cfg):
    nsp = x.dim() - 2
    pre = cfg.get("pre_padding", [cfg.get("padding", 0)] * nsp)
    post = cfg.get("post_padding", [cfg.get("padding", 0)] * nsp)
    pads = [p for a in reversed(range(nsp)) for p in (pre[a], post[a])]
    w, s = cfg["window"], cfg["stride"]
    maxp = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[nsp]
    avgp = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[nsp]
    if cfg["mode"] == "max":
        return maxp(F.pad(x, pads, value=-math.inf), w, s)
    total = avgp(F.pad(x, pads), w, s)
    if cfg["mode"] == "avg_include_padding":
        return total
    return total / avgp(F.pad(torch.ones_like(x), pads), w, s)


@pytest.mark.parametrize("layout", ["nchw", NHWC])
@pytest.mark.parametrize("name", list(POOLS))
def test_resample(name, layout, rng):
    cfg = POOLS[name]
    nsp = len(cfg["window"])
    if layout == NHWC and nsp != 2:
        pytest.skip("NHWC is a 2-D layout")
    g = fgraph()
    x = image(g, [2, 3, *([5, 6, 5][:nsp])], "x", layout)
    kw = {k: v for k, v in cfg.items() if k != "mode"}
    y, _ = g.resample(g.mul(x, 1.0), mode=cfg["mode"], **kw)
    y = g.mul(y, y).set_output(True)
    check(g, y, x, lambda x: _torch_pool(x, cfg) ** 2, rng)


def test_max_pool_tie_goes_to_the_first_maximum(rng):
    g = fgraph()
    x = g.tensor(dim=[1, 1, 2, 2], name="x")
    y = g.resample(x, mode="max", window=[2, 2])[0].set_output(True)
    _, _, _, dys, grads = run_grad(g, y, x, rng, prepare=lambda p: p["x"].__setitem__(..., 1.0))
    assert grads[x.uid].ravel().tolist() == [float(dys[y.uid].ravel()[0]), 0.0, 0.0, 0.0]


@pytest.mark.parametrize("layout", ["nchw", NHWC])
@pytest.mark.parametrize("name", [n for n, c in POOLS.items() if c["mode"] == "max"] + ["max_3d"])
def test_max_pool_backward_torch_implementation_matches_the_reference(name, layout, rng):
    """The op's PyTorch mapping (aten's pooling kernels where the padding is symmetric, autograd
    otherwise) against its NumPy reference, ties included."""
    from opgraph.ops.pooling_backward import ResampleMaxBackward

    cfg = POOLS.get(name, dict(mode="max", window=[3, 3, 3], stride=[2, 2, 2], padding=1))
    nsp = len(cfg["window"])
    if layout == NHWC and nsp != 2:
        pytest.skip("NHWC is a 2-D layout")
    pre = cfg.get("pre_padding", [cfg.get("padding", 0)] * nsp)
    post = cfg.get("post_padding", [cfg.get("padding", 0)] * nsp)
    op = ResampleMaxBackward(
        window=tuple(cfg["window"]), stride=tuple(cfg["stride"]), pre_padding=tuple(pre), post_padding=tuple(post)
    )
    x = np.round(rng.uniform(-2, 2, size=[2, 3, *([7, 6, 5][:nsp])]) * 2) / 2  # ties
    w, s = op.window, op.stride
    out = [(d + a + b - k) // st + 1 for d, a, b, k, st in zip(x.shape[2:], pre, post, w, s)]
    dy = rng.uniform(-1, 1, size=[2, 3, *out])
    xt = torch.from_numpy(x)
    if layout == NHWC:
        xt = xt.to(memory_format=torch.channels_last)
    got = _torch_mapping(op, [torch.from_numpy(dy), xt], x.shape)
    np.testing.assert_allclose(got, op.reference([dy, x], [None])[0], rtol=0, atol=1e-12)


def _torch_mapping(op, tensors, out_dims):
    """The torch engine's mapping of `op` run on float64 `tensors` (one node, its inputs bound)."""
    from opgraph.engines.torch_engine import IMPLS
    from opgraph.engines.torch_engine.common import Call

    g = og.Graph("one", io_data_type=og.DataType.DOUBLE, compute_data_type=og.DataType.DOUBLE)
    ins = [g.tensor(dim=list(t.shape), stride=list(t.stride()), name=f"in{i}") for i, t in enumerate(tensors)]
    (out,) = g._add_op(op, ins, name="op")
    out.set_output(True).set_dim(list(out_dims))
    (node,) = g.final.nodes
    values = {t.uid: v for t, v in zip(ins, tensors)}
    return IMPLS[node.kind](Call(node, g.final.tensors, values, torch.device("cpu")))[0].numpy()


# -- layout ops --------------------------------------------------------------------------------------------------------


def test_reshape_transpose(rng):
    g = fgraph()
    x = g.tensor(dim=[2, 3, 4], name="x")
    y = g.transpose(g.reshape(g.exp(x), [6, 4]), [1, 0])
    z = g.mul(y, y).set_output(True)
    check(g, z, x, lambda x: torch.exp(x).reshape(6, 4).T ** 2, rng)


def test_transpose_of_a_broadcast_gradient(rng):
    g = fgraph()
    x = g.tensor(dim=[2, 3, 4], name="x")
    s = g.reduction(g.transpose(x, [2, 0, 1]), mode="add").set_dim([4, 1, 1]).set_data_type(D)
    y = g.mul(s, s).set_output(True)
    check(g, y, x, lambda x: x.permute(2, 0, 1).sum(dim=(1, 2), keepdim=True) ** 2, rng)


def test_slice_and_concatenate(rng):
    g = fgraph()
    x = g.tensor(dim=[4, 6], name="x")
    w = g.tensor(dim=[4, 2], name="w")
    part = g.slice(x, [slice(1, 4), slice(0, 6, 2)])  # [3, 3]
    cat = g.concatenate([g.exp(part), g.slice(w, [slice(0, 3)])], axis=1)  # [3, 5]
    y = g.mul(cat, cat).set_output(True)
    check(g, y, [x, w], lambda x, w: torch.cat([torch.exp(x[1:4, 0:6:2]), w[0:3]], dim=1) ** 2, rng)


def test_concatenate_of_broadcast_gradient(rng):
    g = fgraph()
    a, b = g.tensor(dim=[2, 3], name="a"), g.tensor(dim=[2, 2], name="b")
    s = g.reduction(g.concatenate([a, b], axis=1), mode="avg").set_dim([2, 1]).set_data_type(D).set_output(True)
    check(g, s, [a, b], lambda a, b: torch.cat([a, b], dim=1).mean(dim=1, keepdim=True), rng)


# -- finite differences ------------------------------------------------------------------------------------------------


def test_finite_differences_conv_relu(rng):
    g = fgraph()
    x = image(g, [1, 2, 4, 4], "x", NHWC)
    w = image(g, [3, 2, 3, 3], "w", NHWC)
    y = g.relu(g.conv_fprop(x, w, padding=1, stride=2)).set_output(True)
    check_fd(g, y, [x, w], rng)


def test_finite_differences_layernorm_and_maxpool(rng):
    g = fgraph()
    x = g.tensor(dim=[2, 2, 4, 4], name="x")
    scale, bias = g.tensor(dim=[1, 2, 4, 4], name="scale"), g.tensor(dim=[1, 2, 4, 4], name="bias")
    y, mean, inv = g.layernorm("training", x, scale, bias, epsilon=1e-3)
    mean.set_data_type(D).set_output(True)
    inv.set_data_type(D).set_output(True)
    y = g.resample(g.swish(y), mode="max", window=[2, 2])[0].set_output(True)
    check_fd(g, y, [x, scale, bias], rng)


def test_finite_differences_batchnorm_matmul(rng):
    g = fgraph()
    x = g.tensor(dim=[4, 3, 2, 1], name="x")
    scale, bias = g.tensor(dim=[1, 3, 1, 1], name="scale"), g.tensor(dim=[1, 3, 1, 1], name="bias")
    y = g._add_op(Batchnorm(), [x, scale, bias, None, None, 1e-3, None], outputs=["y"])[0]
    w = g.tensor(dim=[6, 5], name="w")
    z = g.matmul(g.reshape(y, [4, 6]), w).set_output(True)
    check_fd(g, z, [x, scale, bias, w], rng)


# -- a small CNN end to end --------------------------------------------------------------------------------------------


def small_cnn(layout: str, n: int = 2, c: int = 3, hw: int = 6, k: int = 4, classes: int = 5):
    """conv -> batchnorm -> relu -> max pool -> flatten -> linear + bias -> softmax cross-entropy (mean)."""
    g = fgraph("cnn")
    x = image(g, [n, c, hw, hw], "x", layout)
    w = image(g, [k, c, 3, 3], "w", layout)
    scale, bias = g.tensor(dim=[1, k, 1, 1], name="bn_scale"), g.tensor(dim=[1, k, 1, 1], name="bn_bias")
    fc_w = g.tensor(dim=[k * (hw // 2) ** 2, classes], name="fc_w")
    fc_b = g.tensor(dim=[1, classes], name="fc_b")
    onehot = g.tensor(dim=[n, classes], name="onehot")
    h = g.conv_fprop(x, w, padding=1)
    h, mean, inv, _, _ = g.batchnorm(h, scale, bias, epsilon=1e-5)
    mean.set_data_type(D).set_output(True)
    inv.set_data_type(D).set_output(True)
    h = g.resample(g.relu(h).set_name("act"), mode="max", window=[2, 2])[0]
    h = g.reshape(h, [n, k * (hw // 2) ** 2])
    z = g.add(g.matmul(h, fc_w), fc_b)
    m = g.reduction(z, mode="max").set_dim([n, 1]).set_data_type(D)
    lse = g.add(g.log(g.reduction(g.exp(g.sub(z, m)), mode="add").set_dim([n, 1]).set_data_type(D)), m)
    picked = g.reduction(g.mul(z, onehot), mode="add").set_dim([n, 1]).set_data_type(D)
    loss = g.reduction(g.sub(lse, picked), mode="avg").set_dim([1, 1]).set_data_type(D).set_output(True)
    loss.set_name("loss")
    return g, loss, [x, w, scale, bias, fc_w, fc_b]


def _torch_cnn(x, w, bn_scale, bn_bias, fc_w, fc_b, onehot):
    h = F.conv2d(x, w, padding=1)
    h = F.batch_norm(h, None, None, bn_scale.reshape(-1), bn_bias.reshape(-1), training=True, eps=1e-5)
    h = F.max_pool2d(F.relu(h), 2).reshape(x.shape[0], -1)
    z = h @ fc_w + fc_b
    return F.cross_entropy(z, onehot.argmax(dim=1)).reshape(1, 1)


def _labels(p):
    p["onehot"][...] = np.eye(p["onehot"].shape[1])[np.arange(p["onehot"].shape[0]) % p["onehot"].shape[1]]


@pytest.mark.parametrize("layout", ["nchw", NHWC])
@pytest.mark.parametrize("combined", [False, True], ids=["split", "combined"])
def test_small_cnn_end_to_end(layout, combined, rng):
    g, loss, params = small_cnn(layout)
    res = check(g, loss, params, _torch_cnn, rng, combined=combined, prepare=_labels, rtol=1e-8)
    if not combined:
        # the relu output (read by max pool backward) is recomputed from the saved batchnorm output
        act = res.forward.tensor("act").uid
        assert act in res.recomputed and act not in res.must_keep


# -- the save / recompute policy ---------------------------------------------------------------------------------------


def _conv_relu_conv(g):
    x = g.tensor(dim=[1, 2, 5, 5], name="x")
    w1, w2 = g.tensor(dim=[3, 2, 3, 3], name="w1"), g.tensor(dim=[2, 3, 3, 3], name="w2")
    c1 = g.conv_fprop(x, w1, padding=1).set_name("c1")
    r = g.relu(c1).set_name("r")
    y = g.conv_fprop(r, w2, padding=1).set_output(True)
    return x, w1, w2, c1, r, y


def test_recompute_keeps_the_conv_output_and_recomputes_relu(rng):
    g = fgraph()
    x, w1, w2, c1, r, y = _conv_relu_conv(g)
    res = check(g, y, [x, w1, w2], lambda x, w1, w2: F.conv2d(F.relu(F.conv2d(x, w1, padding=1)), w2, padding=1), rng)
    assert res.must_keep == (c1.uid,)
    assert res.recomputed == (r.uid,)
    assert r.uid not in res.saved


def test_recompute_off_saves_everything_read(rng):
    g = fgraph()
    x, w1, w2, c1, r, y = _conv_relu_conv(g)
    res = check(
        g,
        y,
        [x, w1, w2],
        lambda x, w1, w2: F.conv2d(F.relu(F.conv2d(x, w1, padding=1)), w2, padding=1),
        rng,
        recompute=False,
    )
    assert set(res.must_keep) == {c1.uid, r.uid} and res.recomputed == ()


def test_bias_before_relu_is_saved_once():
    g = fgraph()
    x = g.tensor(dim=[1, 2, 5, 5], name="x")
    w1, w2 = g.tensor(dim=[3, 2, 3, 3], name="w1"), g.tensor(dim=[2, 3, 3, 3], name="w2")
    b = g.tensor(dim=[1, 3, 1, 1], name="b")
    pre = g.add(g.conv_fprop(x, w1, padding=1), b).set_name("pre")
    act = g.relu(pre).set_name("act")
    y = g.conv_fprop(act, w2, padding=1).set_output(True)
    res = grad(g, y, [x, w1, w2, b])
    assert res.must_keep == (pre.uid,) and res.recomputed == (act.uid,)


def test_pointwise_chain_from_inputs_is_recomputed_not_saved(rng):
    g = fgraph()
    x = g.tensor(dim=[1, 2, 4, 4], name="x")
    s, b = g.tensor(dim=[1, 2, 1, 1], name="s"), g.tensor(dim=[1, 2, 1, 1], name="b")
    w = g.tensor(dim=[3, 2, 3, 3], name="w")
    act = g.relu(g.add(g.mul(x, s), b))
    y = g.conv_fprop(act, w, padding=1).set_output(True)
    res = check(g, y, [x, s, b, w], lambda x, s, b, w: F.conv2d(F.relu(x * s + b), w, padding=1), rng)
    assert res.must_keep == () and len(res.recomputed) == 3


# -- API and errors ----------------------------------------------------------------------------------------------------


def test_uids_names_and_describe():
    g = fgraph()
    x = g.tensor(dim=[2, 3], name="x", uid=100)
    y = g.exp(x).set_output(True).set_name("y")
    res = grad(g, y, x)
    fg = g.final
    assert res.grad_input_of("y").name == "grad_y" and res.grad_of(x).name == "grad_x"
    bg = res.graph.final
    assert all(u > max(fg.tensors) for u in bg.tensors if u not in res.saved)
    assert x.uid in res.saved and bg.tensors[x.uid].name == "x"
    assert "grad_x" in res.describe()
    with pytest.raises(og.GraphError):
        res.grad_of(y)


def test_gradient_takes_the_wrt_tensor_type_and_layout():
    g = og.Graph("f", io_data_type=og.DataType.HALF)
    x = image(g, [2, 3, 4, 4], "x", NHWC)
    w = g.tensor(dim=[4, 3, 1, 1], name="w", data_type=og.DataType.FLOAT)
    y = g.conv_fprop(x, w).set_output(True)
    res = grad(g, y, [x, w])
    bg = res.graph.final
    gx, gw = bg.tensors[res.grads[x.uid].uid], bg.tensors[res.grads[w.uid].uid]
    assert gx.data_type is og.DataType.HALF and gx.stride == g.final.tensors[x.uid].stride
    assert gw.data_type is og.DataType.FLOAT


def test_unsupported_op_is_a_typed_error():
    g = fgraph()
    dy, x = g.tensor(dim=[2, 3], name="dy"), g.tensor(dim=[2, 3], name="x")
    y = g.relu_backward(dy, x).set_output(True)
    with pytest.raises(og.UnsupportedGraphError) as err:
        grad(g, y, dy)
    assert err.value.rule == "autodiff.no_rule" and "RELU_BWD" in str(err.value)


def test_integer_wrt_and_unknown_tensors_are_errors():
    g = fgraph()
    x = g.tensor(dim=[2, 3], name="x")
    i = g.tensor(dim=[2, 3], name="i", data_type=og.DataType.INT32)
    y = g.add(x, g.identity(i).set_data_type(D)).set_output(True)
    with pytest.raises(og.DataTypeError):
        grad(g, y, i)
    other = fgraph().tensor(dim=[1], name="o")
    with pytest.raises(og.GraphError):
        grad(g, y, other)
    with pytest.raises(og.GraphError):
        grad(g, y, "nope")


def test_keep_in_is_idempotent_and_rejects_another_graph():
    g = fgraph()
    _, w1, _, c1, _, y = _conv_relu_conv(g)
    res = grad(g, y, [w1])
    res.keep_in(g)
    res.keep_in(g)
    assert c1.uid in g.final.outputs and g.final.tensors[c1.uid].data_type is D
    with pytest.raises(og.GraphError):
        res.keep_in(fgraph())


def test_half_gradient_intermediates(rng):
    g = og.Graph("f", io_data_type=og.DataType.FLOAT)
    x, w = g.tensor(dim=[4, 8], name="x"), g.tensor(dim=[8, 4], name="w")
    y = g.tanh(g.matmul(x, w)).set_output(True)
    res = grad(g, y, [x, w], intermediate_data_type=og.DataType.HALF)
    bg = res.graph.final
    assert {bg.tensors[u].data_type for n in bg.nodes if n.kind == "pointwise" for u in n.output_uids()} == {
        og.DataType.HALF
    }  # (transposes keep their input's type)
    assert bg.tensors[res.grads[x.uid].uid].data_type is og.DataType.FLOAT
    check(
        g, y, [x, w], lambda x, w: torch.tanh(x @ w), rng, rtol=2e-2, atol=2e-2, intermediate_data_type=og.DataType.HALF
    )


def test_custom_op_gradient_rule(rng):
    og.register_custom_op("cube", num_inputs=1, pointwise=True, reference=lambda x: x**3)
    register_custom_grad(
        "cube",
        lambda ctx: {
            "input0": ctx.b.mul(
                ctx.grad("output0"), ctx.b.mul(ctx.b.mul(ctx.input("input0"), ctx.input("input0")), 3.0)
            )
        },
    )
    g = fgraph()
    x = g.tensor(dim=[3, 3], name="x")
    y = g.sin(g.custom("cube", x)).set_output(True)
    check(g, y, x, lambda x: torch.sin(x**3), rng)


@pytest.mark.parametrize("name", ["max_asym", "avg_exclude_asym", "avg_include", "max_1d"])
def test_pooling_backward_ops_torch_matches_reference(name, rng):
    """The torch mappings of the pooling backward ops against their references."""
    cfg = POOLS[name]
    nsp = len(cfg["window"])
    g = fgraph()
    x = g.tensor(dim=[2, 3, *([5, 6][:nsp])], name="x")
    kw = {k: v for k, v in cfg.items() if k != "mode"}
    y = g.resample(x, mode=cfg["mode"], **kw)[0].set_output(True)
    res = grad(g, y, x)
    (node,) = [n for n in res.graph.final.nodes if n.kind in ("resample_max_backward", "resample_avg_backward")]
    xv = rng.standard_normal(g.final.tensors[x.uid].dim)
    dy = rng.standard_normal(g.final.tensors[y.uid].dim)
    ins = [dy, xv][: len(node.op.input_roles())]
    want = node.op.reference(ins, [None])[0]
    got = _torch_mapping(node.op, [torch.tensor(a) for a in ins], xv.shape)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert node.kind == ("resample_max_backward" if cfg["mode"] == "max" else "resample_avg_backward")


def test_slice_backward_torch_matches_reference(rng):
    g = fgraph()
    x = g.tensor(dim=[4, 6], name="x")
    y = g.slice(x, [slice(1, 4), slice(0, 6, 2)]).set_output(True)
    (node,) = [n for n in grad(g, y, x).graph.final.nodes if n.kind == "slice_backward"]
    dy = rng.standard_normal((3, 3))
    got = _torch_mapping(node.op, [torch.tensor(dy)], (4, 6))
    np.testing.assert_array_equal(got, node.op.reference([dy], [None])[0])
    assert got[0].tolist() == [0.0] * 6 and got[1, ::2].tolist() == dy[0].tolist()


def test_backward_graph_round_trips_through_json():
    g = fgraph()
    x = g.tensor(dim=[1, 2, 4, 4], name="x")
    y = g.resample(g.slice(x, [slice(None), slice(None), slice(0, 4, 2)]), mode="max", window=[2, 2])[0]
    y.set_output(True)
    res = grad(g, y, x)
    text = res.graph.to_json()
    assert og.Graph.from_json(text).key() == res.graph.key()


# -- generated kernels: the backward graph on the Triton engine (interpreter) and on the GPU ---------------------------


@requires_interpreter
@pytest.mark.interpreter
def test_backward_graph_runs_on_triton_interpreter(rng):
    from ..helpers import assert_engine_close_l2, assert_engine_matches

    g = og.Graph("f", io_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[4, 8], name="x")
    s = g.tensor(dim=[1, 8], name="s")
    y = g.gelu(g.mul(x, s)).set_output(True)
    res = grad(g, y, [x, s])
    assert_engine_matches(res.graph, rng, engines=("triton",))


def _conv_bn_relu(dtype, n, c, hw):
    wide = D if dtype is D else og.DataType.FLOAT
    g = og.Graph("block", io_data_type=dtype, intermediate_data_type=wide)
    x = image(g, [n, c, hw, hw], "x", NHWC)
    w = image(g, [c, c, 3, 3], "w", NHWC)
    scale = g.tensor(dim=[1, c, 1, 1], name="scale", data_type=wide)
    bias = g.tensor(dim=[1, c, 1, 1], name="bias", data_type=wide)
    h, mean, inv, _, _ = g.batchnorm(g.conv_fprop(x, w, padding=1).set_name("conv"), scale, bias, epsilon=1e-5)
    mean.set_data_type(wide).set_output(True)
    inv.set_data_type(wide).set_output(True)
    y = g.relu(h.set_name("bn")).set_output(True)
    return g, y, [x, w, scale, bias]


def test_batchnorm_output_is_recomputed_from_the_saved_conv_output(rng):
    g, y, params = _conv_bn_relu(D, 2, 3, 4)
    fg = g.final
    res = grad(g, y, params)
    assert res.must_keep == (fg.tensor("conv").uid,)
    assert res.recomputed == (fg.tensor("bn").uid,)
    check(
        g,
        y,
        params,
        lambda x, w, scale, bias: F.relu(
            F.batch_norm(
                F.conv2d(x, w, padding=1), None, None, scale.reshape(-1), bias.reshape(-1), training=True, eps=1e-5
            )
        ),
        rng,
    )


@requires_interpreter
@pytest.mark.interpreter
def test_conv_bn_relu_backward_on_triton_interpreter(rng):
    """relu_backward + the recomputed batchnorm output + batchnorm_backward in one kernel, then
    dgrad and wgrad writing the fp16 gradients directly: three generated kernels."""
    from ..helpers import assert_engine_close_l2, assert_engine_matches

    g, y, params = _conv_bn_relu(og.DataType.HALF, 2, 8, 4)
    res = grad(g, y, params)
    assert_engine_matches(res.graph, rng, engines=("triton",), expect_steps=3)


@requires_interpreter
@pytest.mark.interpreter
def test_stem_backward_with_max_pool_runs_on_generated_kernels_alone(rng):
    """ResNet's stem (conv, batchnorm, relu, 3x3/2 max pool), fp16 NHWC: its backward graph builds with
    the generated kernels alone (the pool's backward custom op on the pool_backward template, which the
    torch engine ran before) and matches the reference engine."""
    from ..helpers import assert_engine_matches

    g, y, params = _conv_bn_relu(og.DataType.HALF, 2, 8, 6)
    pooled = g.resample(y.set_output(False), mode="max", window=[3, 3], stride=[2, 2], padding=1)[0]
    pooled.set_output(True)
    res = grad(g, pooled, params)
    plan = assert_engine_matches(
        res.graph,
        rng,
        engines=("triton",),
        prepare=lambda pack: [
            v.__setitem__(..., np.round(v * 4) / 4)
            for v in pack.values()
            if isinstance(v, np.ndarray) and v.dtype.kind == "f"
        ],
    )
    templates = [dict(step.config.knobs).get("template") for step in plan.steps]
    assert "pool_backward" in templates, plan.describe()


def _gpu_block(dtype):
    return _conv_bn_relu(dtype, 32, 64, 56)


@pytest.mark.gpu
@requires_cuda
def test_gpu_conv_bn_relu_backward(rng):
    """The backward graph of a ResNet block's conv-bn-relu, fp16 NHWC, on the GPU engines."""
    from ..helpers import assert_engine_close_l2, assert_engine_matches

    g, y, params = _gpu_block(og.DataType.HALF)
    res = grad(g, y, params)
    # fp16 gradients summed over 100k positions cancel: compare by relative L2 error (measured on an
    # H200 on 2026-11-22: elementwise errors of a few % where the sums cancel)
    assert_engine_close_l2(res.graph, rng, engines=("triton", "torch"), max_rel_l2=1e-2)


@pytest.mark.gpu
@requires_cuda
def test_gpu_mlp_backward(rng):
    from ..helpers import assert_engine_close_l2, assert_engine_matches

    g = og.Graph("mlp", io_data_type=og.DataType.BFLOAT16)
    x = g.tensor(dim=[4096, 1024], name="x")
    w = g.tensor(dim=[1024, 4096], name="w")
    b = g.tensor(dim=[1, 4096], name="b", data_type=og.DataType.FLOAT)
    y = g.gelu(g.add(g.matmul(x, w), b)).set_output(True)
    res = grad(g, y, [x, w, b])
    assert_engine_close_l2(res.graph, rng, engines=("triton", "torch"), max_rel_l2=2e-2)


def test_printing_a_grad_graph_is_a_short_summary():
    """print(og.grad(...)) dumped the forward graph and every handle (issue 20)."""
    g = og.Graph("mlp", io_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[8, 32], name="x")
    ws = [g.tensor(dim=[32, 32], name=f"w{i}") for i in range(12)]
    h = x
    for w in ws:
        h = g.gelu(g.matmul(h, w))
    y = h.set_output(True).set_name("y")
    gg = og.grad(g, [y], [x, *ws])
    text = str(gg)
    assert len(text) < 400, text
    assert text == repr(gg) and "'x'" in text and "and 7 more" in text and "'y'" in text
    assert f"{len(gg.graph._records)} ops" in text
