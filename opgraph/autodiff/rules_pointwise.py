"""Backward rules of the pointwise modes. x = input0, y = input1, z = output, dz = its gradient.

Each rule reads the forward *inputs* (never the output), as cuDNN's backward modes do: the value it
needs is recomputed from them inside the backward kernel (exp(x) for EXP, sqrt(x) for SQRT, ...),
so no pointwise output is saved just for its own backward.

    ADD dx = dz, dy = dz            SUB dx = dz, dy = -dz          MUL dx = dz*y, dy = dz*x
    DIV dx = dz/y, dy = -dz*x/y^2   POW dx = dz*y*x^(y-1), dy = dz*x^y*log(x)
    MAX / MIN  the gradient goes to the larger / smaller operand, half to each on a tie (PyTorch)
    MOD dx = dz, dy = -dz*trunc(x/y)   ADD_SQUARE dx = dz, dy = 2*dz*y
    BINARY_SELECT  d(input0) = mask ? dz : 0, d(input1) = mask ? 0 : dz; the mask gets none
    IDENTITY (a cast) dx = dz        NEG -dz          ABS dz*sign(x) (sign(0) = 0)
    EXP dz*exp(x)  LOG dz/x  SQRT dz*0.5/sqrt(x)  RSQRT -0.5*dz*rsqrt(x)/x  RECIPROCAL -dz/x^2
    SIN dz*cos(x)  COS -dz*sin(x)  TAN dz/cos(x)^2  ERF dz*2/sqrt(pi)*exp(-x^2)
    RELU_FWD (clips, slope) -> RELU_BWD with the same parameters; TANH, SIGMOID, ELU, GELU,
    GELU_APPROX_TANH, SOFTPLUS, SWISH -> their *_BWD modes (same parameters)
Comparisons, logical ops, CEIL, FLOOR and GEN_INDEX have zero gradient: no flow through them.
Parameters (clips, slopes, alpha, beta) get no gradient. stop_gradient (an IDENTITY of its own kind)
passes none by definition.
"""

from __future__ import annotations

import math

from ..ops.pointwise import PointwiseMode as M
from .rules import RuleContext, register_pointwise, register_rule

_ZERO_GRAD = (
    M.CMP_EQ,
    M.CMP_NEQ,
    M.CMP_GT,
    M.CMP_GE,
    M.CMP_LT,
    M.CMP_LE,
    M.LOGICAL_AND,
    M.LOGICAL_OR,
    M.LOGICAL_NOT,
    M.CEIL,
    M.FLOOR,
    M.GEN_INDEX,
)


@register_pointwise(*_ZERO_GRAD, inputs=())
def _zero(ctx: RuleContext):
    return {}  # never called: no input is differentiable


@register_rule("stop_gradient", inputs=())
def _stop_gradient(ctx: RuleContext):
    return {}  # never called: no gradient flows through it


def _both(ctx: RuleContext, dx, dy):
    out = {}
    if ctx.needs("input0"):
        out["input0"] = dx() if callable(dx) else dx
    if ctx.needs("input1"):
        out["input1"] = dy() if callable(dy) else dy
    return out


@register_pointwise(M.ADD)
def _add(ctx):
    dz = ctx.grad("output")
    return _both(ctx, dz, dz)


@register_pointwise(M.SUB)
def _sub(ctx):
    dz, b = ctx.grad("output"), ctx.b
    return _both(ctx, dz, lambda: b.neg(dz))


@register_pointwise(M.MUL)
def _mul(ctx):
    dz, b = ctx.grad("output"), ctx.b
    return _both(ctx, lambda: b.mul(dz, ctx.input("input1")), lambda: b.mul(dz, ctx.input("input0")))


@register_pointwise(M.DIV)
def _div(ctx):
    dz, b = ctx.grad("output"), ctx.b
    y = ctx.input("input1")
    t = b.div(dz, y)
    return _both(ctx, t, lambda: b.neg(b.div(b.mul(t, ctx.input("input0")), y)))


@register_pointwise(M.ADD_SQUARE)
def _add_square(ctx):
    dz, b = ctx.grad("output"), ctx.b
    return _both(ctx, dz, lambda: b.mul(b.mul(dz, ctx.input("input1")), 2.0))


@register_pointwise(M.MAX, M.MIN)
def _max_min(ctx):
    dz, b = ctx.grad("output"), ctx.b
    x, y = ctx.input("input0"), ctx.input("input1")
    wins = M.CMP_GT if ctx.node.op.mode is M.MAX else M.CMP_LT
    # weight of x: 1 where it wins, 1/2 on a tie, 0 where it loses; y gets the rest
    w = b.select(1.0, b.select(0.5, 0.0, b.mask(M.CMP_EQ, x, y)), b.mask(wins, x, y))
    dx = b.mul(dz, w)
    return _both(ctx, dx, lambda: b.sub(dz, dx))


@register_pointwise(M.POW)
def _pow(ctx):
    dz, b = ctx.grad("output"), ctx.b
    x, y = ctx.input("input0"), ctx.input("input1")
    return _both(
        ctx,
        lambda: b.mul(b.mul(dz, y), b.pw(M.POW, x, b.sub(y, 1.0))),
        lambda: b.mul(b.mul(dz, b.pw(M.POW, x, y)), b.pw(M.LOG, x)),
    )


@register_pointwise(M.MOD)
def _mod(ctx):
    dz, b = ctx.grad("output"), ctx.b

    def dy():
        q = b.div(ctx.input("input0"), ctx.input("input1"))
        trunc = b.select(b.pw(M.FLOOR, q), b.pw(M.CEIL, q), b.mask(M.CMP_GE, q, 0.0))
        return b.neg(b.mul(dz, trunc))

    return _both(ctx, dz, dy)


@register_pointwise(M.BINARY_SELECT, inputs=("input0", "input1"))
def _select(ctx):
    dz, b = ctx.grad("output"), ctx.b
    mask = ctx.input("input2")
    return _both(ctx, lambda: b.select(dz, 0.0, mask), lambda: b.select(0.0, dz, mask))


@register_pointwise(M.IDENTITY)
def _identity(ctx):
    return {"input0": ctx.grad("output")}


@register_pointwise(M.NEG)
def _neg(ctx):
    return {"input0": ctx.b.neg(ctx.grad("output"))}


def _unary(mode: M, derivative):
    """dx = dz * derivative(b, x)."""

    @register_pointwise(mode)
    def rule(ctx):
        b = ctx.b
        return {"input0": b.mul(ctx.grad("output"), derivative(b, ctx.input("input0")))}

    return rule


_unary(M.ABS, lambda b, x: b.sign(x))
_unary(M.EXP, lambda b, x: b.pw(M.EXP, x))
_unary(M.LOG, lambda b, x: b.pw(M.RECIPROCAL, x))
_unary(M.SQRT, lambda b, x: b.mul(b.pw(M.RSQRT, x), 0.5))
_unary(M.RSQRT, lambda b, x: b.mul(b.div(b.pw(M.RSQRT, x), x), -0.5))
_unary(M.RECIPROCAL, lambda b, x: b.neg(b.pw(M.RECIPROCAL, b.mul(x, x))))
_unary(M.SIN, lambda b, x: b.pw(M.COS, x))
_unary(M.COS, lambda b, x: b.neg(b.pw(M.SIN, x)))
_unary(M.TAN, lambda b, x: b.pw(M.RECIPROCAL, b.pw(M.ADD_SQUARE, 0.0, b.pw(M.COS, x))))
_unary(M.ERF, lambda b, x: b.mul(b.pw(M.EXP, b.neg(b.mul(x, x))), 2.0 / math.sqrt(math.pi)))

_BACKWARD_MODE = {
    M.RELU_FWD: M.RELU_BWD,
    M.TANH_FWD: M.TANH_BWD,
    M.SIGMOID_FWD: M.SIGMOID_BWD,
    M.ELU_FWD: M.ELU_BWD,
    M.GELU_FWD: M.GELU_BWD,
    M.GELU_APPROX_TANH_FWD: M.GELU_APPROX_TANH_BWD,
    M.SOFTPLUS_FWD: M.SOFTPLUS_BWD,
    M.SWISH_FWD: M.SWISH_BWD,
}


@register_pointwise(*_BACKWARD_MODE, inputs=("input0",))
def _activation(ctx):
    mode = _BACKWARD_MODE[ctx.node.op.mode]
    params = {p: ctx.input(p) for p, _ in ctx.node.op.info.params}
    return {"input0": ctx.b.pw(mode, ctx.grad("output"), ctx.input("input0"), **params)}
