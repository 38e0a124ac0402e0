"""Backward rules of the reductions (dy has the output's dims, 1 in reduced axes; the gradient of
the input stays in those dims wherever it is the same along the reduced axes, see rules.py):

    ADD            dx = dy                       AVG    dx = dy / |R|
    MAX / MIN      dx = dy * m / sum_R(m), m = (x == y): the gradient is shared by the tied maxima
                   (as torch.amax / amin); y is the saved output when its type holds x's values
                   exactly, else the max is recomputed in x's type
    AMAX           as MAX on |x|, times sign(x)
    NORM1          dx = dy * sign(x)             NORM2  dx = dy * x / y
    MUL            dx = dy * y / x               (undefined where x = 0)
    MUL_NO_ZEROS   dx = dy * y / x where x != 0, 0 where x = 0
    genstats       dx = dsum + 2 * x * dsq_sum
"""

from __future__ import annotations

from ..core.dtypes import DataType
from ..core.symbolic_value import size_value
from ..core.tensor import Tensor
from ..ops.pointwise import PointwiseMode as M
from ..ops.reduction import Reduction
from ..ops.reduction import ReductionMode as R
from .rules import RuleContext, register_rule

_WIDTH = {
    DataType.FP8_E4M3: 0,
    DataType.FP8_E5M2: 0,
    DataType.HALF: 1,
    DataType.BFLOAT16: 1,
    DataType.FLOAT: 2,
    DataType.DOUBLE: 3,
}


def _holds(wide: DataType, narrow: DataType) -> bool:
    """Does every value of `narrow` fit `wide` exactly?"""
    return wide is narrow or _WIDTH.get(wide, -1) > _WIDTH.get(narrow, 9)


def _extremum(ctx: RuleContext, v: Tensor, mode: R) -> Tensor:
    """The reduced value of `v` (x or |x|) to compare x with: the saved output if exact, else recomputed."""
    x, y = ctx.tensor_desc("input"), ctx.result_desc("output")
    if mode is not R.AMAX and _holds(y.data_type, x.data_type):
        return ctx.output("output")
    (m,) = ctx.b.op(Reduction(mode=R.MAX if mode is R.AMAX else mode), [v], ["output"], [y.dim], tag="extremum")
    m.set_data_type(x.data_type)
    return m


@register_rule("reduction", inputs=("input",))
def reduction(ctx: RuleContext):
    b = ctx.b
    mode = ctx.op_as(Reduction).mode
    dy = ctx.incoming("output")
    xd, yd = ctx.tensor_desc("input"), ctx.result_desc("output")
    if mode is R.ADD:
        return {"input": dy}
    if mode is R.AVG:
        return {"input": b.mul(dy, size_value(yd.numel, xd.numel))}
    x = ctx.tensor("input")
    if mode in (R.MAX, R.MIN, R.AMAX):
        v = b.pw(M.ABS, x) if mode is R.AMAX else x
        hit = b.mask(M.CMP_EQ, v, _extremum(ctx, v, mode))
        share = b.div(hit, b.reduce(hit, yd.dim))
        dx = b.mul(dy, share)
        return {"input": b.mul(dx, b.sign(x)) if mode is R.AMAX else dx}
    if mode is R.NORM1:
        return {"input": b.mul(dy, b.sign(x))}
    if mode is R.NORM2:
        return {"input": b.mul(dy, b.div(x, ctx.output("output")))}
    if mode is R.MUL:
        return {"input": b.mul(dy, b.div(ctx.output("output"), x))}
    if mode is R.MUL_NO_ZEROS:
        return {"input": b.select(b.mul(dy, b.div(ctx.output("output"), x)), 0.0, b.mask(M.CMP_NEQ, x, 0.0))}
    raise AssertionError(mode)


@register_rule("genstats", inputs=("input",))
def genstats(ctx: RuleContext):
    b = ctx.b
    ds, dsq = ctx.grad("sum"), ctx.grad("sq_sum")
    dx = ds if ds is not None else 0.0
    if dsq is not None:
        dx = b.add(dx, b.mul(b.mul(dsq, ctx.tensor("input")), 2.0))
    return {"input": dx}
