"""Backward rules of the layout ops.

reshape      dx = reshape(dy, x's dims)
transpose    dx = transpose(dy, inverse permutation)
concatenate  d(input i) = slice of dy along the axis at input i's offset
slice        dx = dy scattered into zeros of x's dims: the op ``slice_backward`` (ops/layout.py;
             no other op writes into zeros: a pad is not in the op set and a concatenate with
             zero blocks cannot express steps > 1). The gradients of slices that tile their
             input along one axis (a split: q, k, v of a fused projection) are summed as one
             concatenate of the dy's instead (grad.py)
"""

from __future__ import annotations

from ..ops.layout import Concatenate, Slice, SliceBackward, Transpose
from .rules import RuleContext, dim_of, register_rule


@register_rule("reshape", inputs=("input",))
def reshape(ctx: RuleContext):
    return {"input": ctx.b.reshape(ctx.grad_full("output"), ctx.tensor_desc("input").dim)}


@register_rule("transpose", inputs=("input",))
def transpose(ctx: RuleContext):
    perm = ctx.op_as(Transpose).permutation
    inverse = [0] * len(perm)
    for k, p in enumerate(perm):
        inverse[p] = k
    return {"input": ctx.b.transpose(ctx.incoming("output"), inverse)}


@register_rule("concatenate")
def concatenate(ctx: RuleContext):
    dy = ctx.grad_full("output")
    rank = len(dim_of(dy))
    axis = ctx.op_as(Concatenate).axis % rank
    out, offset = {}, 0
    for role in ctx.node.op.input_roles():
        size = ctx.tensor_desc(role).dim[axis]
        if ctx.needs(role):
            bounds = [(0, d, 1) for d in dim_of(dy)]
            bounds[axis] = (offset, offset + size, 1)
            out[role] = ctx.b.slice(dy, bounds)
        offset += size
    return out


@register_rule("slice", inputs=("input",))
def slice_(ctx: RuleContext):
    x = ctx.tensor_desc("input")
    dy = ctx.grad_full("output")
    bounds = ctx.op_as(Slice).bounds(None, x.dim)
    op = SliceBackward(in_dim=tuple(x.dim), slices=bounds)
    dx = ctx.b.op(op, [dy], ["dx"], [x.dim], tag="slice_backward")[0]
    ctx.b.slice_grads[id(dx)] = (dy, bounds)
    return {"input": dx}
