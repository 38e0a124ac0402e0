"""Backward rule of the running sum.

cumsum   y = cumsum(x, axis, reverse)   dx = cumsum(dy, axis, not reverse)
"""

from __future__ import annotations

from ..ops.scan import Cumsum
from .rules import RuleContext, register_rule


@register_rule("cumsum", inputs=("input",))
def cumsum(ctx: RuleContext):
    op = ctx.op_as(Cumsum)
    x = ctx.tensor_desc("input")
    (dx,) = ctx.b.op(
        Cumsum(axis=op.axis, reverse=not op.reverse),
        [ctx.grad_full("output")],
        ["output"],
        [x.dim],
        tag="cumsum_backward",
        float_outputs=True,
    )
    return {"input": dx}
