"""Backward rule of the causal depthwise conv1d: causal_conv1d -> causal_conv1d_backward (which
recomputes the pre-activation from x, weight and bias); gradients flow into all three."""

from __future__ import annotations

from ..ops.causal_conv1d import CausalConv1d, CausalConv1dBackward
from .rules import RuleContext, register_rule

_GRADS = (("dx", "input"), ("dweight", "weight"), ("dbias", "bias"))


@register_rule("causal_conv1d", inputs=("input", "weight", "bias"), outputs=("y",))
def causal_conv1d(ctx: RuleContext):
    op = ctx.op_as(CausalConv1d)
    wanted = [(out, role) for out, role in _GRADS if ctx.has_input(role) and ctx.needs(role)]
    if not wanted:
        return {}
    bwd = CausalConv1dBackward(activation=op.activation)
    inputs = [ctx.grad_full("y"), ctx.input("input"), ctx.input("weight"), ctx.input("bias")]
    dims = [ctx.tensor_desc(role).dim for _, role in wanted]
    handles = ctx.b.op(bwd, inputs, [out for out, _ in wanted], dims, tag="causal_conv1d_backward", float_outputs=True)
    return {role: h for (_, role), h in zip(wanted, handles)}
