"""Backward rule of resample (pooling): the ops of ops/pooling_backward.py."""

from __future__ import annotations

from ..ops.pooling import Resample, ResampleMode
from ..ops.pooling_backward import PoolBackward, ResampleAvgBackward, ResampleMaxBackward
from .rules import RuleContext, register_rule


@register_rule("resample", inputs=("input",), outputs=("output",))
def resample(ctx: RuleContext):
    op = ctx.op_as(Resample)
    x = ctx.tensor_desc("input")
    dy = ctx.grad_full("output")
    geometry = dict(window=op.window, stride=op.stride, pre_padding=op.pre_padding, post_padding=op.post_padding)
    backward: PoolBackward
    if op.mode is ResampleMode.MAX:
        backward, inputs = ResampleMaxBackward(**geometry), [dy, ctx.input("input")]
    else:
        backward, inputs = ResampleAvgBackward(mode=op.mode, in_dim=tuple(x.dim), **geometry), [dy]
    return {"input": ctx.b.op(backward, inputs, ["dx"], [x.dim], tag=backward.kind)[0]}
