"""Layer normalization and RMS normalization (forward and backward): statistics per row over the axes
where scale's dim equals the input's. The family's shared rules and the formulas:
opgraph.ops.norm_common."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

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
    norm_stats_dims,
    sum_to,
    y_spec,
)

if TYPE_CHECKING:
    from ..core.tensor import Tensor


@register_op
@dataclass(frozen=True, kw_only=True)
class Layernorm(ScalarRules, Op):
    """Layer normalization over the axes A where scale's dim equals the input's (stats keep the input's
    dim where scale's is 1, and 1 elsewhere: input [N, C, H, W], scale [1, C, H, W] -> stats [N, 1, 1, 1];
    input [rows, hidden], scale [1, hidden] -> stats [rows, 1]). Without a scale, bias's dims pick A;
    without either, every axis but the first is normalized.

        mean         = mean_A(x)
        inv_variance = 1 / sqrt(mean_A((x - mean)^2) + epsilon)      (biased variance)
        y            = (x - mean) * inv_variance * scale + bias      (scale, bias optional)

    mean and inv_variance are outputs in TRAINING only (None in INFERENCE).
    """

    kind = "layernorm"
    DYNAMIC = True
    INPUTS = ("input", "scale", "bias", "epsilon")
    OUTPUTS = ("y", "mean", "inv_variance")
    OPTIONAL_INPUTS = frozenset({"scale", "bias"})
    SCALAR_INPUTS = frozenset({"epsilon"})
    norm_forward_phase: NormForwardPhase = NormForwardPhase.TRAINING

    def infer(self, ctx: NodeContext) -> list[TensorSpec]:
        x = check_input(ctx)
        check_float(ctx, self.INPUTS)
        stats = norm_stats_dims(ctx, x)
        check_scalars(ctx)
        return [y_spec(x), float_spec(stats), float_spec(stats)]

    def reference(self, ins, outs):
        x, scale, bias, eps = ins
        axes = _axes_of(x.shape, _stats_dim(x, scale, bias))
        mean, var = moments(x, axes)
        inv = 1.0 / np.sqrt(var + as_float(eps))
        return fit_outputs([affine((x - mean) * inv, scale, bias), mean, inv], outs)


def _stats_dim(x: np.ndarray, scale: np.ndarray | None, bias: np.ndarray | None) -> tuple[int, ...]:
    """layernorm/rmsnorm stats dims from scale (or bias) as in `norm_stats_dims`, at run time."""
    ref = scale if scale is not None else bias
    if ref is None:
        return (x.shape[0],) + (1,) * (x.ndim - 1)
    return tuple(1 if r == d else d for r, d in zip(ref.shape, x.shape))


def _axes_of(dim: Sequence[int], stats: Sequence[int]) -> tuple[int, ...]:
    return tuple(i for i, (d, s) in enumerate(zip(dim, stats)) if s == 1)


@register_op
@dataclass(frozen=True, kw_only=True)
class LayernormBackward(Op):
    """Layer normalization backward over the normalized axes A (picked by scale's dims, as in
    layernorm), with the forward's saved mean and inv_variance (stats dims):

        xhat   = (x - mean) * inv_variance
        dx     = inv_variance * (g - mean_A(g) - xhat * mean_A(g * xhat)),  g = dy * scale
        dscale = sum over the axes where scale's dim is 1 of dy * xhat
        dbias  = sum over the axes where scale's dim is 1 of dy
    """

    kind = "layernorm_backward"
    DYNAMIC = True
    INPUTS = ("grad", "input", "scale", "mean", "inv_variance")
    OUTPUTS = ("dx", "dscale", "dbias")

    def infer(self, ctx: NodeContext) -> list[TensorSpec]:
        x = check_input(ctx)
        check_float(ctx, self.INPUTS)
        check_grad(ctx, x)
        stats = norm_stats_dims(ctx, x)
        hint = "pass the layernorm forward's mean and inv_variance (the input's dims, 1 on normalized axes)"
        for role in ("mean", "inv_variance"):
            check_dims(ctx, role, stats, "norm.stats_dims", hint)
        s = ctx.tensor("scale")
        return [y_spec(x), float_spec(s.dim, s), float_spec(s.dim, s)]

    def reference(self, ins, outs):
        dy, x, scale, mean, inv = ins
        axes = _axes_of(x.shape, mean.shape)
        return fit_outputs(list(centered_backward(dy, x, scale, mean, inv, axes)), outs)


@register_op
@dataclass(frozen=True, kw_only=True)
class Rmsnorm(ScalarRules, Op):
    """RMS normalization over the axes A picked by scale's dims (as in layernorm; stats dims too):

        inv_variance = 1 / sqrt(mean_A(x^2) + epsilon)     (the inverse RMS; no mean is subtracted)
        y            = x * inv_variance * scale + bias      (bias optional)

    inv_variance is an output in TRAINING only (None in INFERENCE).
    """

    kind = "rmsnorm"
    DYNAMIC = True
    INPUTS = ("input", "scale", "bias", "epsilon")
    OUTPUTS = ("y", "inv_variance")
    OPTIONAL_INPUTS = frozenset({"bias"})
    SCALAR_INPUTS = frozenset({"epsilon"})
    norm_forward_phase: NormForwardPhase = NormForwardPhase.TRAINING

    def infer(self, ctx: NodeContext) -> list[TensorSpec]:
        x = check_input(ctx)
        check_float(ctx, self.INPUTS)
        stats = norm_stats_dims(ctx, x)
        check_scalars(ctx)
        return [y_spec(x), float_spec(stats)]

    def reference(self, ins, outs):
        x, scale, bias, eps = ins
        axes = _axes_of(x.shape, _stats_dim(x, scale, bias))
        inv = 1.0 / np.sqrt(np.square(x).mean(axis=axes, keepdims=True) + as_float(eps))
        return fit_outputs([affine(x * inv, scale, bias), inv], outs)


@register_op
@dataclass(frozen=True, kw_only=True)
class RmsnormBackward(Op):
    """RMS normalization backward over the axes A picked by scale's dims, with the forward's saved
    inv_variance (r, the inverse RMS):

        dx     = r * (g - x * r^2 * mean_A(g * x)),  g = dy * scale
        dscale = sum over the axes where scale's dim is 1 of dy * x * r
        dbias  = sum over the same axes of dy           (an output only with has_dbias)
    """

    kind = "rmsnorm_backward"
    DYNAMIC = True
    INPUTS = ("grad", "input", "scale", "inv_variance")
    OUTPUTS = ("dx", "dscale", "dbias")

    def infer(self, ctx: NodeContext) -> list[TensorSpec]:
        x = check_input(ctx)
        check_float(ctx, self.INPUTS)
        check_grad(ctx, x)
        stats = norm_stats_dims(ctx, x)
        check_dims(
            ctx,
            "inv_variance",
            stats,
            "norm.stats_dims",
            "pass the rmsnorm forward's inv_variance (the input's dims, 1 on normalized axes)",
        )
        s = ctx.tensor("scale")
        return [y_spec(x), float_spec(s.dim, s), float_spec(s.dim, s)]

    def reference(self, ins, outs):
        dy, x, scale, r = ins
        axes = _axes_of(x.shape, r.shape)
        g = dy * scale
        dx = r * (g - x * r * r * (g * x).mean(axis=axes, keepdims=True))
        return fit_outputs([dx, sum_to(dy * x * r, scale.shape), sum_to(dy, scale.shape)], outs)


@graph_method
def layernorm(
    self,
    norm_forward_phase: NormForwardPhase | str,
    input: Tensor,
    scale: Tensor | None = None,
    bias: Tensor | None = None,
    epsilon: Scalar = REQUIRED,
    compute_data_type: Any = None,
    name: str = "",
) -> list[Tensor | None]:
    """Layer normalization over the axes where scale's dim equals the input's.

    Shapes: input [rows..., hidden...]; scale and bias have the input's rank, with the input's dim on
    each normalized axis and 1 elsewhere (input [B, T, H], scale [1, 1, H]; input [N, C, H, W], scale
    [1, C, H, W]); mean and inv_variance keep the input's dims where scale's are 1 and 1 elsewhere
    ([B, T, 1]). Without a scale, bias's dims pick the axes; without either, all but the first.

    Layouts: any strides (rows contiguous is the fast case); y takes the input's axis order.

    Types: floating inputs (HALF, BFLOAT16, FLOAT, DOUBLE); statistics in `compute_data_type`
    (default FLOAT) and stored as FLOAT; y in the graph's intermediate type when virtual, its io type
    when an output.

    Formula, over the normalized axes A: `mean = mean_A(x)`,
    `inv_variance = 1 / sqrt(mean_A((x - mean)^2) + epsilon)` (biased),
    `y = (x - mean) * inv_variance * scale + bias`.

    Args:
        norm_forward_phase: NormForwardPhase.TRAINING (also outputs mean and inv_variance) or
            INFERENCE, or its name.
        input: x.
        scale: gamma (optional).
        bias: beta (optional).
        epsilon: added to the variance: a number, a pass-by-value or a 1-element tensor (required).
        compute_data_type: the statistics' type.
        name: the op's name.

    Returns:
        [y, mean, inv_variance]; mean and inv_variance are None in INFERENCE.

    Example:
        ```python
        x = g.tensor(dim=[8, 128, 768], name="x")
        gamma, beta = g.tensor(dim=[1, 1, 768], name="gamma"), g.tensor(dim=[1, 1, 768], name="beta")
        y = g.layernorm("INFERENCE", x, gamma, beta, epsilon=1e-5)[0]
        ```
    """
    need_epsilon(epsilon, "layernorm")
    phase = as_phase(norm_forward_phase, "layernorm", name)
    outputs = ["y", "mean", "inv_variance"] if phase is NormForwardPhase.TRAINING else ["y"]
    return self._add_op(
        Layernorm(norm_forward_phase=phase),
        [input, scale, bias, epsilon],
        name=name,
        compute_data_type=compute_data_type,
        outputs=outputs,
    )


@graph_method
def layernorm_backward(
    self,
    grad: Tensor,
    input: Tensor,
    scale: Tensor,
    mean: Tensor,
    inv_variance: Tensor,
    compute_data_type: Any = None,
    name: str = "",
) -> list[Tensor | None]:
    """The gradients of layernorm: [dx, dscale, dbias].

    Shapes: grad dy and input x as layernorm's input; scale as layernorm's; mean and inv_variance as
    layernorm saved them; dx as the input, dscale and dbias as scale.

    Layouts: any strides; dx takes the input's axis order.

    Types: floating inputs (HALF, BFLOAT16, FLOAT, DOUBLE); statistics in `compute_data_type`
    (default FLOAT) and stored as FLOAT; y in the graph's intermediate type when virtual, its io type
    when an output.

    Formula, with xhat = (x - mean) * inv_variance, n elements per row of the normalized axes and
    g = dy * scale: `dbias = sum_rows(dy)`, `dscale = sum_rows(dy * xhat)`,
    `dx = inv_variance * (g - mean_A(g) - xhat * mean_A(g * xhat))`.

    Args:
        grad: dy, the gradient of layernorm's y.
        input: layernorm's input x.
        scale: layernorm's scale.
        mean: the saved mean.
        inv_variance: the saved inv_variance.
        compute_data_type: the type sums run in.
        name: the op's name.

    Returns:
        [dx, dscale, dbias].

    Example:
        ```python
        y, mean, inv_var = g.layernorm("TRAINING", x, gamma, beta, epsilon=1e-5)
        dx, dgamma, dbeta = g.layernorm_backward(dy, x, gamma, mean, inv_var)
        ```
    """
    return self._add_op(
        LayernormBackward(), [grad, input, scale, mean, inv_variance], name=name, compute_data_type=compute_data_type
    )


@graph_method
def rmsnorm(
    self,
    norm_forward_phase: NormForwardPhase | str,
    input: Tensor,
    scale: Tensor,
    bias: Tensor | None = None,
    epsilon: Scalar = REQUIRED,
    compute_data_type: Any = None,
    name: str = "",
) -> list[Tensor | None]:
    """RMS normalization over the axes where scale's dim equals the input's (as in layernorm).

    Shapes: input x; scale (and bias) of the input's rank with the input's dim on normalized axes and
    1 elsewhere; inv_variance keeps the input's dims where scale's are 1 ([B, T, 1] for x [B, T, H]).

    Layouts: any strides; y takes the input's axis order.

    Types: floating inputs (HALF, BFLOAT16, FLOAT, DOUBLE); statistics in `compute_data_type`
    (default FLOAT) and stored as FLOAT; y in the graph's intermediate type when virtual, its io type
    when an output.

    Formula, over the normalized axes A: `inv_variance = 1 / sqrt(mean_A(x^2) + epsilon)` (the inverse
    RMS; no mean is subtracted), `y = x * inv_variance * scale + bias`.

    Args:
        norm_forward_phase: TRAINING (also outputs inv_variance) or INFERENCE, or its name.
        input: x.
        scale: gamma.
        bias: beta (optional).
        epsilon: added to the mean square (required).
        compute_data_type: the statistics' type.
        name: the op's name.

    Returns:
        [y, inv_variance]; inv_variance is None in INFERENCE.

    Example:
        ```python
        y = g.rmsnorm("INFERENCE", x, g.tensor(dim=[1, 1, 4096], name="w"), epsilon=1e-6)[0]
        ```
    """
    need_epsilon(epsilon, "rmsnorm")
    phase = as_phase(norm_forward_phase, "rmsnorm", name)
    outputs = ["y", "inv_variance"] if phase is NormForwardPhase.TRAINING else ["y"]
    return self._add_op(
        Rmsnorm(norm_forward_phase=phase),
        [input, scale, bias, epsilon],
        name=name,
        compute_data_type=compute_data_type,
        outputs=outputs,
    )


@graph_method
def rmsnorm_backward(
    self,
    grad: Tensor,
    input: Tensor,
    scale: Tensor,
    inv_variance: Tensor,
    has_dbias: bool,
    compute_data_type: Any = None,
    name: str = "",
) -> list[Tensor | None]:
    """The gradients of rmsnorm: [dx, dscale, dbias].

    Shapes: grad dy and input x as rmsnorm's input; scale as rmsnorm's; inv_variance as saved; dx as
    the input, dscale and dbias as scale.

    Layouts: any strides; dx takes the input's axis order.

    Types: floating inputs (HALF, BFLOAT16, FLOAT, DOUBLE); statistics in `compute_data_type`
    (default FLOAT) and stored as FLOAT; y in the graph's intermediate type when virtual, its io type
    when an output.

    Formula, with xhat = x * inv_variance and g = dy * scale: `dscale = sum_rows(dy * xhat)`,
    `dbias = sum_rows(dy)`, `dx = inv_variance * (g - xhat * mean_A(g * xhat))`.

    Args:
        grad: dy, the gradient of rmsnorm's y.
        input: rmsnorm's input x.
        scale: rmsnorm's scale.
        inv_variance: the saved inverse RMS.
        has_dbias: whether to output dbias (rmsnorm had a bias).
        compute_data_type: the type sums run in.
        name: the op's name.

    Returns:
        [dx, dscale, dbias]; dbias is None unless has_dbias.

    Example:
        ```python
        dx, dw, _ = g.rmsnorm_backward(dy, x, w, inv_rms, has_dbias=False)
        ```
    """
    outputs = ["dx", "dscale", "dbias"] if has_dbias else ["dx", "dscale"]
    return self._add_op(
        RmsnormBackward(),
        [grad, input, scale, inv_variance],
        name=name,
        compute_data_type=compute_data_type,
        outputs=outputs,
    )
