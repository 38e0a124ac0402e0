"""Backward rule of resample (pooling): the custom ops of ops/pooling_backward.py."""

from __future__ import annotations

from ..ops.builtin_custom import as_text
from ..ops.custom import Custom
from ..ops.pooling import Resample, ResampleMode
from ..ops.pooling_backward import AVG_BACKWARD, MAX_BACKWARD, ensure_registered
from .rules import RuleContext, register_rule


@register_rule("resample", inputs=("input",), outputs=("output",))
def resample(ctx: RuleContext):
    ensure_registered()
    op = ctx.op_as(Resample)
    x = ctx.tensor_desc("input")
    dy = ctx.grad_full("output")
    params = {"window": as_text(op.window), "stride": as_text(op.stride), "pre_padding": as_text(op.pre_padding),
              "post_padding": as_text(op.post_padding)}
    if op.mode is ResampleMode.MAX:
        name, inputs = MAX_BACKWARD, [dy, ctx.input("input")]
    else:
        name, inputs = AVG_BACKWARD, [dy]
        params.update(mode=op.mode.value, in_dim=as_text(x.dim))
    custom = Custom(op_name=name, num_inputs=len(inputs), num_outputs=1, params=tuple(sorted(params.items())))
    return {"input": ctx.b.op(custom, inputs, ["output0"], [x.dim], tag=name)[0]}
