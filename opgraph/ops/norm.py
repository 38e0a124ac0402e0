"""Batch normalization (training, inference, backward) and instance normalization: statistics per
channel over the batch and spatial axes (batchnorm) or per sample and channel over the spatial axes
(instancenorm). The family's shared rules and the formulas: opgraph.ops.norm_common; layernorm and
rmsnorm: opgraph.ops.layernorm."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.errors import AttributeValueError, ShapeError
from ..core.op import NodeContext, Op, TensorSpec, graph_method, register_op
from ..core.symbolic import provably_le
from ..core.tensor import TensorDesc
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
    check_saved_stats,
    check_scalars,
    fit_outputs,
    float_spec,
    moments,
    need_epsilon,
    no_peer_stats,
    per_channel,
    y_spec,
)

if TYPE_CHECKING:
    from ..core.tensor import Tensor


# -- batchnorm --------------------------------------------------------------------------------------


@register_op
@dataclass(frozen=True, kw_only=True)
class Batchnorm(ScalarRules, Op):
    """Training-mode batch normalization over N and the spatial axes, per channel (axis 1 is C).

        mean              = mean over N, spatial of x                       dims [1, C, 1, ...]
        var               = mean over N, spatial of (x - mean)^2            biased (divides by M)
        inv_variance      = 1 / sqrt(var + epsilon)                         the saved stat
        y                 = (x - mean) * inv_variance * scale + bias
        next_running_mean = (1 - momentum) * in_running_mean + momentum * mean
        next_running_var  = (1 - momentum) * in_running_var  + momentum * var * M / (M - 1)

    M = N * prod(spatial dims), the element count per channel. y and the saved inv_variance use the
    biased variance; the running variance uses the unbiased one (M - 1), as PyTorch does. The running
    outputs exist only when in_running_mean, in_running_var and momentum are all given.
    """

    kind = "batchnorm"
    DYNAMIC = True
    INPUTS = ("input", "scale", "bias", "in_running_mean", "in_running_var", "epsilon", "momentum")
    OUTPUTS = ("y", "mean", "inv_variance", "next_running_mean", "next_running_var")
    OPTIONAL_INPUTS = frozenset({"in_running_mean", "in_running_var", "momentum"})
    SCALAR_INPUTS = frozenset({"epsilon", "momentum"})

    def infer(self, ctx: NodeContext) -> list[TensorSpec]:
        x = check_input(ctx)
        check_float(ctx, self.INPUTS)
        c = per_channel(x)
        hint = "per-channel tensors of batchnorm have dims [1, C, 1, ...] (the input's rank)"
        check_dims(ctx, "scale", c, "norm.scale_dims", hint, channels=True)
        check_dims(ctx, "bias", c, "norm.bias_dims", hint, channels=True)
        running = [r for r in ("in_running_mean", "in_running_var", "momentum") if ctx.has(r)]
        if running and len(running) < 3:
            ctx.error(
                AttributeValueError,
                f"got only {', '.join(running)} of in_running_mean, in_running_var and momentum",
                tensor=running[0],
                rule="norm.running_stats",
                hint="pass all three to update the running stats, or none of them",
            )
        rm: TensorDesc | None = None
        rv: TensorDesc | None = None
        if running:
            rm, rv = (
                check_dims(ctx, role, c, "norm.stats_dims", hint, channels=True)
                for role in ("in_running_mean", "in_running_var")
            )
            if not provably_le(2, x.numel // x.dim[1]):  # (over the whole range of a dynamic batch)
                ctx.error(
                    ShapeError,
                    f"input dims {list(x.dim)} give one value per channel: the unbiased variance "
                    "of the running stats is undefined",
                    tensor="input",
                    rule="norm.reduction_size",
                    hint="use a batch with N * spatial >= 2, or drop the running stats",
                )
        check_scalars(ctx, momentum=True)
        return [y_spec(x), float_spec(c), float_spec(c), float_spec(c, rm), float_spec(c, rv)]

    def dependence(self, output: str, input: str) -> str:
        # a running stat is updated channel by channel from its previous value; nothing else reads it
        running = {"next_running_mean": "in_running_mean", "next_running_var": "in_running_var"}
        if input in ("in_running_mean", "in_running_var"):
            return "aligned" if running.get(output) == input else "none"
        return "any"

    def reference(self, ins, outs):
        x, scale, bias, rm, rv, eps, momentum = ins
        axes = tuple(i for i in range(x.ndim) if i != 1)
        mean, var = moments(x, axes)
        inv = 1.0 / np.sqrt(var + as_float(eps))
        y = affine((x - mean) * inv, scale, bias)
        next_mean = next_var = None
        if momentum is not None:
            m = as_float(momentum)
            n = x.size // x.shape[1]
            next_mean = (1.0 - m) * rm + m * mean
            next_var = (1.0 - m) * rv + m * var * (n / (n - 1))
        return fit_outputs([y, mean, inv, next_mean, next_var], outs)


@register_op
@dataclass(frozen=True, kw_only=True)
class BatchnormInference(Op):
    """Batch normalization with given per-channel stats (all [1, C, 1, ...]):

        y = (x - mean) * inv_variance * scale + bias

    inv_variance is 1 / sqrt(running_var + epsilon), the form cuDNN takes.
    """

    kind = "batchnorm_inference"
    DYNAMIC = True
    INPUTS = ("input", "mean", "inv_variance", "scale", "bias")
    OUTPUTS = ("y",)

    def infer(self, ctx: NodeContext) -> list[TensorSpec]:
        x = check_input(ctx)
        check_float(ctx, self.INPUTS)
        c = per_channel(x)
        hint = "per-channel tensors of batchnorm have dims [1, C, 1, ...] (the input's rank)"
        for role in ("mean", "inv_variance"):
            check_dims(ctx, role, c, "norm.stats_dims", hint, channels=True)
        check_dims(ctx, "scale", c, "norm.scale_dims", hint, channels=True)
        check_dims(ctx, "bias", c, "norm.bias_dims", hint, channels=True)
        return [y_spec(x)]

    def reference(self, ins, outs):
        x, mean, inv, scale, bias = ins
        return fit_outputs([(x - mean) * inv * scale + bias], outs)


@register_op
@dataclass(frozen=True, kw_only=True)
class BatchnormBackward(ScalarRules, Op):
    """Training-mode batch normalization backward (stats over N and spatial, per channel):

        xhat   = (x - mean) * inv_variance
        dbias  = sum over N, spatial of dy
        dscale = sum over N, spatial of dy * xhat
        dx     = inv_variance * (g - mean(g) - xhat * mean(g * xhat)),  g = dy * scale

    mean and inv_variance are the forward's saved stats; with epsilon instead they are recomputed from
    x as the forward does (biased variance).
    """

    kind = "batchnorm_backward"
    DYNAMIC = True
    INPUTS = ("grad", "input", "scale", "mean", "inv_variance", "epsilon")
    OUTPUTS = ("dx", "dscale", "dbias")
    OPTIONAL_INPUTS = frozenset({"mean", "inv_variance", "epsilon"})
    SCALAR_INPUTS = frozenset({"epsilon"})

    def infer(self, ctx: NodeContext) -> list[TensorSpec]:
        x = check_input(ctx)
        check_float(ctx, self.INPUTS)
        check_grad(ctx, x)
        c = per_channel(x)
        hint = "per-channel tensors of batchnorm have dims [1, C, 1, ...] (the input's rank)"
        check_dims(ctx, "scale", c, "norm.scale_dims", hint, channels=True)
        check_saved_stats(ctx)
        for role in ("mean", "inv_variance"):
            if ctx.has(role):
                check_dims(ctx, role, c, "norm.stats_dims", hint, channels=True)
        if ctx.has("epsilon"):
            check_scalars(ctx)
        s = ctx.tensor("scale")
        return [y_spec(x), float_spec(c, s), float_spec(c, s)]

    def reference(self, ins, outs):
        dy, x, scale, mean, inv, eps = ins
        axes = tuple(i for i in range(x.ndim) if i != 1)
        if mean is None:
            mean, var = moments(x, axes)
            inv = 1.0 / np.sqrt(var + as_float(eps))
        return fit_outputs(list(centered_backward(dy, x, scale, mean, inv, axes)), outs)


# -- layernorm ------------------------------------------------------------------------------------


# -- rmsnorm -------------------------------------------------------------------------------------


# -- instancenorm -----------------------------------------------------------------------------------


@register_op
@dataclass(frozen=True, kw_only=True)
class Instancenorm(ScalarRules, Op):
    """Instance normalization: per sample and channel, over the spatial axes (input rank >= 3).

        mean         = mean over spatial of x                          dims [N, C, 1, ...]
        inv_variance = 1 / sqrt(mean over spatial of (x - mean)^2 + epsilon)   (biased variance)
        y            = (x - mean) * inv_variance * scale + bias        scale, bias [1, C, 1, ...]

    mean and inv_variance are outputs in TRAINING only (None in INFERENCE).
    """

    kind = "instancenorm"
    DYNAMIC = True
    INPUTS = ("input", "scale", "bias", "epsilon")
    OUTPUTS = ("y", "mean", "inv_variance")
    SCALAR_INPUTS = frozenset({"epsilon"})
    norm_forward_phase: NormForwardPhase = NormForwardPhase.TRAINING

    def infer(self, ctx: NodeContext) -> list[TensorSpec]:
        x = check_input(ctx, min_rank=3)
        check_float(ctx, self.INPUTS)
        c = per_channel(x)
        hint = "scale and bias of instancenorm are per channel: dims [1, C, 1, ...] (the input's rank)"
        check_dims(ctx, "scale", c, "norm.scale_dims", hint, channels=True)
        check_dims(ctx, "bias", c, "norm.bias_dims", hint, channels=True)
        check_scalars(ctx)
        stats = x.dim[:2] + (1,) * (len(x.dim) - 2)
        return [y_spec(x), float_spec(stats), float_spec(stats)]

    def reference(self, ins, outs):
        x, scale, bias, eps = ins
        mean, var = moments(x, tuple(range(2, x.ndim)))
        inv = 1.0 / np.sqrt(var + as_float(eps))
        return fit_outputs([affine((x - mean) * inv, scale, bias), mean, inv], outs)


@register_op
@dataclass(frozen=True, kw_only=True)
class InstancenormBackward(ScalarRules, Op):
    """Instance normalization backward (stats over the spatial axes, per sample and channel):

        xhat   = (x - mean) * inv_variance
        dx     = inv_variance * (g - mean_S(g) - xhat * mean_S(g * xhat)),  g = dy * scale
        dscale = sum over N, spatial of dy * xhat
        dbias  = sum over N, spatial of dy

    mean and inv_variance ([N, C, 1, ...]) are the forward's saved stats; with epsilon instead they
    are recomputed from x.
    """

    kind = "instancenorm_backward"
    DYNAMIC = True
    INPUTS = ("grad", "input", "scale", "mean", "inv_variance", "epsilon")
    OUTPUTS = ("dx", "dscale", "dbias")
    OPTIONAL_INPUTS = frozenset({"mean", "inv_variance", "epsilon"})
    SCALAR_INPUTS = frozenset({"epsilon"})

    def infer(self, ctx: NodeContext) -> list[TensorSpec]:
        x = check_input(ctx, min_rank=3)
        check_float(ctx, self.INPUTS)
        check_grad(ctx, x)
        c = per_channel(x)
        check_dims(
            ctx,
            "scale",
            c,
            "norm.scale_dims",
            "scale of instancenorm is per channel: dims [1, C, 1, ...] (the input's rank)",
            channels=True,
        )
        check_saved_stats(ctx)
        stats = x.dim[:2] + (1,) * (len(x.dim) - 2)
        for role in ("mean", "inv_variance"):
            if ctx.has(role):
                check_dims(
                    ctx,
                    role,
                    stats,
                    "norm.stats_dims",
                    "pass the instancenorm forward's mean and inv_variance (dims [N, C, 1, ...])",
                    channels=True,
                )
        if ctx.has("epsilon"):
            check_scalars(ctx)
        s = ctx.tensor("scale")
        return [y_spec(x), float_spec(c, s), float_spec(c, s)]

    def reference(self, ins, outs):
        dy, x, scale, mean, inv, eps = ins
        axes = tuple(range(2, x.ndim))
        if mean is None:
            mean, var = moments(x, axes)
            inv = 1.0 / np.sqrt(var + as_float(eps))
        return fit_outputs(list(centered_backward(dy, x, scale, mean, inv, axes)), outs)


# -- builders (names, argument order and return lists as in cuDNN frontend's Python API) -----------


@graph_method
def batchnorm(
    self,
    input: Tensor,
    scale: Tensor,
    bias: Tensor,
    in_running_mean: Tensor | None = None,
    in_running_var: Tensor | None = None,
    epsilon: Scalar = REQUIRED,
    momentum: Scalar | None = None,
    peer_stats: Sequence[Tensor] | None = None,
    compute_data_type: Any = None,
    name: str = "",
) -> list[Tensor | None]:
    """Training-mode batch normalization: statistics over N and the spatial axes, per channel.

    Shapes: input [N, C, *spatial] (rank >= 2); scale, bias, in_running_mean, in_running_var and
    every statistic output are per channel, [1, C, 1, ...] (the input's rank); y has the input's dims.

    Layouts: any strides (NHWC is the fast one on the GPU); y takes the input's axis order.

    Types: floating inputs (HALF, BFLOAT16, FLOAT, DOUBLE); statistics in `compute_data_type`
    (default FLOAT) and stored as FLOAT; y in the graph's intermediate type when virtual, its io type
    when an output.

    Formula, with M = N * prod(spatial) elements per channel:
    `mean = sum(x) / M`, `var = sum((x - mean)^2) / M` (biased), `inv_variance = 1 / sqrt(var + epsilon)`,
    `y = (x - mean) * inv_variance * scale + bias`,
    `next_running_mean = (1 - momentum) * in_running_mean + momentum * mean`,
    `next_running_var = (1 - momentum) * in_running_var + momentum * var * M / (M - 1)` (unbiased, as PyTorch).

    Args:
        input: x [N, C, *spatial].
        scale: gamma [1, C, 1, ...].
        bias: beta [1, C, 1, ...].
        in_running_mean: the running mean to update (with in_running_var and momentum, or none of them).
        in_running_var: the running variance to update.
        epsilon: added to the variance: a number, a pass-by-value tensor or a 1-element tensor (required).
        momentum: the running statistics' update weight (the same three forms).
        peer_stats: cuDNN's multi-GPU statistics exchange; must be None or empty here.
        compute_data_type: the statistics' type.
        name: the op's name.

    Returns:
        [y, mean, inv_variance, next_running_mean, next_running_var]; the running outputs are None
        unless in_running_mean, in_running_var and momentum are all given. mean and inv_variance are
        what batchnorm_backward takes.

    Example:
        ```python
        c = [1, 64, 1, 1]
        scale, bias, rm, rv = (g.tensor(dim=c, name=n) for n in ("scale", "bias", "rmean", "rvar"))
        y, mean, inv_var, next_rm, next_rv = g.batchnorm(x, scale, bias, rm, rv, epsilon=1e-5, momentum=0.1)
        ```
    """
    need_epsilon(epsilon, "batchnorm")
    no_peer_stats(peer_stats, "batchnorm", name)
    outputs = ["y", "mean", "inv_variance"]
    if in_running_mean is not None and in_running_var is not None and momentum is not None:
        outputs += ["next_running_mean", "next_running_var"]
    return self._add_op(
        Batchnorm(),
        [input, scale, bias, in_running_mean, in_running_var, epsilon, momentum],
        name=name,
        compute_data_type=compute_data_type,
        outputs=outputs,
    )


@graph_method
def batchnorm_inference(
    self,
    input: Tensor,
    mean: Tensor,
    inv_variance: Tensor,
    scale: Tensor,
    bias: Tensor,
    compute_data_type: Any = None,
    name: str = "",
) -> Tensor:
    """Batch normalization with given per-channel statistics (inference).

    Shapes: input [N, C, *spatial]; mean, inv_variance, scale, bias [1, C, 1, ...]; y as the input.

    Layouts: any strides; y takes the input's axis order.

    Types: floating inputs (HALF, BFLOAT16, FLOAT, DOUBLE); statistics in `compute_data_type`
    (default FLOAT) and stored as FLOAT; y in the graph's intermediate type when virtual, its io type
    when an output.

    Formula: `y = (x - mean) * inv_variance * scale + bias`, where inv_variance is
    `1 / sqrt(running_var + epsilon)` (the form cuDNN takes: compute it in the graph with
    `g.rsqrt(g.add(running_var, eps))` to keep running_var as the input).

    Args:
        input: x [N, C, *spatial].
        mean: the per-channel mean [1, C, 1, ...].
        inv_variance: 1 / sqrt(var + epsilon), per channel.
        scale: gamma, per channel.
        bias: beta, per channel.
        compute_data_type: the type the arithmetic runs in.
        name: the op's name.

    Returns:
        y, a virtual tensor.

    Example:
        ```python
        y = g.relu(g.batchnorm_inference(x, mean, g.rsqrt(g.add(var, 1e-5)), scale, bias))
        ```
    """
    return self._add_op(
        BatchnormInference(), [input, mean, inv_variance, scale, bias], name=name, compute_data_type=compute_data_type
    )[0]


@graph_method
def batchnorm_backward(
    self,
    grad: Tensor,
    input: Tensor,
    scale: Tensor,
    mean: Tensor | None = None,
    inv_variance: Tensor | None = None,
    epsilon: Scalar | None = None,
    peer_stats: Sequence[Tensor] | None = None,
    compute_data_type: Any = None,
    name: str = "",
) -> list[Tensor | None]:
    """The gradients of training-mode batchnorm: [dx, dscale, dbias].

    Shapes: grad dy and input x [N, C, *spatial]; scale, mean, inv_variance [1, C, 1, ...];
    dx as the input, dscale and dbias per channel.

    Layouts: any strides; dx takes the input's axis order.

    Types: floating inputs (HALF, BFLOAT16, FLOAT, DOUBLE); statistics in `compute_data_type`
    (default FLOAT) and stored as FLOAT; y in the graph's intermediate type when virtual, its io type
    when an output.

    Formula, with xhat = (x - mean) * inv_variance and M elements per channel:
    `dbias = sum(dy)`, `dscale = sum(dy * xhat)`,
    `dx = scale * inv_variance * (dy - dbias / M - xhat * dscale / M)`.

    Args:
        grad: dy, the gradient of batchnorm's y.
        input: the forward op's input x.
        scale: the forward op's scale.
        mean: the saved mean (give mean and inv_variance, or epsilon to recompute them).
        inv_variance: the saved inv_variance.
        epsilon: recompute the statistics from x with this epsilon (instead of the saved ones).
        peer_stats: must be None or empty.
        compute_data_type: the type sums run in.
        name: the op's name.

    Returns:
        [dx, dscale, dbias].

    Example:
        ```python
        dx, dscale, dbias = g.batchnorm_backward(dy, x, scale, mean, inv_var)
        ```
    """
    no_peer_stats(peer_stats, "batchnorm_backward", name)
    return self._add_op(
        BatchnormBackward(),
        [grad, input, scale, mean, inv_variance, epsilon],
        name=name,
        compute_data_type=compute_data_type,
    )


@graph_method
def instancenorm(
    self,
    norm_forward_phase: NormForwardPhase | str,
    input: Tensor,
    scale: Tensor,
    bias: Tensor,
    epsilon: Scalar,
    compute_data_type: Any = None,
    name: str = "",
) -> list[Tensor | None]:
    """Instance normalization: statistics over the spatial axes, per sample and channel.

    Shapes: input [N, C, *spatial] (rank >= 3); scale and bias [1, C, 1, ...]; mean and inv_variance
    [N, C, 1, ...]; y as the input.

    Layouts: any strides; y takes the input's axis order.

    Types: floating inputs (HALF, BFLOAT16, FLOAT, DOUBLE); statistics in `compute_data_type`
    (default FLOAT) and stored as FLOAT; y in the graph's intermediate type when virtual, its io type
    when an output.

    Formula, over the spatial axes S: `mean = mean_S(x)`,
    `inv_variance = 1 / sqrt(mean_S((x - mean)^2) + epsilon)`, `y = (x - mean) * inv_variance * scale + bias`.

    Args:
        norm_forward_phase: TRAINING (also outputs mean and inv_variance) or INFERENCE, or its name.
        input: x [N, C, *spatial].
        scale: gamma, per channel.
        bias: beta, per channel.
        epsilon: added to the variance.
        compute_data_type: the statistics' type.
        name: the op's name.

    Returns:
        [y, mean, inv_variance]; mean and inv_variance are None in INFERENCE.

    Example:
        ```python
        y, mean, inv_var = g.instancenorm("TRAINING", x, scale, bias, epsilon=1e-5)
        ```
    """
    phase = as_phase(norm_forward_phase, "instancenorm", name)
    outputs = ["y", "mean", "inv_variance"] if phase is NormForwardPhase.TRAINING else ["y"]
    return self._add_op(
        Instancenorm(norm_forward_phase=phase),
        [input, scale, bias, epsilon],
        name=name,
        compute_data_type=compute_data_type,
        outputs=outputs,
    )


@graph_method
def instancenorm_backward(
    self,
    grad: Tensor,
    input: Tensor,
    scale: Tensor,
    mean: Tensor | None = None,
    inv_variance: Tensor | None = None,
    compute_data_type: Any = None,
    name: str = "",
    *,
    epsilon: Scalar | None = None,
) -> list[Tensor | None]:
    """The gradients of instancenorm: [dx, dscale, dbias].

    Shapes: grad dy and input x [N, C, *spatial]; scale [1, C, 1, ...]; mean and inv_variance
    [N, C, 1, ...]; dx as the input, dscale and dbias per channel.

    Layouts: any strides; dx takes the input's axis order.

    Types: floating inputs (HALF, BFLOAT16, FLOAT, DOUBLE); statistics in `compute_data_type`
    (default FLOAT) and stored as FLOAT; y in the graph's intermediate type when virtual, its io type
    when an output.

    Formula: layernorm's backward over the spatial axes of each (n, c), with dscale and dbias summed
    over N and the spatial axes.

    Args:
        grad: dy, the gradient of instancenorm's y.
        input: instancenorm's input x.
        scale: instancenorm's scale.
        mean: the saved mean (or give epsilon).
        inv_variance: the saved inv_variance.
        compute_data_type: the type sums run in.
        name: the op's name.
        epsilon: (keyword, an opgraph extension) recompute the statistics from x with this epsilon.

    Returns:
        [dx, dscale, dbias].

    Example:
        ```python
        dx, dscale, dbias = g.instancenorm_backward(dy, x, scale, mean, inv_var)
        ```
    """
    return self._add_op(
        InstancenormBackward(),
        [grad, input, scale, mean, inv_variance, epsilon],
        name=name,
        compute_data_type=compute_data_type,
    )
