"""Pointwise ops: every mode through its builder against PyTorch float64 and against the formula of the
module docstring, then broadcasting, dtypes and casts, layouts, several outputs, DAGs and the rounding
of intermediates. Outputs are poisoned before every run."""

from __future__ import annotations

import math

import numpy as np
import pytest

import opgraph as og
from opgraph.ops.pointwise import PointwiseMode
from opgraph.testing import compare, empty_like_desc, poison, random_values
from opgraph.core.tensor import channels_last_order, packed_strides

torch = pytest.importorskip("torch")
F = torch.nn.functional
D = og.DataType
SHAPE = (2, 3, 4, 5)

# -- running a graph -----------------------------------------------------------------------------------


def strides(dim, layout):
    return packed_strides(dim, channels_last_order(len(dim))) if layout == "nhwc" else packed_strides(dim)


def make_input(desc, rng, domain):
    """Values of `desc`'s type and layout: uniform non-zero floats in (lo, hi), or integers with
    domain ("int", lo, hi) (zeros included: logical ops need them)."""
    arr = random_values(desc, rng)  # right layout and type
    if domain[0] == "int":
        vals = rng.integers(domain[1], domain[2] + 1, size=desc.dim).astype(np.float64)
    else:
        lo, hi = domain
        vals = rng.uniform(lo, hi, size=desc.dim)
        vals = np.where(np.abs(vals) < 1e-2, 0.5, vals)
    arr[...] = vals.astype(desc.data_type.numpy)
    return arr


def execute(g: og.Graph, feeds: dict, outputs: list) -> list[np.ndarray]:
    """Run g on the reference engine with `feeds` (handle -> array or number) and poisoned outputs.
    Integer and boolean outputs run twice with two different poisons, so an unwritten element is
    always caught."""
    final = g.final
    plan = g.build(device="cpu")
    results = None
    for flip in (False, True):
        pack = dict(feeds)
        outs = []
        for h in outputs:
            desc = final.tensors[h.uid]
            buf = poison(empty_like_desc(desc))
            if flip:
                buf[...] = False if buf.dtype == np.bool_ else (0 if np.issubdtype(buf.dtype, np.integer) else np.nan)
            pack[h] = buf
            outs.append(buf)
        plan.execute(pack)
        if results is None:
            results = outs
            if not any(o.dtype.kind in "biu" for o in outs):  # NaN poison is enough for floats
                break
        else:
            for a, b in zip(results, outs):
                np.testing.assert_array_equal(a, b)
    for h, o in zip(outputs, results):
        assert o.strides == tuple(s * o.dtype.itemsize for s in final.tensors[h.uid].stride)
    return results


def t64(a) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(np.asarray(a).astype(np.float64)))


def f64(a) -> np.ndarray:
    return np.asarray(a).astype(np.float64)


def vjp(f):
    """torch autograd: (dy, x) -> dy * f'(x)."""

    def grad(dy, x):
        x = x.clone().requires_grad_(True)
        (gx,) = torch.autograd.grad(f(x), x, dy)
        return gx

    return grad


# -- the table of modes ------------------------------------------------------------------------------------

U = (-2.0, 2.0)
POS = (0.1, 3.0)
AWAY = (0.5, 2.0)
SMALLINT = ("int", -2, 2)
BIT = ("int", -1, 1)
erf = np.vectorize(math.erf, otypes=[np.float64])
PHI = lambda x: 0.5 * (1.0 + erf(x / math.sqrt(2.0)))  # noqa: E731
phi = lambda x: np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)  # noqa: E731
sig = lambda x: 1.0 / (1.0 + np.exp(-x))  # noqa: E731
K = math.sqrt(2.0 / math.pi)


def relu_formula(x, lo=0.0, up=math.inf, slope=0.0):
    return np.where(x < lo, lo + slope * (x - lo), np.where(x > up, up, x))


def relu_bwd_formula(dy, x, lo=0.0, up=math.inf, slope=0.0):
    return dy * np.where(x <= lo, slope, np.where(x >= up, 0.0, 1.0))


def relu_torch(x, lo=0.0, up=math.inf, slope=0.0):
    return torch.where(x < lo, lo + slope * (x - lo), torch.clamp(x, max=up))


def gelu_tanh_formula(x):
    return 0.5 * x * (1.0 + np.tanh(K * (x + 0.044715 * x**3)))


def gelu_tanh_grad(x):
    t = np.tanh(K * (x + 0.044715 * x**3))
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * K * (1 + 3 * 0.044715 * x * x)


class M:
    """One mode: builder call, PyTorch float64 equivalent, the docstring formula, input domains."""

    def __init__(self, name, build, torch_fn, formula, domains=(U,), mode=None, out=None):
        self.name, self.build, self.torch_fn, self.formula = name, build, torch_fn, formula
        self.domains, self.mode, self.out = domains, mode, out


P = PointwiseMode
MODES = [
    # binary arithmetic
    M("add", lambda g, a, b: g.add(a=a, b=b), lambda a, b: a + b, lambda a, b: a + b, (U, U), P.ADD),
    M("sub", lambda g, a, b: g.sub(a, b), lambda a, b: a - b, lambda a, b: a - b, (U, U), P.SUB),
    M("mul", lambda g, a, b: g.mul(a, b), torch.mul, lambda a, b: a * b, (U, U), P.MUL),
    M("div", lambda g, a, b: g.div(a, b), torch.div, lambda a, b: a / b, (U, AWAY), P.DIV),
    M(
        "max",
        lambda g, a, b: g.max(input0=a, input1=b),
        torch.maximum,
        lambda a, b: np.where(a > b, a, b),
        (SMALLINT, SMALLINT),
        P.MAX,
    ),
    M(
        "min",
        lambda g, a, b: g.min(input0=a, input1=b),
        torch.minimum,
        lambda a, b: np.where(a < b, a, b),
        (SMALLINT, SMALLINT),
        P.MIN,
    ),
    M("pow", lambda g, a, b: g.pow(a, b), torch.pow, lambda a, b: np.exp(b * np.log(a)), (POS, U), P.POW),
    M("mod", lambda g, a, b: g.mod(a, b), torch.fmod, lambda a, b: a - np.trunc(a / b) * b, ((-5.0, 5.0), AWAY), P.MOD),
    M(
        "add_square",
        lambda g, a, b: g.add_square(a, b),
        lambda a, b: a + b * b,
        lambda a, b: a + b**2,
        (U, U),
        P.ADD_SQUARE,
    ),
    M("bias", lambda g, a, b: g.bias(input=a, bias=b), torch.add, lambda a, b: a + b, (U, U), P.ADD),
    M("scale", lambda g, a, b: g.scale(input=a, scale=b), torch.mul, lambda a, b: a * b, (U, U), P.MUL),
    # comparisons and logic (BOOLEAN)
    M(
        "cmp_eq",
        lambda g, a, b: g.cmp_eq(input=a, comparison=b),
        torch.eq,
        lambda a, b: a == b,
        (SMALLINT, SMALLINT),
        P.CMP_EQ,
        D.BOOLEAN,
    ),
    M(
        "cmp_neq",
        lambda g, a, b: g.cmp_neq(a, b),
        torch.ne,
        lambda a, b: a != b,
        (SMALLINT, SMALLINT),
        P.CMP_NEQ,
        D.BOOLEAN,
    ),
    M(
        "cmp_gt",
        lambda g, a, b: g.cmp_gt(a, b),
        torch.gt,
        lambda a, b: a > b,
        (SMALLINT, SMALLINT),
        P.CMP_GT,
        D.BOOLEAN,
    ),
    M(
        "cmp_ge",
        lambda g, a, b: g.cmp_ge(a, b),
        torch.ge,
        lambda a, b: a >= b,
        (SMALLINT, SMALLINT),
        P.CMP_GE,
        D.BOOLEAN,
    ),
    M(
        "cmp_lt",
        lambda g, a, b: g.cmp_lt(a, b),
        torch.lt,
        lambda a, b: a < b,
        (SMALLINT, SMALLINT),
        P.CMP_LT,
        D.BOOLEAN,
    ),
    M(
        "cmp_le",
        lambda g, a, b: g.cmp_le(a, b),
        torch.le,
        lambda a, b: a <= b,
        (SMALLINT, SMALLINT),
        P.CMP_LE,
        D.BOOLEAN,
    ),
    M(
        "logical_and",
        lambda g, a, b: g.logical_and(a, b),
        torch.logical_and,
        lambda a, b: (a != 0) & (b != 0),
        (BIT, BIT),
        P.LOGICAL_AND,
        D.BOOLEAN,
    ),
    M(
        "logical_or",
        lambda g, a, b: g.logical_or(a, b),
        torch.logical_or,
        lambda a, b: (a != 0) | (b != 0),
        (BIT, BIT),
        P.LOGICAL_OR,
        D.BOOLEAN,
    ),
    M(
        "logical_not",
        lambda g, a: g.logical_not(a),
        torch.logical_not,
        lambda a: a == 0,
        (BIT,),
        P.LOGICAL_NOT,
        D.BOOLEAN,
    ),
    M(
        "binary_select",
        lambda g, a, b, m: g.binary_select(input0=a, input1=b, mask=m),
        lambda a, b, m: torch.where(m != 0, a, b),
        lambda a, b, m: np.array([x if c else y for x, y, c in zip(a.flat, b.flat, m.flat)]).reshape(a.shape),
        (U, U, BIT),
        P.BINARY_SELECT,
    ),
    # unary
    M("identity", lambda g, a: g.identity(a), lambda a: a.clone(), lambda a: a, (U,), P.IDENTITY),
    M("sqrt", lambda g, a: g.sqrt(a), torch.sqrt, lambda a: a**0.5, (POS,), P.SQRT),
    M("rsqrt", lambda g, a: g.rsqrt(a), torch.rsqrt, lambda a: a**-0.5, (POS,), P.RSQRT),
    M("exp", lambda g, a: g.exp(a), torch.exp, lambda a: math.e**a, (U,), P.EXP),
    M("log", lambda g, a: g.log(a), torch.log, lambda a: np.log2(a) * math.log(2.0), (POS,), P.LOG),
    M("neg", lambda g, a: g.neg(a), torch.neg, lambda a: 0.0 - a, (U,), P.NEG),
    M("abs", lambda g, a: g.abs(a), torch.abs, lambda a: np.where(a < 0, -a, a), (U,), P.ABS),
    M("ceil", lambda g, a: g.ceil(a), torch.ceil, lambda a: -np.floor(-a), ((-3.0, 3.0),), P.CEIL),
    M("floor", lambda g, a: g.floor(a), torch.floor, lambda a: a - np.mod(a, 1.0), ((-3.0, 3.0),), P.FLOOR),
    M("reciprocal", lambda g, a: g.reciprocal(a), torch.reciprocal, lambda a: 1.0 / a, (U,), P.RECIPROCAL),
    M("sin", lambda g, a: g.sin(a), torch.sin, lambda a: np.cos(a - math.pi / 2), (U,), P.SIN),
    M("cos", lambda g, a: g.cos(a), torch.cos, lambda a: np.sin(a + math.pi / 2), (U,), P.COS),
    M("tan", lambda g, a: g.tan(a), torch.tan, lambda a: np.sin(a) / np.cos(a), ((-1.2, 1.2),), P.TAN),
    M("erf", lambda g, a: g.erf(a), torch.special.erf, lambda a: 2 * PHI(a * math.sqrt(2.0)) - 1, (U,), P.ERF),
    M(
        "tanh",
        lambda g, a: g.tanh(a),
        torch.tanh,
        lambda a: (np.exp(2 * a) - 1) / (np.exp(2 * a) + 1),
        (U,),
        P.TANH_FWD,
    ),
    M("sigmoid", lambda g, a: g.sigmoid(a), torch.sigmoid, sig, (U,), P.SIGMOID_FWD),
    M("elu", lambda g, a: g.elu(a), F.elu, lambda x: np.where(x > 0, x, np.exp(x) - 1), (U,), P.ELU_FWD),
    M(
        "elu_alpha",
        lambda g, a: g.elu(a, alpha=0.5),
        lambda x: F.elu(x, alpha=0.5),
        lambda x: np.where(x > 0, x, 0.5 * (np.exp(x) - 1)),
        (U,),
        P.ELU_FWD,
    ),
    M("gelu", lambda g, a: g.gelu(a), F.gelu, lambda x: x * PHI(x), (U,), P.GELU_FWD),
    M(
        "gelu_approx_tanh",
        lambda g, a: g.gelu_approx_tanh(a),
        lambda x: F.gelu(x, approximate="tanh"),
        gelu_tanh_formula,
        (U,),
        P.GELU_APPROX_TANH_FWD,
    ),
    M("softplus", lambda g, a: g.softplus(a), F.softplus, lambda x: np.log(1 + np.exp(x)), (U,), P.SOFTPLUS_FWD),
    M(
        "softplus_beta",
        lambda g, a: g.softplus(a, beta=2.0),
        lambda x: F.softplus(x, beta=2.0),
        lambda x: np.log(1 + np.exp(2 * x)) / 2,
        (U,),
        P.SOFTPLUS_FWD,
    ),
    M("swish", lambda g, a: g.swish(a), F.silu, lambda x: x * sig(x), (U,), P.SWISH_FWD),
    M(
        "swish_beta",
        lambda g, a: g.swish(a, swish_beta=1.7),
        lambda x: x * torch.sigmoid(1.7 * x),
        lambda x: x / (1 + np.exp(-1.7 * x)),
        (U,),
        P.SWISH_FWD,
    ),
    M("relu", lambda g, a: g.relu(a), F.relu, lambda x: relu_formula(x), (U,), P.RELU_FWD),
    M(
        "relu_clipped",
        lambda g, a: g.relu(input=a, negative_slope=0.1, lower_clip=-0.5, upper_clip=1.2),
        lambda x: relu_torch(x, -0.5, 1.2, 0.1),
        lambda x: relu_formula(x, -0.5, 1.2, 0.1),
        (U,),
        P.RELU_FWD,
    ),
    M(
        "relu6",
        lambda g, a: g.relu(a, upper_clip=6),
        F.relu6,
        lambda x: relu_formula(x, up=6.0),
        ((-9.0, 9.0),),
        P.RELU_FWD,
    ),
    M(
        "hardtanh",
        lambda g, a: g.relu(a, lower_clip=-1.0, upper_clip=1.0),
        F.hardtanh,
        lambda x: relu_formula(x, -1.0, 1.0),
        (U,),
        P.RELU_FWD,
    ),
    M(
        "leaky_relu",
        lambda g, a: g.leaky_relu(a, negative_slope=0.2),
        lambda x: F.leaky_relu(x, 0.2),
        lambda x: np.where(x > 0, x, 0.2 * x),
        (U,),
        P.RELU_FWD,
    ),
    # backward: (loss, input) -> loss * f'(input)
    M(
        "relu_backward",
        lambda g, dy, x: g.relu_backward(loss=dy, input=x),
        vjp(F.relu),
        lambda dy, x: relu_bwd_formula(dy, x),
        (U, U),
        P.RELU_BWD,
    ),
    M(
        "relu_backward_clipped",
        lambda g, dy, x: g.relu_backward(dy, x, negative_slope=0.1, lower_clip=-0.5, upper_clip=1.2),
        vjp(lambda x: relu_torch(x, -0.5, 1.2, 0.1)),
        lambda dy, x: relu_bwd_formula(dy, x, -0.5, 1.2, 0.1),
        (U, U),
        P.RELU_BWD,
    ),
    M(
        "leaky_relu_backward",
        lambda g, dy, x: g.leaky_relu_backward(dy, x, negative_slope=0.2),
        vjp(lambda x: F.leaky_relu(x, 0.2)),
        lambda dy, x: dy * np.where(x > 0, 1.0, 0.2),
        (U, U),
        P.RELU_BWD,
    ),
    M(
        "tanh_backward",
        lambda g, dy, x: g.tanh_backward(dy, x),
        vjp(torch.tanh),
        lambda dy, x: dy / np.cosh(x) ** 2,
        (U, U),
        P.TANH_BWD,
    ),
    M(
        "sigmoid_backward",
        lambda g, dy, x: g.sigmoid_backward(dy, x),
        vjp(torch.sigmoid),
        lambda dy, x: dy * np.exp(-x) / (1 + np.exp(-x)) ** 2,
        (U, U),
        P.SIGMOID_BWD,
    ),
    M(
        "elu_backward",
        lambda g, dy, x: g.elu_backward(dy, x),
        vjp(F.elu),
        lambda dy, x: dy * np.where(x > 0, 1.0, np.exp(x)),
        (U, U),
        P.ELU_BWD,
    ),
    M(
        "elu_backward_alpha",
        lambda g, dy, x: g.elu_backward(dy, x, alpha=0.5),
        vjp(lambda x: F.elu(x, 0.5)),
        lambda dy, x: dy * np.where(x > 0, 1.0, 0.5 * np.exp(x)),
        (U, U),
        P.ELU_BWD,
    ),
    M(
        "gelu_backward",
        lambda g, dy, x: g.gelu_backward(dy, x),
        vjp(F.gelu),
        lambda dy, x: dy * (PHI(x) + x * phi(x)),
        (U, U),
        P.GELU_BWD,
    ),
    M(
        "gelu_approx_tanh_backward",
        lambda g, dy, x: g.gelu_approx_tanh_backward(dy, x),
        vjp(lambda x: F.gelu(x, approximate="tanh")),
        lambda dy, x: dy * gelu_tanh_grad(x),
        (U, U),
        P.GELU_APPROX_TANH_BWD,
    ),
    M(
        "softplus_backward",
        lambda g, dy, x: g.softplus_backward(dy, x),
        vjp(F.softplus),
        lambda dy, x: dy / (1 + np.exp(-x)),
        (U, U),
        P.SOFTPLUS_BWD,
    ),
    M(
        "softplus_backward_beta",
        lambda g, dy, x: g.softplus_backward(dy, x, beta=2.0),
        vjp(lambda x: F.softplus(x, beta=2.0)),
        lambda dy, x: dy / (1 + np.exp(-2 * x)),
        (U, U),
        P.SOFTPLUS_BWD,
    ),
    M(
        "swish_backward",
        lambda g, dy, x: g.swish_backward(loss=dy, input=x),
        vjp(F.silu),
        lambda dy, x: dy * (sig(x) + x * sig(x) * (1 - sig(x))),
        (U, U),
        P.SWISH_BWD,
    ),
    M(
        "swish_backward_beta",
        lambda g, dy, x: g.swish_backward(dy, x, swish_beta=1.5),
        vjp(lambda x: x * torch.sigmoid(1.5 * x)),
        lambda dy, x: dy * (sig(1.5 * x) + 1.5 * x * sig(1.5 * x) * (1 - sig(1.5 * x))),
        (U, U),
        P.SWISH_BWD,
    ),
]
BY_NAME = {m.name: m for m in MODES}


def test_every_mode_is_covered():
    assert {m.mode for m in MODES} | {P.GEN_INDEX} == set(PointwiseMode)


def run_mode(m: M, rng, dtype: D, layout: str):
    g = og.Graph(io_data_type=dtype, intermediate_data_type=D.FLOAT)
    ins = []
    for i, dom in enumerate(m.domains):
        dt = D.BOOLEAN if (m.mode is P.BINARY_SELECT and i == 2) else None
        ins.append(g.tensor(dim=SHAPE, stride=strides(SHAPE, layout), name=f"in{i}", data_type=dt))
    y = m.build(g, *ins).set_output(True).set_name("y")
    final = g.final
    assert final.nodes[0].op.mode is m.mode
    feeds = {t: make_input(final.tensors[t.uid], rng, d) for t, d in zip(ins, m.domains)}
    (got,) = execute(g, feeds, [y])
    desc = final.tensors[y.uid]
    assert desc.data_type is (m.out or dtype)
    assert desc.stride == strides(SHAPE, layout)  # the output follows the input layout
    return desc, got, [f64(feeds[t]) for t in ins]


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("m", MODES, ids=lambda m: m.name)
def test_mode_against_torch_and_formula_f64(m, layout, rng):
    desc, got, xs = run_mode(m, rng, D.DOUBLE, layout)
    want_torch = m.torch_fn(*[t64(x) for x in xs]).to(torch.float64).numpy()
    want_formula = f64(m.formula(*xs))
    assert compare(desc, got, want_torch) is None, compare(desc, got, want_torch)
    assert compare(desc, got, want_formula) is None, compare(desc, got, want_formula)


@pytest.mark.parametrize("dtype", [D.FLOAT, D.HALF, D.BFLOAT16], ids=lambda d: d.name)
@pytest.mark.parametrize("m", [m for m in MODES if m.out is None], ids=lambda m: m.name)
def test_mode_low_precision(m, dtype, rng):
    """Inputs and output in a low-precision type: the float64 result rounded once."""
    desc, got, xs = run_mode(m, rng, dtype, "nhwc")
    want = m.torch_fn(*[t64(x) for x in xs]).to(torch.float64).numpy()
    assert compare(desc, got, want) is None, compare(desc, got, want)
    # exactly the float64 result rounded once to the type (bfloat16 through float32, see rounding.py)
    via = np.float32 if dtype is D.BFLOAT16 else np.float64
    exact = want.astype(via).astype(dtype.numpy).astype(np.float64)
    np.testing.assert_array_equal(f64(got), exact)


@pytest.mark.parametrize("axis", [0, 1, 2, 3])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_gen_index(axis, layout, rng):
    g = og.Graph(io_data_type=D.FLOAT)
    x = g.tensor(dim=SHAPE, stride=strides(SHAPE, layout), name="x")
    y = g.gen_index(input=x, axis=axis).set_output(True)
    z = g.gen_index(x, axis, compute_data_type=D.FLOAT, name="gf").set_output(True).set_data_type(D.FLOAT)
    feeds = {x: random_values(g.final.tensors[x.uid], rng)}
    got_i, got_f = execute(g, feeds, [y, z])
    assert g.final.tensors[y.uid].data_type is D.INT32 and got_i.dtype == np.int32
    shape = [1] * 4
    shape[axis] = SHAPE[axis]
    want = torch.arange(SHAPE[axis]).reshape(shape).expand(SHAPE).numpy()
    np.testing.assert_array_equal(got_i, want)
    np.testing.assert_array_equal(got_f, want.astype(np.float32))


# -- broadcasting ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_per_channel_broadcast(layout, rng):
    g = og.Graph(io_data_type=D.FLOAT)
    x = g.tensor(dim=SHAPE, stride=strides(SHAPE, layout), name="x")
    b = g.tensor(dim=[1, 3, 1, 1], name="b")
    s = g.tensor(dim=[1, 3, 1, 1], stride=[3, 1, 3, 3], name="s")  # per-channel, odd strides
    y = g.add(b, x).set_output(True)  # the broadcast operand first
    z = g.mul(g.bias(x, b), s).set_output(True)
    final = g.final
    assert final.tensors[y.uid].dim == SHAPE and final.tensors[y.uid].stride == strides(SHAPE, layout)
    feeds = {t: random_values(final.tensors[t.uid], rng) for t in (x, b, s)}
    got_y, got_z = execute(g, feeds, [y, z])
    X, B, S = (t64(feeds[t]) for t in (x, b, s))
    assert compare(final.tensors[y.uid], got_y, (B + X).numpy()) is None
    assert compare(final.tensors[z.uid], got_z, ((X + B) * S).numpy()) is None


def test_rows_and_columns_broadcast(rng):
    g = og.Graph(io_data_type=D.DOUBLE)
    r = g.tensor(dim=[4, 1], name="r")
    c = g.tensor(dim=[1, 6], name="c")
    y = g.sub(r, c).set_output(True)
    final = g.final
    assert final.tensors[y.uid].dim == (4, 6)
    feeds = {t: random_values(final.tensors[t.uid], rng) for t in (r, c)}
    (got,) = execute(g, feeds, [y])
    np.testing.assert_array_equal(got, (t64(feeds[r]) - t64(feeds[c])).numpy())


def test_scalars_every_way(rng):
    """A Python number (either side), a pass-by-value tensor, and 1-element tensors of any rank."""
    g = og.Graph(io_data_type=D.DOUBLE, intermediate_data_type=D.DOUBLE)
    x = g.tensor(dim=SHAPE, stride=strides(SHAPE, "nhwc"), name="x")
    pbv = g.tensor(dim=[1], name="pbv", is_pass_by_value=True)
    one = g.tensor(dim=[1], name="one")  # rank 1 against rank 4
    ones = g.tensor(dim=[1, 1, 1, 1, 1], name="ones")  # rank 5 against rank 4
    y_num = g.sub(2.5, x).set_output(True)
    y_num2 = g.div(x, 4).set_output(True)
    y_pbv = g.mul(x, pbv).set_output(True)
    y_one = g.add(one, x).set_output(True)
    y_ones = g.pow(g.abs(x), ones).set_output(True)
    y_all = g.add(one, pbv).set_output(True)  # scalars only
    final = g.final
    for y in (y_num, y_num2, y_pbv, y_one, y_ones):
        assert final.tensors[y.uid].dim == SHAPE
    assert final.tensors[y_all.uid].numel == 1
    xv = random_values(final.tensors[x.uid], rng)
    feeds = {x: xv, pbv: -1.5, one: np.array([0.75]), ones: np.full((1, 1, 1, 1, 1), 2.0)}
    outs = execute(g, feeds, [y_num, y_num2, y_pbv, y_one, y_ones, y_all])
    X = f64(xv)
    for got, want in zip(outs, [2.5 - X, X / 4, X * -1.5, 0.75 + X, np.abs(X) ** 2, np.array([0.75 - 1.5])]):
        np.testing.assert_allclose(got.reshape(want.shape) if want.ndim == 1 else got, want, rtol=1e-13)


def test_scalar_parameters_as_tensors(rng):
    """relu's clips and swish's beta as pass-by-value and 1-element tensors read at run time."""
    g = og.Graph(io_data_type=D.DOUBLE)
    x = g.tensor(dim=[3, 7], name="x")
    up = g.tensor(dim=[1], name="up", is_pass_by_value=True)
    lo = g.tensor(dim=[1, 1], name="lo")
    slope = g.tensor(dim=[1], name="slope")
    beta = g.tensor(dim=[1], name="beta", is_pass_by_value=True)
    y = g.relu(x, negative_slope=slope, lower_clip=lo, upper_clip=up).set_output(True)
    z = g.swish(x, swish_beta=beta).set_output(True)
    dz = g.swish_backward(x, x, swish_beta=beta).set_output(True)
    xv = random_values(g.final.tensors[x.uid], rng)
    feeds = {x: xv, up: 1.25, lo: np.array([[-0.75]]), slope: np.array([0.3]), beta: np.float32(1.5)}
    got_y, got_z, got_dz = execute(g, feeds, [y, z, dz])
    X = t64(xv)
    np.testing.assert_allclose(got_y, relu_torch(X, -0.75, 1.25, 0.3).numpy(), rtol=1e-13)
    np.testing.assert_allclose(got_z, (X * torch.sigmoid(1.5 * X)).numpy(), rtol=1e-13)
    np.testing.assert_allclose(got_dz, vjp(lambda t: t * torch.sigmoid(1.5 * t))(X, X).numpy(), rtol=1e-12)


# -- dtypes and casts -------------------------------------------------------------------------------------


def test_mixed_input_types(rng):
    g = og.Graph(io_data_type=D.FLOAT)
    x = g.tensor(dim=SHAPE, data_type=D.HALF, name="x")
    b = g.tensor(dim=[1, 3, 1, 1], data_type=D.BFLOAT16, name="b")
    i = g.tensor(dim=SHAPE, data_type=D.INT8, name="i")
    y = g.add(g.mul(x, i), b).set_output(True)  # FLOAT (io type)
    z = g.mul(x, b).set_output(True).set_data_type(D.DOUBLE)
    final = g.final
    assert final.tensors[y.uid].data_type is D.FLOAT and final.tensors[z.uid].data_type is D.DOUBLE
    feeds = {t: random_values(final.tensors[t.uid], rng) for t in (x, b, i)}
    got_y, got_z = execute(g, feeds, [y, z])
    X, B, I_ = (t64(feeds[t]) for t in (x, b, i))
    want_y = (X * I_).to(torch.float32).double() + B  # the virtual product is FLOAT (intermediate type)
    assert compare(final.tensors[y.uid], got_y, want_y.numpy()) is None
    np.testing.assert_array_equal(got_z, (X * B).numpy())  # exact in double


@pytest.mark.parametrize("target", [D.HALF, D.BFLOAT16, D.FP8_E4M3, D.FP8_E5M2], ids=lambda d: d.name)
def test_identity_casts_floats(target, rng):
    g = og.Graph(io_data_type=D.FLOAT)
    x = g.tensor(dim=[4, 64], name="x")
    y = g.identity(x).set_output(True).set_data_type(target)
    xv = make_input(g.final.tensors[x.uid], rng, (-600.0, 600.0))
    xv[0, :4] = [1e30, -1e30, np.inf, np.nan]
    (got,) = execute(g, {x: xv}, [y])
    assert got.dtype == target.numpy
    want = torch.from_numpy(xv).to(target.to_torch()).to(torch.float64).numpy()
    np.testing.assert_array_equal(f64(got), want)  # bit for bit PyTorch's conversion


@pytest.mark.parametrize("target", [D.INT8, D.UINT8, D.INT32, D.BOOLEAN], ids=lambda d: d.name)
def test_identity_casts_saturate(target, rng):
    g = og.Graph(io_data_type=D.DOUBLE)
    x = g.tensor(dim=[64], name="x")
    y = g.identity(x).set_output(True).set_data_type(target)
    xv = rng.uniform(-400, 400, 64)
    xv[:10] = [0.5, 1.5, 2.5, -0.5, -2.5, 127.5, -128.5, 255.5, np.nan, 1e12]
    (got,) = execute(g, {x: xv}, [y])
    assert got.dtype == target.numpy
    if target is D.BOOLEAN:
        want = xv != 0
    else:
        info = np.iinfo(target.numpy)
        want = np.clip(np.trunc(np.nan_to_num(xv, nan=0.0)), info.min, info.max)  # toward zero, saturate
    np.testing.assert_array_equal(f64(got), f64(want))
    if target is D.INT8:
        assert got[:10].tolist() == [0, 1, 2, 0, -2, 127, -128, 127, 0, 127]


def test_comparison_type_can_be_overridden(rng):
    g = og.Graph(io_data_type=D.HALF)
    a = g.tensor(dim=[8], name="a")
    c = g.cmp_lt(a, 0.0).set_output(True)  # BOOLEAN even as a graph output
    f = g.cmp_lt(a, 0.0).set_output(True).set_data_type(D.FLOAT)
    final = g.final
    assert final.tensors[c.uid].data_type is D.BOOLEAN and final.tensors[f.uid].data_type is D.FLOAT
    av = make_input(final.tensors[a.uid], rng, U)
    got_c, got_f = execute(g, {a: av}, [c, f])
    np.testing.assert_array_equal(got_c, av < 0)
    np.testing.assert_array_equal(got_f, (av < 0).astype(np.float32))


# -- graphs of several pointwise ops ------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_dag_with_shared_virtual_intermediate_and_several_outputs(layout, rng):
    g = og.Graph(io_data_type=D.FLOAT, intermediate_data_type=D.FLOAT)
    x = g.tensor(dim=SHAPE, stride=strides(SHAPE, layout), name="x")
    b = g.tensor(dim=[1, 3, 1, 1], name="b")
    t = g.bias(x, b, name="t")  # virtual, read three times
    y1 = g.relu(t).set_output(True).set_name("y1")
    y2 = g.mul(t, t).set_output(True).set_name("y2")
    y3 = g.sub(g.tanh(t), g.sigmoid(y1)).set_output(True).set_name("y3").set_data_type(D.HALF)
    final = g.final
    assert final.tensors[t.uid].is_virtual and t.uid not in final.inputs + final.outputs
    assert set(final.outputs) == {y1.uid, y2.uid, y3.uid}
    feeds = {v: random_values(final.tensors[v.uid], rng) for v in (x, b)}
    g1, g2, g3 = execute(g, feeds, [y1, y2, y3])
    T = (t64(feeds[x]) + t64(feeds[b])).float().double()
    Y1 = torch.relu(T)
    assert compare(final.tensors[y1.uid], g1, Y1.numpy()) is None
    assert compare(final.tensors[y2.uid], g2, (T * T).numpy()) is None
    want3 = torch.tanh(T).float().double() - torch.sigmoid(Y1).float().double()
    assert compare(final.tensors[y3.uid], g3, want3.numpy()) is None


def test_intermediate_rounding_half(rng):
    """A virtual intermediate of type HALF is rounded to half before the next op reads it."""
    g = og.Graph(io_data_type=D.FLOAT, intermediate_data_type=D.HALF)
    x = g.tensor(dim=[16, 16], name="x")
    t = g.exp(x)  # virtual: HALF
    y = g.mul(t, 3.0).set_output(True)
    xv = make_input(g.final.tensors[x.uid], rng, U)
    assert g.final.tensors[t.uid].data_type is D.HALF
    (got,) = execute(g, {x: xv}, [y])
    want = (np.exp(f64(xv)).astype(np.float16).astype(np.float64) * 3.0).astype(np.float32)
    np.testing.assert_array_equal(got, want)
    unrounded = (np.exp(f64(xv)) * 3.0).astype(np.float32)
    assert not np.array_equal(unrounded, want)  # the check can tell the difference


def test_intermediate_rounding_declared_on_the_tensor(rng):
    g = og.Graph(io_data_type=D.DOUBLE, intermediate_data_type=D.DOUBLE)
    x = g.tensor(dim=[64], name="x")
    t = g.sigmoid(x).set_data_type(D.BFLOAT16)
    y = g.add(t, 0.0).set_output(True)
    xv = make_input(g.final.tensors[x.uid], rng, U)
    (got,) = execute(g, {x: xv}, [y])
    want = torch.sigmoid(t64(xv)).float().to(torch.bfloat16).double().numpy()
    np.testing.assert_array_equal(got, want)


# -- builders and validation ---------------------------------------------------------------------------------


def test_generic_pointwise_builder_matches_named_builders():
    def build(use_generic):
        g = og.Graph(name="p", io_data_type=D.FLOAT)
        x = g.tensor(dim=[4], name="x", uid=1)
        y = g.tensor(dim=[4], name="y", uid=2)
        if use_generic:
            a = g.pointwise(x, y, mode=P.ADD, name="n0")
            r = g.pointwise(a, mode="RELU_FWD", negative_slope=0.5, name="n1")
            i = g.pointwise(x, mode=P.GEN_INDEX, axis=0, name="n2")
        else:
            a = g.add(x, y, name="n0")
            r = g.relu(a, negative_slope=0.5, name="n1")
            i = g.gen_index(x, 0, name="n2")
        r.set_output(True).set_uid(3)
        i.set_output(True).set_uid(4)
        return g

    assert build(True).to_json() == build(False).to_json()


def test_names_and_compute_type():
    g = og.Graph(io_data_type=D.FLOAT)
    x = g.tensor(dim=[4], name="x")
    y = g.swish_backward(x, x, D.HALF, name="sb", swish_beta=2.0).set_output(True)
    z = g.max(x, y, compute_data_type=D.DOUBLE, name="mx").set_output(True)
    final = g.final
    assert [n.name for n in final.nodes] == ["sb", "mx"]
    assert [n.compute_data_type for n in final.nodes] == [D.HALF, D.DOUBLE]
    assert final.tensors[y.uid].name == "sb::output" and final.tensors[z.uid].name == "mx::output"


def test_bad_mode_and_params():
    g = og.Graph()
    x = g.tensor(dim=[4], name="x")
    with pytest.raises(og.AttributeValueError) as ei:
        g.pointwise(x, mode="FROBNICATE")
    assert ei.value.rule == "pointwise.mode"
    with pytest.raises(TypeError):
        g.pointwise(x, mode=P.EXP, negative_slope=1.0)
    with pytest.raises(TypeError):
        g.add(x)
    with pytest.raises(TypeError):
        g.add(x, x, c=1)


def test_gen_index_axis_rules():
    g = og.Graph()
    x = g.tensor(dim=[2, 3], name="x")
    for bad in ("1", 1.0, None, True):
        with pytest.raises(og.AttributeValueError) as ei:
            g.gen_index(x, bad)
        assert ei.value.rule == "pointwise.gen_index_axis"
    g.gen_index(x, axis=2, name="gi").set_output(True).set_name("idx").set_uid(9)
    with pytest.raises(og.AttributeValueError) as ei:
        g.validate()
    assert ei.value.rule == "pointwise.gen_index_axis" and "'idx' (uid 9)" in str(ei.value) and "'gi'" in str(ei.value)


def test_axis_only_for_gen_index():
    g = og.Graph()
    x = g.tensor(dim=[2, 3], name="x")
    g.pointwise(x, mode=P.EXP, axis=1, name="e").set_output(True)
    with pytest.raises(og.AttributeValueError) as ei:
        g.validate()
    assert ei.value.rule == "pointwise.axis" and "'e'" in str(ei.value)


# -- stop_gradient: a pointwise IDENTITY of its own kind -----------------------------------------------------


@pytest.mark.parametrize("engine", ["reference", "torch"])
def test_stop_gradient_is_the_identity_and_passes_no_gradient(engine):
    from opgraph.training import stop_gradient

    rng = np.random.default_rng(3)
    g = og.Graph("sg", io_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[3, 4], name="x")
    y = g.mul(g.exp(stop_gradient(g, x)), x).set_output(True).set_name("y")  # d/dx = exp(x), not (1 + x) exp(x)
    assert g.final.nodes[0].kind == "stop_gradient" and g.final.nodes[0].op.mode is PointwiseMode.IDENTITY
    res = og.grad(g, [y], [x], combined=True)
    plan = res.graph.build(device="cpu", engines=[engine])
    pack = og.testing.random_pack(plan.graph, rng)
    for u in plan.graph.outputs:
        pack[u][...] = np.nan
    pack[res.grad_inputs[y.uid].uid][...] = 1.0
    plan.execute(pack)
    xv = pack[x.uid].astype(np.float64)
    np.testing.assert_allclose(pack[y.uid], np.exp(xv) * xv, rtol=1e-6)
    np.testing.assert_allclose(pack[res.grads[x.uid].uid], np.exp(xv), rtol=1e-6)
    assert og.Graph.from_json(g.to_json()).key() == g.key()
