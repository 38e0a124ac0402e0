"""Adaptive layer normalization (cuDNN's `adalayernorm`, `adalayernorm_backward`): layer
normalization whose scale and bias are given per batch entry (DiT-style conditioning). The family's
shared rules and formulas: opgraph.ops.norm_common.

    input [B, S..., E], scale and bias [B, 1..., E] (or 1 on the batch axis)
    normalized axes A: the axes after the first where scale's dim is not 1 (E here)
    mean, inv_variance [B, S..., 1]: the input's dims, 1 on A
    y = (x - mean_A(x)) * inv_variance * scale + bias,  inv_variance = 1 / sqrt(var_A(x) + epsilon)

Unlike layernorm, whose normalized axes are where scale's dim equals the input's (scale [1, S, E]
normalizes S and E), the batch axis is never normalized: a per-batch scale is a condition, not a
normalized axis.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.errors import ShapeError
from ..core.op import NodeContext, Op, TensorSpec, graph_method, register_op
from .norm_common import (
    REQUIRED,
    NormForwardPhase,
    Scalar,
    ScalarRules,
    affine,
    as_float,
    as_phase,
    centered_backward,
    check_dims,
    check_float,
    check_grad,
    check_input,
    check_scalars,
    fit_outputs,
    float_spec,
    moments,
    need_epsilon,
    y_spec,
)

if TYPE_CHECKING:
    from ..core.tensor import Tensor


def ada_axes(x_dim: tuple[int, ...], scale_dim: tuple[int, ...]) -> tuple[int, ...]:
    """The normalized axes: after the first, where scale's dim is not 1."""
    return tuple(i for i in range(1, len(x_dim)) if scale_dim[i] != 1)


def ada_stats_dims(ctx: NodeContext, x: Any) -> tuple[int, ...]:
    """mean / inv_variance dims from scale's, with the checks of scale and bias."""
    s = ctx.tensor("scale")
    hint = (
        "give scale and bias the input's rank, the input's dim on the normalized axes and on the batch "
        "axis (or 1 there), and 1 elsewhere: input [B, S, E] takes [B, 1, E]"
    )
    if len(s.dim) != len(x.dim) or any(d not in (1, xd) for d, xd in zip(s.dim, x.dim)):
        ctx.error(
            ShapeError,
            f"input 'scale' dims {list(s.dim)} do not fit input dims {list(x.dim)}",
            tensor="scale",
            rule="norm.scale_dims",
            hint=hint,
        )
    axes = ada_axes(x.dim, s.dim)
    if not axes:
        ctx.error(
            ShapeError,
            f"scale dims {list(s.dim)} normalize no axis of input dims {list(x.dim)}",
            tensor="scale",
            rule="norm.scale_dims",
            hint=hint,
        )
    if ctx.has("bias"):
        check_dims(ctx, "bias", s.dim, "norm.bias_dims", "give bias the same dims as scale")
    return tuple(1 if i in axes else d for i, d in enumerate(x.dim))


@register_op
@dataclass(frozen=True, kw_only=True)
class AdaLayernorm(ScalarRules, Op):
    """Adaptive layer normalization (see the module docstring). mean and inv_variance are outputs in
    TRAINING only (None in INFERENCE)."""

    kind = "adalayernorm"
    INPUTS = ("input", "scale", "bias", "epsilon")
    OUTPUTS = ("y", "mean", "inv_variance")
    SCALAR_INPUTS = frozenset({"epsilon"})
    norm_forward_phase: NormForwardPhase = NormForwardPhase.TRAINING

    def infer(self, ctx: NodeContext) -> list[TensorSpec]:
        x = check_input(ctx)
        check_float(ctx, self.INPUTS)
        stats = ada_stats_dims(ctx, x)
        check_scalars(ctx)
        return [y_spec(x), float_spec(stats), float_spec(stats)]

    def reference(self, ins, outs):
        x, scale, bias, eps = ins
        axes = ada_axes(x.shape, scale.shape)
        mean, var = moments(x, axes)
        inv = 1.0 / np.sqrt(var + as_float(eps))
        return fit_outputs([affine((x - mean) * inv, scale, bias), mean, inv], outs)


@register_op
@dataclass(frozen=True, kw_only=True)
class AdaLayernormBackward(Op):
    """The gradients of adalayernorm with the forward's saved mean and inv_variance:

    xhat   = (x - mean) * inv_variance,  g = dy * scale
    dx     = inv_variance * (g - mean_A(g) - xhat * mean_A(g * xhat))
    dscale = sum over the axes where scale's dim is 1 of dy * xhat   (scale's dims: per batch entry)
    dbias  = sum over the same axes of dy
    """

    kind = "adalayernorm_backward"
    INPUTS = ("grad", "input", "scale", "mean", "inv_variance")
    OUTPUTS = ("dx", "dscale", "dbias")

    def infer(self, ctx: NodeContext) -> list[TensorSpec]:
        x = check_input(ctx)
        check_float(ctx, self.INPUTS)
        check_grad(ctx, x)
        stats = ada_stats_dims(ctx, x)
        hint = "pass the adalayernorm forward's mean and inv_variance (the input's dims, 1 on normalized axes)"
        for role in ("mean", "inv_variance"):
            check_dims(ctx, role, stats, "norm.stats_dims", hint)
        s = ctx.tensor("scale")
        return [y_spec(x), float_spec(s.dim, s), float_spec(s.dim, s)]

    def reference(self, ins, outs):
        dy, x, scale, mean, inv = ins
        return fit_outputs(list(centered_backward(dy, x, scale, mean, inv, ada_axes(x.shape, scale.shape))), outs)


@graph_method
def adalayernorm(
    self,
    norm_forward_phase: NormForwardPhase | str,
    input: Tensor,
    scale: Tensor,
    bias: Tensor,
    epsilon: Scalar = REQUIRED,
    compute_data_type: Any = None,
    name: str = "",
) -> list[Tensor | None]:
    """Adaptive layer normalization (cuDNN's adalayernorm): layernorm with a scale and bias per batch entry.

    Shapes: input [B, S..., E]; scale and bias [B, 1..., E] (the input's dim on the batch axis or 1, on
    each normalized axis the input's dim, 1 elsewhere); mean and inv_variance [B, S..., 1].

    Layouts: any strides; y takes the input's axis order.

    Types: floating inputs; statistics in `compute_data_type` (default FLOAT) and stored as FLOAT.

    Formula, over the axes A after the first where scale's dim is not 1: `mean = mean_A(x)`,
    `inv_variance = 1 / sqrt(mean_A((x - mean)^2) + epsilon)`, `y = (x - mean) * inv_variance * scale + bias`.

    Args:
        norm_forward_phase: TRAINING (also outputs mean and inv_variance) or INFERENCE, or its name.
        input: x.
        scale: gamma per batch entry.
        bias: beta per batch entry.
        epsilon: added to the variance (required).
        compute_data_type: the statistics' type.
        name: the op's name.

    Returns:
        [y, mean, inv_variance]; mean and inv_variance are None in INFERENCE.

    Example:
        ```python
        x = g.tensor(dim=[4, 1024, 768], name="x")
        scale, shift = g.tensor(dim=[4, 1, 768], name="scale"), g.tensor(dim=[4, 1, 768], name="shift")
        y = g.adalayernorm("INFERENCE", x, scale, shift, epsilon=1e-6)[0]
        ```
    """
    need_epsilon(epsilon, "adalayernorm")
    phase = as_phase(norm_forward_phase, "adalayernorm", name)
    outputs = ["y", "mean", "inv_variance"] if phase is NormForwardPhase.TRAINING else ["y"]
    return self._add_op(
        AdaLayernorm(norm_forward_phase=phase),
        [input, scale, bias, epsilon],
        name=name,
        compute_data_type=compute_data_type,
        outputs=outputs,
    )


@graph_method
def adalayernorm_backward(
    self,
    grad: Tensor,
    input: Tensor,
    scale: Tensor,
    mean: Tensor,
    inv_variance: Tensor,
    compute_data_type: Any = None,
    name: str = "",
) -> list[Tensor | None]:
    """The gradients of adalayernorm: [dx, dscale, dbias].

    Shapes: grad and input as adalayernorm's input; scale as its scale; mean and inv_variance as saved;
    dx as the input, dscale and dbias as scale (one row per batch entry).

    Layouts: any strides; dx takes the input's axis order.

    Types: floating inputs; sums in `compute_data_type` (default FLOAT).

    Formula, with xhat = (x - mean) * inv_variance and g = dy * scale: `dbias = sum(dy)` and
    `dscale = sum(dy * xhat)` over the axes where scale's dim is 1,
    `dx = inv_variance * (g - mean_A(g) - xhat * mean_A(g * xhat))`.

    Args:
        grad: dy, the gradient of adalayernorm's y.
        input: adalayernorm's input x.
        scale: adalayernorm's scale.
        mean: the saved mean.
        inv_variance: the saved inv_variance.
        compute_data_type: the type sums run in.
        name: the op's name.

    Returns:
        [dx, dscale, dbias].

    Example:
        ```python
        y, mean, inv_var = g.adalayernorm("TRAINING", x, scale, shift, epsilon=1e-6)
        dx, dscale, dshift = g.adalayernorm_backward(dy, x, scale, mean, inv_var)
        ```
    """
    return self._add_op(
        AdaLayernormBackward(), [grad, input, scale, mean, inv_variance], name=name, compute_data_type=compute_data_type
    )
