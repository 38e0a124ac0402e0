"""Backward rules of the normalizations.

    batchnorm (training)   -> batchnorm_backward(dy, x, scale, saved mean, saved inv_variance), or
                              with epsilon (stats recomputed in the kernel) when the forward op does
                              not output its stats
    batchnorm_inference    y = (x - mean)*inv*scale + bias: pointwise products, summed per channel;
                           every input (x, mean, inv_variance, scale, bias) gets a gradient
    layernorm              -> layernorm_backward with the saved (or recomputed) mean / inv_variance;
                              without a scale, the same formula in pointwise ops and AVG reductions
    rmsnorm                -> rmsnorm_backward with the saved (or recomputed) inv_variance
    instancenorm           -> instancenorm_backward with the saved stats, or epsilon

Only y carries a gradient: a gradient arriving at mean, inv_variance or the running stats is an
error. epsilon, momentum and the running stats get none. Recomputed stats use reductions (AVG) of
the input, the forward's formula.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, overload

from ..core.op import Op
from ..core.tensor import Tensor
from ..ops.layernorm import LayernormBackward, RmsnormBackward
from ..ops.norm import BatchnormBackward, InstancenormBackward
from ..ops.pointwise import PointwiseMode as M
from ..ops.reduction import ReductionMode
from .rules import RuleContext, Value, register_rule

_GRADS = (("dx", "input"), ("dscale", "scale"), ("dbias", "bias"))


def _backward_op(
    ctx: RuleContext, op: Op, inputs: Sequence[Value | None], *, bias_role: str = "bias"
) -> dict[str, Tensor]:
    """Run a *_backward op with only the outputs whose gradient is wanted."""
    x = ctx.tensor_desc("input")
    wanted = [(out, role) for out, role in _GRADS if ctx.has_input(role) and ctx.needs(role)]
    if not wanted:
        return {}
    dims = [x.dim if out == "dx" else ctx.tensor_desc("scale").dim for out, _ in wanted]
    handles = ctx.b.op(op, inputs, [out for out, _ in wanted], dims, tag=op.kind, float_outputs=True)
    return {role: h for (_, role), h in zip(wanted, handles)}


def _stats_dims(ctx: RuleContext) -> tuple[int, ...]:
    """layernorm / rmsnorm stats dims: the input's dim where scale's (or bias's) is 1, else 1."""
    x = ctx.tensor_desc("input")
    ref = ctx.input_desc("scale") or ctx.input_desc("bias")
    if ref is None:
        return (x.dim[0],) + (1,) * (len(x.dim) - 1)
    return tuple(1 if r == d else d for r, d in zip(ref.dim, x.dim))


@overload
def _moments(ctx: RuleContext, stats: tuple[int, ...], centered: Literal[True]) -> tuple[Tensor, Tensor]: ...
@overload
def _moments(ctx: RuleContext, stats: tuple[int, ...], centered: Literal[False]) -> tuple[None, Tensor]: ...


def _moments(ctx: RuleContext, stats: tuple[int, ...], centered: bool) -> tuple[Tensor | None, Tensor]:
    """mean (None unless centered) and inv_variance recomputed from the input, as the forward does."""
    b = ctx.b
    x = ctx.tensor("input")
    eps = ctx.value("epsilon")
    if centered:
        mean = b.reduce(x, stats, ReductionMode.AVG)
        xc = b.sub(x, mean)
        var = b.reduce(b.mul(xc, xc), stats, ReductionMode.AVG)
    else:
        mean = None
        var = b.reduce(b.mul(x, x), stats, ReductionMode.AVG)
    return mean, b.pw(M.RSQRT, b.add(var, eps))


@register_rule("batchnorm", inputs=("input", "scale", "bias"), outputs=("y",))
def batchnorm(ctx: RuleContext):
    dy = ctx.grad_full("y")
    stats: list[Value | None]
    if ctx.has_output("mean") and ctx.has_output("inv_variance"):
        stats = [ctx.output("mean"), ctx.output("inv_variance"), None]
    else:
        stats = [None, None, ctx.input("epsilon")]
    return _backward_op(ctx, BatchnormBackward(), [dy, ctx.input("input"), ctx.input("scale"), *stats])


@register_rule("instancenorm", inputs=("input", "scale", "bias"), outputs=("y",))
def instancenorm(ctx: RuleContext):
    dy = ctx.grad_full("y")
    stats: list[Value | None]
    if ctx.has_output("mean") and ctx.has_output("inv_variance"):
        stats = [ctx.output("mean"), ctx.output("inv_variance"), None]
    else:
        stats = [None, None, ctx.input("epsilon")]
    return _backward_op(ctx, InstancenormBackward(), [dy, ctx.input("input"), ctx.input("scale"), *stats])


@register_rule("batchnorm_inference", inputs=("input", "mean", "inv_variance", "scale", "bias"), broadcasts=True)
def batchnorm_inference(ctx: RuleContext):
    b = ctx.b
    dy = ctx.incoming("y")
    x, mean, inv, scale = (ctx.value(r) for r in ("input", "mean", "inv_variance", "scale"))
    out = {}
    if ctx.needs("input") or ctx.needs("mean"):
        t = b.mul(b.mul(dy, inv), scale)
        if ctx.needs("input"):
            out["input"] = t
        if ctx.needs("mean"):
            out["mean"] = b.neg(t)
    if ctx.needs("inv_variance") or ctx.needs("scale"):
        dxc = b.mul(dy, b.sub(x, mean))
        if ctx.needs("inv_variance"):
            out["inv_variance"] = b.mul(dxc, scale)
        if ctx.needs("scale"):
            out["scale"] = b.mul(dxc, inv)
    if ctx.needs("bias"):
        out["bias"] = dy
    return out


@register_rule("layernorm", inputs=("input", "scale", "bias"), outputs=("y",))
def layernorm(ctx: RuleContext):
    b = ctx.b
    dy = ctx.grad_full("y")
    stats = _stats_dims(ctx)
    if ctx.has_output("mean") and ctx.has_output("inv_variance"):
        mean, inv = ctx.output("mean"), ctx.output("inv_variance")
    else:
        mean, inv = _moments(ctx, stats, centered=True)
    x = ctx.tensor("input")
    if ctx.has_input("scale"):
        return _backward_op(ctx, LayernormBackward(), [dy, x, ctx.input("scale"), mean, inv])
    # no scale: dx = inv * (dy - mean_A(dy) - xhat * mean_A(dy * xhat))
    out = {}
    if ctx.needs("input"):
        xhat = b.mul(b.sub(x, mean), inv)
        m1 = b.reduce(dy, stats, ReductionMode.AVG)
        m2 = b.reduce(b.mul(dy, xhat), stats, ReductionMode.AVG)
        out["input"] = b.mul(inv, b.sub(b.sub(dy, m1), b.mul(xhat, m2)))
    if ctx.has_input("bias") and ctx.needs("bias"):
        out["bias"] = dy
    return out


@register_rule("rmsnorm", inputs=("input", "scale", "bias"), outputs=("y",))
def rmsnorm(ctx: RuleContext):
    dy = ctx.grad_full("y")
    if ctx.has_output("inv_variance"):
        inv = ctx.output("inv_variance")
    else:
        _, inv = _moments(ctx, _stats_dims(ctx), centered=False)
    return _backward_op(ctx, RmsnormBackward(), [dy, ctx.input("input"), ctx.input("scale"), inv])
