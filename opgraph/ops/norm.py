"""Normalizations: batchnorm (training, inference, backward), layernorm, rmsnorm, instancenorm.

Every op normalizes `input` over a set of axes A (the "normalized axes"), keeping one statistic per
position of the other axes; the stats tensors have the input's rank with 1 in every axis of A:

    op              A                                  stats dims          scale / bias dims
    batchnorm       every axis but 1 (N, spatial)      [1, C, 1, ...]      [1, C, 1, ...]
    instancenorm    spatial axes (2, 3, ...)           [N, C, 1, ...]      [1, C, 1, ...]
    layernorm       axes where scale's dim == input's  input's dim where   any mix of 1 and the
    rmsnorm         (cuDNN: "stats dim is x where       scale's is 1,       input's dim, e.g.
                    scale == 1 else 1")                1 elsewhere         [1, C, H, W], [1, hidden]

With M = the number of elements in A, mean_A and sum_A reducing over A (keeping dims):

    mean         = mean_A(x)
    var          = mean_A((x - mean)^2)                  (biased: divides by M)
    inv_variance = 1 / sqrt(var + epsilon)
    y            = (x - mean) * inv_variance * scale + bias
    rmsnorm:  inv_rms = 1 / sqrt(mean_A(x^2) + epsilon),  y = x * inv_rms * scale (+ bias)

Backward ops take dy (`grad`), the forward input and the saved stats, and return dx, dscale, dbias;
dscale and dbias sum over the axes where scale's dim is 1. Every formula is in the op's docstring.

Stats, running stats, dscale and dbias are FLOAT unless set otherwise; y and dx follow the graph's
default types and keep the input's layout (an NHWC input gives an NHWC y).
epsilon and momentum are scalars: a Python number (baked in), a pass-by-value tensor or a 1-element
tensor.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Union

import numpy as np

from ..core.dtypes import DataType
from ..core.errors import AttributeValueError, DataTypeError, ShapeError
from ..core.ir import Const
from ..core.op import NodeContext, Op, TensorSpec, graph_method, register_op
from ..core.tensor import TensorDesc, packed_strides
from .base import strides_like

if TYPE_CHECKING:
    from ..core.tensor import Tensor

Scalar = Union[float, "Tensor"]  # a Python number, a pass-by-value tensor or a 1-element tensor


class NormForwardPhase(enum.Enum):
    TRAINING = "training"
    INFERENCE = "inference"


# -- validation shared by the family ---------------------------------------------------------------


def _check_input(ctx: NodeContext, min_rank: int = 2) -> TensorDesc:
    x = ctx.tensor("input")
    if len(x.dim) < min_rank:
        ctx.error(
            ShapeError, f"input 'input' has rank {len(x.dim)} (dims {list(x.dim)}), but this op needs "
            f"rank >= {min_rank}", tensor="input", rule="norm.rank",
            hint="give the input an N and a C axis (and spatial axes for instancenorm): dims [N, C, ...]; "
            "add size-1 axes if needed",
        )
    return x


def _check_float(ctx: NodeContext, roles: Sequence[str]) -> None:
    for role in roles:
        t = ctx.input(role)
        if isinstance(t, TensorDesc) and not t.data_type.is_floating:
            ctx.error(
                DataTypeError, f"input '{role}' has data type {t.data_type.name}; normalizations need "
                "floating-point tensors", tensor=role, rule="norm.dtype",
                hint="declare it FLOAT, HALF or BFLOAT16 (stats and scale/bias are usually FLOAT)",
            )


def _check_dims(ctx: NodeContext, role: str, want: Sequence[int], rule: str, hint: str,
                channels: bool = False) -> TensorDesc:
    """`role` must have dims `want`; with `channels` (a per-channel tensor), one that only differs in
    axis 1 breaks `norm.channels`."""
    t = ctx.tensor(role)
    want = tuple(want)
    if t.dim == want:
        return t
    same_but_c = len(t.dim) == len(want) and all(a == b for i, (a, b) in enumerate(zip(t.dim, want)) if i != 1)
    if channels and same_but_c:
        ctx.error(
            ShapeError, f"input '{role}' has {t.dim[1]} channels (dims {list(t.dim)}) but the input has "
            f"{want[1]} (expected dims {list(want)})", tensor=role, rule="norm.channels",
            hint="axis 1 is C: give every per-channel tensor the input's channel count",
        )
    ctx.error(ShapeError, f"input '{role}' has dims {list(t.dim)}, expected {list(want)}", tensor=role,
              rule=rule, hint=hint)


def _check_grad(ctx: NodeContext, x: TensorDesc) -> None:
    _check_dims(ctx, "grad", x.dim, "norm.grad_dims",
                "grad is dL/dy of the forward op: it has the forward input's dims")


def scalar_problem(role: str, value: float) -> tuple[str, str, str] | None:
    """epsilon must be >= 0 and momentum in [0, 1] (NaN is neither): (message, rule, hint) or None."""
    if role == "epsilon" and not value >= 0:
        return (f"epsilon={value} is negative or NaN", "norm.epsilon", "use a small positive epsilon such as 1e-5")
    if role == "momentum" and not 0 <= value <= 1:
        return (f"momentum={value} is outside [0, 1]", "norm.momentum",
                "momentum weighs the batch statistic: running = (1-m)*running + m*batch (PyTorch's default is 0.1)")
    return None


class _ScalarRules:
    """epsilon and momentum given at run time are held to the rules of literal ones."""

    def check_scalar(self, role: str, value: float) -> tuple[str, str, str] | None:
        return scalar_problem(role, value)


def _check_scalars(ctx: NodeContext, momentum: bool = False) -> None:
    """Literal epsilon must be >= 0 and literal momentum in [0, 1]; pass-by-value ones are checked when
    bound (`check_scalar`), 1-element tensors in memory are not seen on the host."""
    for role in ("epsilon", "momentum") if momentum else ("epsilon",):
        v = ctx.input(role)
        problem = scalar_problem(role, v.value) if isinstance(v, Const) else None
        if problem is not None:
            ctx.error(AttributeValueError, problem[0], rule=problem[1], hint=problem[2])


def _check_saved_stats(ctx: NodeContext) -> None:
    """Backward ops take the saved mean and inv_variance, or epsilon to recompute them, not both."""
    saved = [ctx.has("mean"), ctx.has("inv_variance")]
    if (saved == [True, True] and not ctx.has("epsilon")) or (saved == [False, False] and ctx.has("epsilon")):
        return
    given = [r for r in ("mean", "inv_variance", "epsilon") if ctx.has(r)] or ["none of them"]
    ctx.error(
        AttributeValueError, f"got {', '.join(given)}: pass both saved stats (mean and inv_variance) or "
        "epsilon alone", tensor="mean" if ctx.has("mean") else "inv_variance", rule="norm.saved_stats",
        hint="pass the forward op's mean and inv_variance outputs (or, for a recompute, only epsilon)",
    )


def _per_channel(x: TensorDesc) -> tuple[int, ...]:
    return (1, x.dim[1]) + (1,) * (len(x.dim) - 2)


def _norm_stats_dims(ctx: NodeContext, x: TensorDesc) -> tuple[int, ...]:
    """layernorm/rmsnorm stats dims: the input's dim where scale's is 1, 1 where scale's equals the
    input's (a normalized axis). Bias's dims rule without a scale; without either, every axis but the
    first is normalized. `_stats_dim` is the same rule at run time."""
    ref = "scale" if ctx.has("scale") else "bias" if ctx.has("bias") else None
    if ref is None:
        axes = tuple(range(1, len(x.dim)))
    else:
        s = ctx.tensor(ref)
        hint = (f"give {ref} the input's rank with, per axis, the input's dim (normalized) or 1 (a batch "
                "axis): input [N, C, H, W] takes [1, C, H, W]; input [rows, hidden] takes [1, hidden]")
        if len(s.dim) != len(x.dim) or any(d not in (1, xd) for d, xd in zip(s.dim, x.dim)):
            ctx.error(ShapeError, f"input '{ref}' dims {list(s.dim)} do not fit input dims {list(x.dim)}",
                      tensor=ref, rule=f"norm.{ref}_dims", hint=hint)
        axes = tuple(i for i, (d, xd) in enumerate(zip(s.dim, x.dim)) if d == xd)
        if all(x.dim[i] == 1 for i in axes):
            ctx.error(ShapeError, f"input '{ref}' dims {list(s.dim)} normalize no axis of input dims "
                      f"{list(x.dim)} (every axis it matches has size 1)", tensor=ref,
                      rule=f"norm.{ref}_dims", hint=hint)
        if ref == "scale" and ctx.has("bias"):
            _check_dims(ctx, "bias", s.dim, "norm.bias_dims", "give bias the same dims as scale")
    return tuple(1 if i in axes else d for i, d in enumerate(x.dim))


def _y_spec(x: TensorDesc) -> TensorSpec:
    return TensorSpec(x.dim, strides_like(x.dim, x))


def _float_spec(dim: Sequence[int], like: TensorDesc | None = None) -> TensorSpec:
    dim = tuple(dim)
    return TensorSpec(dim, strides_like(dim, like) if like is not None else packed_strides(dim), DataType.FLOAT)


# -- reference helpers (float64 arrays in logical dims) ---------------------------------------------


def _scalar(v: np.ndarray) -> float:
    return float(np.asarray(v).reshape(()))


def _moments(x: np.ndarray, axes: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """mean and biased variance over `axes`, keeping dims."""
    mean = x.mean(axis=axes, keepdims=True)
    return mean, np.square(x - mean).mean(axis=axes, keepdims=True)


def _affine(xhat: np.ndarray, scale: np.ndarray | None, bias: np.ndarray | None) -> np.ndarray:
    y = xhat if scale is None else xhat * scale
    return y if bias is None else y + bias


def _sum_to(a: np.ndarray, dim: Sequence[int]) -> np.ndarray:
    """Sum `a` over the axes where `dim` is 1 (a broadcast parameter's gradient)."""
    axes = tuple(i for i, d in enumerate(dim) if d == 1 and a.shape[i] != 1)
    return a.sum(axis=axes, keepdims=True)


def _centered_backward(dy, x, scale, mean, inv, axes):
    """Gradients of y = (x - mean) * inv * scale + bias when mean and inv are x's stats over `axes`:
    dx = inv * (g - mean_A(g) - xhat * mean_A(g * xhat)), g = dy * scale, xhat = (x - mean) * inv."""
    xhat = (x - mean) * inv
    g = dy * scale
    dx = inv * (g - g.mean(axis=axes, keepdims=True) - xhat * (g * xhat).mean(axis=axes, keepdims=True))
    return dx, _sum_to(dy * xhat, scale.shape), _sum_to(dy, scale.shape)


def _fit(arrays: list[np.ndarray | None], outs: list[TensorDesc | None]) -> list[np.ndarray | None]:
    return [None if a is None or d is None else np.broadcast_to(a, d.dim) for a, d in zip(arrays, outs)]


# -- batchnorm --------------------------------------------------------------------------------------


@register_op
@dataclass(frozen=True, kw_only=True)
class Batchnorm(_ScalarRules, Op):
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
    INPUTS = ("input", "scale", "bias", "in_running_mean", "in_running_var", "epsilon", "momentum")
    OUTPUTS = ("y", "mean", "inv_variance", "next_running_mean", "next_running_var")
    OPTIONAL_INPUTS = frozenset({"in_running_mean", "in_running_var", "momentum"})
    SCALAR_INPUTS = frozenset({"epsilon", "momentum"})

    def infer(self, ctx: NodeContext) -> list[TensorSpec]:
        x = _check_input(ctx)
        _check_float(ctx, self.INPUTS)
        c = _per_channel(x)
        hint = "per-channel tensors of batchnorm have dims [1, C, 1, ...] (the input's rank)"
        _check_dims(ctx, "scale", c, "norm.scale_dims", hint, channels=True)
        _check_dims(ctx, "bias", c, "norm.bias_dims", hint, channels=True)
        running = [r for r in ("in_running_mean", "in_running_var", "momentum") if ctx.has(r)]
        if running and len(running) < 3:
            ctx.error(
                AttributeValueError, f"got only {', '.join(running)} of in_running_mean, in_running_var and "
                "momentum", tensor=running[0], rule="norm.running_stats",
                hint="pass all three to update the running stats, or none of them",
            )
        rm: TensorDesc | None = None
        rv: TensorDesc | None = None
        if running:
            rm, rv = (_check_dims(ctx, role, c, "norm.stats_dims", hint, channels=True)
                      for role in ("in_running_mean", "in_running_var"))
            if x.numel // x.dim[1] < 2:
                ctx.error(
                    ShapeError, f"input dims {list(x.dim)} give one value per channel: the unbiased variance "
                    "of the running stats is undefined", tensor="input", rule="norm.reduction_size",
                    hint="use a batch with N * spatial >= 2, or drop the running stats",
                )
        _check_scalars(ctx, momentum=True)
        return [_y_spec(x), _float_spec(c), _float_spec(c), _float_spec(c, rm), _float_spec(c, rv)]

    def dependence(self, output: str, input: str) -> str:
        # a running stat is updated channel by channel from its previous value; nothing else reads it
        running = {"next_running_mean": "in_running_mean", "next_running_var": "in_running_var"}
        if input in ("in_running_mean", "in_running_var"):
            return "aligned" if running.get(output) == input else "none"
        return "any"

    def reference(self, ins, outs):
        x, scale, bias, rm, rv, eps, momentum = ins
        axes = tuple(i for i in range(x.ndim) if i != 1)
        mean, var = _moments(x, axes)
        inv = 1.0 / np.sqrt(var + _scalar(eps))
        y = _affine((x - mean) * inv, scale, bias)
        next_mean = next_var = None
        if momentum is not None:
            m = _scalar(momentum)
            n = x.size // x.shape[1]
            next_mean = (1.0 - m) * rm + m * mean
            next_var = (1.0 - m) * rv + m * var * (n / (n - 1))
        return _fit([y, mean, inv, next_mean, next_var], outs)


@register_op
@dataclass(frozen=True, kw_only=True)
class BatchnormInference(Op):
    """Batch normalization with given per-channel stats (all [1, C, 1, ...]):

        y = (x - mean) * inv_variance * scale + bias

    inv_variance is 1 / sqrt(running_var + epsilon), the form cuDNN takes.
    """

    kind = "batchnorm_inference"
    INPUTS = ("input", "mean", "inv_variance", "scale", "bias")
    OUTPUTS = ("y",)

    def infer(self, ctx: NodeContext) -> list[TensorSpec]:
        x = _check_input(ctx)
        _check_float(ctx, self.INPUTS)
        c = _per_channel(x)
        hint = "per-channel tensors of batchnorm have dims [1, C, 1, ...] (the input's rank)"
        for role in ("mean", "inv_variance"):
            _check_dims(ctx, role, c, "norm.stats_dims", hint, channels=True)
        _check_dims(ctx, "scale", c, "norm.scale_dims", hint, channels=True)
        _check_dims(ctx, "bias", c, "norm.bias_dims", hint, channels=True)
        return [_y_spec(x)]

    def reference(self, ins, outs):
        x, mean, inv, scale, bias = ins
        return _fit([(x - mean) * inv * scale + bias], outs)


@register_op
@dataclass(frozen=True, kw_only=True)
class BatchnormBackward(_ScalarRules, Op):
    """Training-mode batch normalization backward (stats over N and spatial, per channel):

        xhat   = (x - mean) * inv_variance
        dbias  = sum over N, spatial of dy
        dscale = sum over N, spatial of dy * xhat
        dx     = inv_variance * (g - mean(g) - xhat * mean(g * xhat)),  g = dy * scale

    mean and inv_variance are the forward's saved stats; with epsilon instead they are recomputed from
    x as the forward does (biased variance).
    """

    kind = "batchnorm_backward"
    INPUTS = ("grad", "input", "scale", "mean", "inv_variance", "epsilon")
    OUTPUTS = ("dx", "dscale", "dbias")
    OPTIONAL_INPUTS = frozenset({"mean", "inv_variance", "epsilon"})
    SCALAR_INPUTS = frozenset({"epsilon"})

    def infer(self, ctx: NodeContext) -> list[TensorSpec]:
        x = _check_input(ctx)
        _check_float(ctx, self.INPUTS)
        _check_grad(ctx, x)
        c = _per_channel(x)
        hint = "per-channel tensors of batchnorm have dims [1, C, 1, ...] (the input's rank)"
        _check_dims(ctx, "scale", c, "norm.scale_dims", hint, channels=True)
        _check_saved_stats(ctx)
        for role in ("mean", "inv_variance"):
            if ctx.has(role):
                _check_dims(ctx, role, c, "norm.stats_dims", hint, channels=True)
        if ctx.has("epsilon"):
            _check_scalars(ctx)
        s = ctx.tensor("scale")
        return [_y_spec(x), _float_spec(c, s), _float_spec(c, s)]

    def reference(self, ins, outs):
        dy, x, scale, mean, inv, eps = ins
        axes = tuple(i for i in range(x.ndim) if i != 1)
        if mean is None:
            mean, var = _moments(x, axes)
            inv = 1.0 / np.sqrt(var + _scalar(eps))
        return _fit(list(_centered_backward(dy, x, scale, mean, inv, axes)), outs)


# -- layernorm ------------------------------------------------------------------------------------


@register_op
@dataclass(frozen=True, kw_only=True)
class Layernorm(_ScalarRules, Op):
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
    INPUTS = ("input", "scale", "bias", "epsilon")
    OUTPUTS = ("y", "mean", "inv_variance")
    OPTIONAL_INPUTS = frozenset({"scale", "bias"})
    SCALAR_INPUTS = frozenset({"epsilon"})
    norm_forward_phase: NormForwardPhase = NormForwardPhase.TRAINING

    def infer(self, ctx: NodeContext) -> list[TensorSpec]:
        x = _check_input(ctx)
        _check_float(ctx, self.INPUTS)
        stats = _norm_stats_dims(ctx, x)
        _check_scalars(ctx)
        return [_y_spec(x), _float_spec(stats), _float_spec(stats)]

    def reference(self, ins, outs):
        x, scale, bias, eps = ins
        axes = _axes_of(x.shape, _stats_dim(x, scale, bias))
        mean, var = _moments(x, axes)
        inv = 1.0 / np.sqrt(var + _scalar(eps))
        return _fit([_affine((x - mean) * inv, scale, bias), mean, inv], outs)


def _stats_dim(x: np.ndarray, scale: np.ndarray | None, bias: np.ndarray | None) -> tuple[int, ...]:
    """layernorm/rmsnorm stats dims from scale (or bias) as in `_norm_stats_dims`, at run time."""
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
    INPUTS = ("grad", "input", "scale", "mean", "inv_variance")
    OUTPUTS = ("dx", "dscale", "dbias")

    def infer(self, ctx: NodeContext) -> list[TensorSpec]:
        x = _check_input(ctx)
        _check_float(ctx, self.INPUTS)
        _check_grad(ctx, x)
        stats = _norm_stats_dims(ctx, x)
        hint = "pass the layernorm forward's mean and inv_variance (the input's dims, 1 on normalized axes)"
        for role in ("mean", "inv_variance"):
            _check_dims(ctx, role, stats, "norm.stats_dims", hint)
        s = ctx.tensor("scale")
        return [_y_spec(x), _float_spec(s.dim, s), _float_spec(s.dim, s)]

    def reference(self, ins, outs):
        dy, x, scale, mean, inv = ins
        axes = _axes_of(x.shape, mean.shape)
        return _fit(list(_centered_backward(dy, x, scale, mean, inv, axes)), outs)


# -- rmsnorm -------------------------------------------------------------------------------------


@register_op
@dataclass(frozen=True, kw_only=True)
class Rmsnorm(_ScalarRules, Op):
    """RMS normalization over the axes A picked by scale's dims (as in layernorm; stats dims too):

        inv_variance = 1 / sqrt(mean_A(x^2) + epsilon)     (the inverse RMS; no mean is subtracted)
        y            = x * inv_variance * scale + bias      (bias optional)

    inv_variance is an output in TRAINING only (None in INFERENCE).
    """

    kind = "rmsnorm"
    INPUTS = ("input", "scale", "bias", "epsilon")
    OUTPUTS = ("y", "inv_variance")
    OPTIONAL_INPUTS = frozenset({"bias"})
    SCALAR_INPUTS = frozenset({"epsilon"})
    norm_forward_phase: NormForwardPhase = NormForwardPhase.TRAINING

    def infer(self, ctx: NodeContext) -> list[TensorSpec]:
        x = _check_input(ctx)
        _check_float(ctx, self.INPUTS)
        stats = _norm_stats_dims(ctx, x)
        _check_scalars(ctx)
        return [_y_spec(x), _float_spec(stats)]

    def reference(self, ins, outs):
        x, scale, bias, eps = ins
        axes = _axes_of(x.shape, _stats_dim(x, scale, bias))
        inv = 1.0 / np.sqrt(np.square(x).mean(axis=axes, keepdims=True) + _scalar(eps))
        return _fit([_affine(x * inv, scale, bias), inv], outs)


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
    INPUTS = ("grad", "input", "scale", "inv_variance")
    OUTPUTS = ("dx", "dscale", "dbias")

    def infer(self, ctx: NodeContext) -> list[TensorSpec]:
        x = _check_input(ctx)
        _check_float(ctx, self.INPUTS)
        _check_grad(ctx, x)
        stats = _norm_stats_dims(ctx, x)
        _check_dims(ctx, "inv_variance", stats, "norm.stats_dims",
                    "pass the rmsnorm forward's inv_variance (the input's dims, 1 on normalized axes)")
        s = ctx.tensor("scale")
        return [_y_spec(x), _float_spec(s.dim, s), _float_spec(s.dim, s)]

    def reference(self, ins, outs):
        dy, x, scale, r = ins
        axes = _axes_of(x.shape, r.shape)
        g = dy * scale
        dx = r * (g - x * r * r * (g * x).mean(axis=axes, keepdims=True))
        return _fit([dx, _sum_to(dy * x * r, scale.shape), _sum_to(dy, scale.shape)], outs)


# -- instancenorm -----------------------------------------------------------------------------------


@register_op
@dataclass(frozen=True, kw_only=True)
class Instancenorm(_ScalarRules, Op):
    """Instance normalization: per sample and channel, over the spatial axes (input rank >= 3).

        mean         = mean over spatial of x                          dims [N, C, 1, ...]
        inv_variance = 1 / sqrt(mean over spatial of (x - mean)^2 + epsilon)   (biased variance)
        y            = (x - mean) * inv_variance * scale + bias        scale, bias [1, C, 1, ...]

    mean and inv_variance are outputs in TRAINING only (None in INFERENCE).
    """

    kind = "instancenorm"
    INPUTS = ("input", "scale", "bias", "epsilon")
    OUTPUTS = ("y", "mean", "inv_variance")
    SCALAR_INPUTS = frozenset({"epsilon"})
    norm_forward_phase: NormForwardPhase = NormForwardPhase.TRAINING

    def infer(self, ctx: NodeContext) -> list[TensorSpec]:
        x = _check_input(ctx, min_rank=3)
        _check_float(ctx, self.INPUTS)
        c = _per_channel(x)
        hint = "scale and bias of instancenorm are per channel: dims [1, C, 1, ...] (the input's rank)"
        _check_dims(ctx, "scale", c, "norm.scale_dims", hint, channels=True)
        _check_dims(ctx, "bias", c, "norm.bias_dims", hint, channels=True)
        _check_scalars(ctx)
        stats = x.dim[:2] + (1,) * (len(x.dim) - 2)
        return [_y_spec(x), _float_spec(stats), _float_spec(stats)]

    def reference(self, ins, outs):
        x, scale, bias, eps = ins
        mean, var = _moments(x, tuple(range(2, x.ndim)))
        inv = 1.0 / np.sqrt(var + _scalar(eps))
        return _fit([_affine((x - mean) * inv, scale, bias), mean, inv], outs)


@register_op
@dataclass(frozen=True, kw_only=True)
class InstancenormBackward(_ScalarRules, Op):
    """Instance normalization backward (stats over the spatial axes, per sample and channel):

        xhat   = (x - mean) * inv_variance
        dx     = inv_variance * (g - mean_S(g) - xhat * mean_S(g * xhat)),  g = dy * scale
        dscale = sum over N, spatial of dy * xhat
        dbias  = sum over N, spatial of dy

    mean and inv_variance ([N, C, 1, ...]) are the forward's saved stats; with epsilon instead they
    are recomputed from x.
    """

    kind = "instancenorm_backward"
    INPUTS = ("grad", "input", "scale", "mean", "inv_variance", "epsilon")
    OUTPUTS = ("dx", "dscale", "dbias")
    OPTIONAL_INPUTS = frozenset({"mean", "inv_variance", "epsilon"})
    SCALAR_INPUTS = frozenset({"epsilon"})

    def infer(self, ctx: NodeContext) -> list[TensorSpec]:
        x = _check_input(ctx, min_rank=3)
        _check_float(ctx, self.INPUTS)
        _check_grad(ctx, x)
        c = _per_channel(x)
        _check_dims(ctx, "scale", c, "norm.scale_dims",
                    "scale of instancenorm is per channel: dims [1, C, 1, ...] (the input's rank)", channels=True)
        _check_saved_stats(ctx)
        stats = x.dim[:2] + (1,) * (len(x.dim) - 2)
        for role in ("mean", "inv_variance"):
            if ctx.has(role):
                _check_dims(ctx, role, stats, "norm.stats_dims",
                            "pass the instancenorm forward's mean and inv_variance (dims [N, C, 1, ...])",
                            channels=True)
        if ctx.has("epsilon"):
            _check_scalars(ctx)
        s = ctx.tensor("scale")
        return [_y_spec(x), _float_spec(c, s), _float_spec(c, s)]

    def reference(self, ins, outs):
        dy, x, scale, mean, inv, eps = ins
        axes = tuple(range(2, x.ndim))
        if mean is None:
            mean, var = _moments(x, axes)
            inv = 1.0 / np.sqrt(var + _scalar(eps))
        return _fit(list(_centered_backward(dy, x, scale, mean, inv, axes)), outs)


# -- builders (names, argument order and return lists as in cuDNN frontend's Python API) -----------


class _Required:
    def __repr__(self) -> str:
        return "<required>"


_REQUIRED: Any = _Required()  # epsilon comes after optional arguments but has no default (as in cuDNN)


def _need_epsilon(epsilon: Any, op: str) -> None:
    if epsilon is _REQUIRED:
        raise TypeError(f"{op}() missing required argument: 'epsilon'")


def _label(kind: str, name: str) -> str:
    return f"{kind} '{name}'" if name else kind


def _as_phase(value: Any, kind: str, name: str) -> NormForwardPhase:
    """A NormForwardPhase from the enum, its name or value ("TRAINING", "training"), or any enum
    with a matching name (such as cudnn.norm_forward_phase.TRAINING)."""
    if isinstance(value, NormForwardPhase):
        return value
    key = value if isinstance(value, str) else getattr(value, "name", None)
    if isinstance(key, str):
        for phase in NormForwardPhase:
            if key.upper() in (phase.name, phase.value.upper()):
                return phase
    raise AttributeValueError(
        f"norm_forward_phase={value!r} is not a forward phase", op=_label(kind, name), rule="norm.phase",
        hint="pass NormForwardPhase.TRAINING (outputs the stats) or NormForwardPhase.INFERENCE",
    )


def _no_peer_stats(peer_stats: Any, kind: str, name: str) -> None:
    if peer_stats is None or (isinstance(peer_stats, (list, tuple)) and len(peer_stats) == 0):
        return
    raise AttributeValueError(
        "peer_stats (multi-GPU batch norm) is not supported", op=_label(kind, name), rule="norm.peer_stats",
        hint="pass peer_stats=None or []; for multi-GPU training, all-reduce the batch statistics outside the graph",
    )


@graph_method
def batchnorm(self, input: Tensor, scale: Tensor, bias: Tensor, in_running_mean: Tensor | None = None,
              in_running_var: Tensor | None = None, epsilon: Scalar = _REQUIRED, momentum: Scalar | None = None,
              peer_stats: Sequence[Tensor] | None = None, compute_data_type: Any = None,
              name: str = "") -> list[Tensor | None]:
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
    _need_epsilon(epsilon, "batchnorm")
    _no_peer_stats(peer_stats, "batchnorm", name)
    outputs = ["y", "mean", "inv_variance"]
    if in_running_mean is not None and in_running_var is not None and momentum is not None:
        outputs += ["next_running_mean", "next_running_var"]
    return self._add_op(Batchnorm(), [input, scale, bias, in_running_mean, in_running_var, epsilon, momentum],
                        name=name, compute_data_type=compute_data_type, outputs=outputs)


@graph_method
def batchnorm_inference(self, input: Tensor, mean: Tensor, inv_variance: Tensor, scale: Tensor, bias: Tensor,
                        compute_data_type: Any = None, name: str = "") -> Tensor:
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
    return self._add_op(BatchnormInference(), [input, mean, inv_variance, scale, bias], name=name,
                        compute_data_type=compute_data_type)[0]


@graph_method
def batchnorm_backward(self, grad: Tensor, input: Tensor, scale: Tensor, mean: Tensor | None = None,
                       inv_variance: Tensor | None = None, epsilon: Scalar | None = None,
                       peer_stats: Sequence[Tensor] | None = None, compute_data_type: Any = None,
                       name: str = "") -> list[Tensor | None]:
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
    _no_peer_stats(peer_stats, "batchnorm_backward", name)
    return self._add_op(BatchnormBackward(), [grad, input, scale, mean, inv_variance, epsilon], name=name,
                        compute_data_type=compute_data_type)


@graph_method
def layernorm(self, norm_forward_phase: NormForwardPhase | str, input: Tensor, scale: Tensor | None = None,
              bias: Tensor | None = None, epsilon: Scalar = _REQUIRED, compute_data_type: Any = None,
              name: str = "") -> list[Tensor | None]:
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
    _need_epsilon(epsilon, "layernorm")
    phase = _as_phase(norm_forward_phase, "layernorm", name)
    outputs = ["y", "mean", "inv_variance"] if phase is NormForwardPhase.TRAINING else ["y"]
    return self._add_op(Layernorm(norm_forward_phase=phase), [input, scale, bias, epsilon], name=name,
                        compute_data_type=compute_data_type, outputs=outputs)


@graph_method
def layernorm_backward(self, grad: Tensor, input: Tensor, scale: Tensor, mean: Tensor, inv_variance: Tensor,
                       compute_data_type: Any = None, name: str = "") -> list[Tensor | None]:
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
    return self._add_op(LayernormBackward(), [grad, input, scale, mean, inv_variance], name=name,
                        compute_data_type=compute_data_type)


@graph_method
def rmsnorm(self, norm_forward_phase: NormForwardPhase | str, input: Tensor, scale: Tensor,
            bias: Tensor | None = None, epsilon: Scalar = _REQUIRED, compute_data_type: Any = None,
            name: str = "") -> list[Tensor | None]:
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
    _need_epsilon(epsilon, "rmsnorm")
    phase = _as_phase(norm_forward_phase, "rmsnorm", name)
    outputs = ["y", "inv_variance"] if phase is NormForwardPhase.TRAINING else ["y"]
    return self._add_op(Rmsnorm(norm_forward_phase=phase), [input, scale, bias, epsilon], name=name,
                        compute_data_type=compute_data_type, outputs=outputs)


@graph_method
def rmsnorm_backward(self, grad: Tensor, input: Tensor, scale: Tensor, inv_variance: Tensor, has_dbias: bool,
                     compute_data_type: Any = None, name: str = "") -> list[Tensor | None]:
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
    return self._add_op(RmsnormBackward(), [grad, input, scale, inv_variance], name=name,
                        compute_data_type=compute_data_type, outputs=outputs)


@graph_method
def instancenorm(self, norm_forward_phase: NormForwardPhase | str, input: Tensor, scale: Tensor, bias: Tensor,
                 epsilon: Scalar, compute_data_type: Any = None, name: str = "") -> list[Tensor | None]:
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
    phase = _as_phase(norm_forward_phase, "instancenorm", name)
    outputs = ["y", "mean", "inv_variance"] if phase is NormForwardPhase.TRAINING else ["y"]
    return self._add_op(Instancenorm(norm_forward_phase=phase), [input, scale, bias, epsilon], name=name,
                        compute_data_type=compute_data_type, outputs=outputs)


@graph_method
def instancenorm_backward(self, grad: Tensor, input: Tensor, scale: Tensor, mean: Tensor | None = None,
                          inv_variance: Tensor | None = None, compute_data_type: Any = None, name: str = "", *,
                          epsilon: Scalar | None = None) -> list[Tensor | None]:
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
    return self._add_op(InstancenormBackward(), [grad, input, scale, mean, inv_variance, epsilon], name=name,
                        compute_data_type=compute_data_type)
