"""The normalization family's shared rules (ops in opgraph.ops.norm: batchnorm, instancenorm; in
opgraph.ops.layernorm: layernorm, rmsnorm): the forward phase, validation, reference helpers and the
builders' argument handling.

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

NaN and infinities (docs/concepts.md, "NaN, infinities and overflow"): IEEE arithmetic of these
formulas. A NaN in what an element reads (its value, its group's values and statistics, its scale
or bias) makes it NaN in every formula. An infinity in an op's inputs, or a value whose square (or a
product of three of the formula's factors) passes the compute type's range, leaves that op's results
to the engine's formula (one pass or two, Welford, the order of the products): NaN, +-inf, 0 or the
exact value are all correct there.

Stats, running stats, dscale and dbias are FLOAT unless set otherwise; y and dx follow the graph's
default types and keep the input's layout (an NHWC input gives an NHWC y).
epsilon and momentum are scalars: a Python number (baked in), a pass-by-value tensor or a 1-element
tensor.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Union

import numpy as np

from ..core.dtypes import DataType
from ..core.errors import AttributeValueError, DataTypeError, ShapeError
from ..core.ir import Const
from ..core.op import NodeContext, TensorSpec
from ..core.tensor import TensorDesc, packed_strides
from .base import strides_like

if TYPE_CHECKING:
    from ..core.tensor import Tensor

Scalar = Union[float, "Tensor"]  # a Python number, a pass-by-value tensor or a 1-element tensor


class NormForwardPhase(enum.Enum):
    TRAINING = "training"
    INFERENCE = "inference"


# -- validation shared by the family ---------------------------------------------------------------


def check_input(ctx: NodeContext, min_rank: int = 2) -> TensorDesc:
    x = ctx.tensor("input")
    if len(x.dim) < min_rank:
        ctx.error(
            ShapeError,
            f"input 'input' has rank {len(x.dim)} (dims {list(x.dim)}), but this op needs rank >= {min_rank}",
            tensor="input",
            rule="norm.rank",
            hint="give the input an N and a C axis (and spatial axes for instancenorm): dims [N, C, ...]; "
            "add size-1 axes if needed",
        )
    return x


def check_float(ctx: NodeContext, roles: Sequence[str]) -> None:
    for role in roles:
        t = ctx.input(role)
        if isinstance(t, TensorDesc) and not t.data_type.is_floating:
            ctx.error(
                DataTypeError,
                f"input '{role}' has data type {t.data_type.name}; normalizations need floating-point tensors",
                tensor=role,
                rule="norm.dtype",
                hint="declare it FLOAT, HALF or BFLOAT16 (stats and scale/bias are usually FLOAT)",
            )


def check_dims(
    ctx: NodeContext, role: str, want: Sequence[int], rule: str, hint: str, channels: bool = False
) -> TensorDesc:
    """`role` must have dims `want`; with `channels` (a per-channel tensor), one that only differs in
    axis 1 breaks `norm.channels`."""
    t = ctx.tensor(role)
    want = tuple(want)
    if t.dim == want:
        return t
    same_but_c = len(t.dim) == len(want) and all(a == b for i, (a, b) in enumerate(zip(t.dim, want)) if i != 1)
    if channels and same_but_c:
        ctx.error(
            ShapeError,
            f"input '{role}' has {t.dim[1]} channels (dims {list(t.dim)}) but the input has "
            f"{want[1]} (expected dims {list(want)})",
            tensor=role,
            rule="norm.channels",
            hint="axis 1 is C: give every per-channel tensor the input's channel count",
        )
    ctx.error(
        ShapeError, f"input '{role}' has dims {list(t.dim)}, expected {list(want)}", tensor=role, rule=rule, hint=hint
    )


def check_grad(ctx: NodeContext, x: TensorDesc) -> None:
    check_dims(ctx, "grad", x.dim, "norm.grad_dims", "grad is dL/dy of the forward op: it has the forward input's dims")


def scalar_problem(role: str, value: float) -> tuple[str, str, str] | None:
    """epsilon must be >= 0 and momentum in [0, 1] (NaN is neither): (message, rule, hint) or None."""
    if role == "epsilon" and not value >= 0:
        return (f"epsilon={value} is negative or NaN", "norm.epsilon", "use a small positive epsilon such as 1e-5")
    if role == "momentum" and not 0 <= value <= 1:
        return (
            f"momentum={value} is outside [0, 1]",
            "norm.momentum",
            "momentum weighs the batch statistic: running = (1-m)*running + m*batch (PyTorch's default is 0.1)",
        )
    return None


class ScalarRules:
    """epsilon and momentum given at run time are held to the rules of literal ones."""

    def check_scalar(self, role: str, value: float) -> tuple[str, str, str] | None:
        return scalar_problem(role, value)


def check_scalars(ctx: NodeContext, momentum: bool = False) -> None:
    """Literal epsilon must be >= 0 and literal momentum in [0, 1]; pass-by-value ones are checked when
    bound (`check_scalar`), 1-element tensors in memory are not seen on the host."""
    for role in ("epsilon", "momentum") if momentum else ("epsilon",):
        v = ctx.input(role)
        problem = scalar_problem(role, v.value) if isinstance(v, Const) else None
        if problem is not None:
            ctx.error(AttributeValueError, problem[0], rule=problem[1], hint=problem[2])


def check_saved_stats(ctx: NodeContext) -> None:
    """Backward ops take the saved mean and inv_variance, or epsilon to recompute them, not both."""
    saved = [ctx.has("mean"), ctx.has("inv_variance")]
    if (saved == [True, True] and not ctx.has("epsilon")) or (saved == [False, False] and ctx.has("epsilon")):
        return
    given = [r for r in ("mean", "inv_variance", "epsilon") if ctx.has(r)] or ["none of them"]
    ctx.error(
        AttributeValueError,
        f"got {', '.join(given)}: pass both saved stats (mean and inv_variance) or epsilon alone",
        tensor="mean" if ctx.has("mean") else "inv_variance",
        rule="norm.saved_stats",
        hint="pass the forward op's mean and inv_variance outputs (or, for a recompute, only epsilon)",
    )


def per_channel(x: TensorDesc) -> tuple[int, ...]:
    return (1, x.dim[1]) + (1,) * (len(x.dim) - 2)


def norm_stats_dims(ctx: NodeContext, x: TensorDesc) -> tuple[int, ...]:
    """layernorm/rmsnorm stats dims: the input's dim where scale's is 1, 1 where scale's equals the
    input's (a normalized axis). Bias's dims rule without a scale; without either, every axis but the
    first is normalized. `_stats_dim` is the same rule at run time."""
    ref = "scale" if ctx.has("scale") else "bias" if ctx.has("bias") else None
    if ref is None:
        axes = tuple(range(1, len(x.dim)))
    else:
        s = ctx.tensor(ref)
        hint = (
            f"give {ref} the input's rank with, per axis, the input's dim (normalized) or 1 (a batch "
            "axis): input [N, C, H, W] takes [1, C, H, W]; input [rows, hidden] takes [1, hidden]"
        )
        if len(s.dim) != len(x.dim) or any(d not in (1, xd) for d, xd in zip(s.dim, x.dim)):
            ctx.error(
                ShapeError,
                f"input '{ref}' dims {list(s.dim)} do not fit input dims {list(x.dim)}",
                tensor=ref,
                rule=f"norm.{ref}_dims",
                hint=hint,
            )
        axes = tuple(i for i, (d, xd) in enumerate(zip(s.dim, x.dim)) if d == xd)
        if all(x.dim[i] == 1 for i in axes):
            ctx.error(
                ShapeError,
                f"input '{ref}' dims {list(s.dim)} normalize no axis of input dims "
                f"{list(x.dim)} (every axis it matches has size 1)",
                tensor=ref,
                rule=f"norm.{ref}_dims",
                hint=hint,
            )
        if ref == "scale" and ctx.has("bias"):
            check_dims(ctx, "bias", s.dim, "norm.bias_dims", "give bias the same dims as scale")
    return tuple(1 if i in axes else d for i, d in enumerate(x.dim))


def y_spec(x: TensorDesc) -> TensorSpec:
    return TensorSpec(x.dim, strides_like(x.dim, x))


def float_spec(dim: Sequence[int], like: TensorDesc | None = None) -> TensorSpec:
    dim = tuple(dim)
    return TensorSpec(dim, strides_like(dim, like) if like is not None else packed_strides(dim), DataType.FLOAT)


# -- reference helpers (float64 arrays in logical dims) ---------------------------------------------


def as_float(v: np.ndarray) -> float:
    return float(np.asarray(v).reshape(()))


def moments(x: np.ndarray, axes: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """mean and biased variance over `axes`, keeping dims."""
    mean = x.mean(axis=axes, keepdims=True)
    return mean, np.square(x - mean).mean(axis=axes, keepdims=True)


def affine(xhat: np.ndarray, scale: np.ndarray | None, bias: np.ndarray | None) -> np.ndarray:
    y = xhat if scale is None else xhat * scale
    return y if bias is None else y + bias


def sum_to(a: np.ndarray, dim: Sequence[int]) -> np.ndarray:
    """Sum `a` over the axes where `dim` is 1 (a broadcast parameter's gradient)."""
    axes = tuple(i for i, d in enumerate(dim) if d == 1 and a.shape[i] != 1)
    return a.sum(axis=axes, keepdims=True)


def centered_backward(dy, x, scale, mean, inv, axes):
    """Gradients of y = (x - mean) * inv * scale + bias when mean and inv are x's stats over `axes`:
    dx = inv * (g - mean_A(g) - xhat * mean_A(g * xhat)), g = dy * scale, xhat = (x - mean) * inv."""
    xhat = (x - mean) * inv
    g = dy * scale
    dx = inv * (g - g.mean(axis=axes, keepdims=True) - xhat * (g * xhat).mean(axis=axes, keepdims=True))
    return dx, sum_to(dy * xhat, scale.shape), sum_to(dy, scale.shape)


def fit_outputs(arrays: list[np.ndarray | None], outs: list[TensorDesc | None]) -> list[np.ndarray | None]:
    return [None if a is None or d is None else np.broadcast_to(a, d.dim) for a, d in zip(arrays, outs)]


class Required:
    def __repr__(self) -> str:
        return "<required>"


REQUIRED: Any = Required()  # epsilon comes after optional arguments but has no default (as in cuDNN)


def need_epsilon(epsilon: Any, op: str) -> None:
    if epsilon is REQUIRED:
        raise TypeError(f"{op}() missing required argument: 'epsilon'")


def op_label(kind: str, name: str) -> str:
    return f"{kind} '{name}'" if name else kind


def as_phase(value: Any, kind: str, name: str) -> NormForwardPhase:
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
        f"norm_forward_phase={value!r} is not a forward phase",
        op=op_label(kind, name),
        rule="norm.phase",
        hint="pass NormForwardPhase.TRAINING (outputs the stats) or NormForwardPhase.INFERENCE",
    )


def no_peer_stats(peer_stats: Any, kind: str, name: str) -> None:
    if peer_stats is None or (isinstance(peer_stats, (list, tuple)) and len(peer_stats) == 0):
        return
    raise AttributeValueError(
        "peer_stats (multi-GPU batch norm) is not supported",
        op=op_label(kind, name),
        rule="norm.peer_stats",
        hint="pass peer_stats=None or []; for multi-GPU training, all-reduce the batch statistics outside the graph",
    )
