"""Backward rule of adaptive layer normalization: adalayernorm -> adalayernorm_backward with the saved
(or recomputed) mean and inv_variance; gradients flow into the input, the per-batch scale and bias."""

from __future__ import annotations

from ..ops.adalayernorm import AdaLayernormBackward, ada_axes
from .rules import RuleContext, register_rule
from .rules_norm import _backward_op, _moments


@register_rule("adalayernorm", inputs=("input", "scale", "bias"), outputs=("y",))
def adalayernorm(ctx: RuleContext):
    dy = ctx.grad_full("y")
    if ctx.has_output("mean") and ctx.has_output("inv_variance"):
        mean, inv = ctx.output("mean"), ctx.output("inv_variance")
    else:
        x = ctx.tensor_desc("input")
        axes = ada_axes(x.dim, ctx.tensor_desc("scale").dim)
        mean, inv = _moments(ctx, tuple(1 if i in axes else d for i, d in enumerate(x.dim)), centered=True)
    return _backward_op(ctx, AdaLayernormBackward(), [dy, ctx.tensor("input"), ctx.input("scale"), mean, inv])
