"""Pooling's backward: the gradient of `resample` with respect to its input, as autodiff emits it
(autodiff/rules_pooling.py; no builder). Per spatial axis d: window w, stride s, paddings pre / post,
as resample's (one value: every axis).

    resample_avg_backward(grad; mode, in_dim, window, stride, pre_padding, post_padding) -> dx
        dx[i] = sum over the windows o that hold i of dy[o] / count(o), count = prod(window)
        (AVG_INCLUDE_PADDING) or the number of non-padded positions of o (AVG_EXCLUDE_PADDING);
        dx has dims in_dim (the forward input's)
    resample_max_backward(grad, input; window, stride, pre_padding, post_padding) -> dx
        dx[i] = sum over the windows o whose first maximum (padding is -inf) is i of dy[o]
        (PyTorch's rule: one position per window gets the gradient, the first one on a tie); input is
        the forward's input x, whose dims dx has

dy (`grad`) has exactly the pooled dims: N, C and (in + pre + post - w) // s + 1 per axis (no
broadcasting). dx is packed in dy's axis order, of the graph's default type. No other op expresses
them (average pooling's backward is a transposed depthwise convolution with a constant filter, and
graphs have no constant tensors; max pooling's scatters each gradient to its window's argmax).
Before they were typed ops, opgraph emitted them as custom ops of these names with comma-separated
text parameters; such graph files load as these ops (ops/custom.py, LEGACY_CUSTOM).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from types import EllipsisType
from typing import NoReturn

import numpy as np

from ..core.errors import AttributeValueError, GraphError, ShapeError
from ..core.op import NodeContext, Op, TensorSpec, register_op
from .base import batch_only_refusal, strides_like
from .custom import LEGACY_CUSTOM, Param
from .pooling import PoolGeometry, ResampleMode

_AVERAGES = (ResampleMode.AVG_INCLUDE_PADDING, ResampleMode.AVG_EXCLUDE_PADDING)
_GEOMETRY = ("window", "stride", "pre_padding", "post_padding")


@dataclass(frozen=True, kw_only=True)
class PoolBackward(Op):
    """What both pooling backward ops share: the forward's geometry, and its checks."""

    OUTPUTS = ("dx",)
    DYNAMIC = True  # a dynamic batch (dim 0 of every operand) only
    window: tuple[int, ...]
    stride: tuple[int, ...]
    pre_padding: tuple[int, ...] = (0,)
    post_padding: tuple[int, ...] = (0,)

    def dynamic_refusal(self, ctx: NodeContext) -> str | None:
        for role in self.input_roles():
            why = batch_only_refusal(ctx, (role,), self.kind)
            if why is not None:
                return why
        return None

    def geometry(
        self, dy_dims: tuple[int, ...], in_dims: tuple[int, ...], ctx: NodeContext | None = None
    ) -> PoolGeometry:
        """Window, stride, paddings per spatial axis and the pooled sizes, checked against dy's and the
        input's dims: 1-3 spatial axes, windows and strides of at least 1, paddings of at least 0, dy of
        exactly the pooled dims. A typed error otherwise (through `ctx` when given)."""

        def fail(cls: type[GraphError], message: str, hint: str) -> NoReturn:
            rule = "pooling_backward.geometry"
            if ctx is not None:
                ctx.error(cls, message, tensor="grad", rule=rule, hint=hint)
            raise cls(f"{self.kind}: {message}", rule=rule, hint=hint)

        nsp = len(in_dims) - 2
        if not 1 <= nsp <= 3:
            fail(
                ShapeError,
                f"the input has {len(in_dims)} dims; pooling takes [N, C, 1 to 3 spatial]",
                "pool a tensor of rank 3, 4 or 5",
            )
        values = []
        for name, low in zip(_GEOMETRY, (1, 1, 0, 0)):
            v = tuple(getattr(self, name))
            v = v * nsp if len(v) == 1 else v
            if len(v) != nsp or min(v) < low:
                fail(
                    AttributeValueError,
                    f"{name} {list(v)} needs {nsp} values of at least {low} (one per spatial axis)",
                    f"give {name} for every spatial axis",
                )
            values.append(v)
        w, st, pre, post = values
        out = tuple((d + a + b - k) // t + 1 for d, a, b, k, t in zip(in_dims[2:], pre, post, w, st))
        want = (*in_dims[:2], *out)
        if min(out) < 1 or tuple(dy_dims) != want:
            fail(
                ShapeError,
                f"dy has dims {list(dy_dims)}; pooling {list(in_dims)} with window {list(w)}, stride "
                f"{list(st)}, padding {list(pre)} / {list(post)} gives {list(want)}",
                "pass the gradient of the pooled output, of the pooled output's dims",
            )
        return PoolGeometry(w, st, pre, post, out)

    def normalize(self, ctx: NodeContext) -> Op:
        """One window / stride / padding value per spatial axis (a single value given means every axis)."""
        nsp = len(self.in_dims(ctx)) - 2
        full = {n: getattr(self, n) * nsp for n in _GEOMETRY if len(getattr(self, n)) == 1 and nsp > 1}
        return replace(self, **full) if full else self

    def in_dims(self, ctx: NodeContext) -> tuple[int, ...]:
        raise NotImplementedError

    def infer(self, ctx: NodeContext) -> list[TensorSpec]:
        dy = ctx.tensor("grad")
        dims = self.in_dims(ctx)
        self.geometry(dy.dim, dims, ctx)
        return [TensorSpec(dims, strides_like(dims, dy))]


def _scatter(
    contrib: Callable[[int, tuple[int, ...]], np.ndarray],
    dims: Sequence[int],
    out: Sequence[int],
    window: Sequence[int],
    stride: Sequence[int],
    pre: Sequence[int],
    post: Sequence[int],
) -> np.ndarray:
    """Sum, per window tap, contrib(tap number, tap) (an array of dy's dims) onto the padded input
    positions o*s + tap, then crop the padding: a float64 array of `dims`."""
    padded = [d + p + q for d, p, q in zip(dims[2:], pre, post)]
    dxp = np.zeros((*dims[:2], *padded))
    for k, tap in enumerate(np.ndindex(*window)):
        target = tuple(slice(t, t + (o - 1) * s + 1, s) for t, o, s in zip(tap, out, stride))
        at: tuple[EllipsisType | slice, ...] = (Ellipsis, *target)
        dxp[at] += contrib(k, tap)
    crop: tuple[EllipsisType | slice, ...] = (Ellipsis, *(slice(p, p + d) for p, d in zip(pre, dims[2:])))
    return dxp[crop]


@register_op
@dataclass(frozen=True, kw_only=True)
class ResampleAvgBackward(PoolBackward):
    """The gradient of average pooling (see the module docstring); dx has dims `in_dim`."""

    kind = "resample_avg_backward"
    INPUTS = ("grad",)
    mode: ResampleMode = ResampleMode.AVG_INCLUDE_PADDING
    in_dim: tuple[int, ...]

    def in_dims(self, ctx: NodeContext) -> tuple[int, ...]:
        if self.mode not in _AVERAGES:
            ctx.error(
                AttributeValueError,
                f"mode {self.mode.name} is not an average pooling mode",
                tensor="grad",
                rule="pooling_backward.mode",
                hint="mode AVG_INCLUDE_PADDING or AVG_EXCLUDE_PADDING",
            )
        return tuple(self.in_dim)

    def reference(self, ins, outs):
        dy = ins[0]
        assert dy is not None
        dims = tuple(self.in_dim)
        geo = self.geometry(dy.shape, dims)
        w, s, pre, post = geo.window, geo.stride, geo.pre_padding, geo.post_padding
        if self.mode is ResampleMode.AVG_INCLUDE_PADDING:
            g = dy / math.prod(w)
        else:
            ones = np.pad(np.ones(dims[2:]), list(zip(pre, post)))
            v = np.lib.stride_tricks.sliding_window_view(ones, w)
            v = v[tuple(slice(None, None, st) for st in s)]
            g = dy / v.reshape(*v.shape[: len(w)], -1).sum(axis=-1)
        return [_scatter(lambda k, tap: g, dims, dy.shape[2:], w, s, pre, post)]


@register_op
@dataclass(frozen=True, kw_only=True)
class ResampleMaxBackward(PoolBackward):
    """The gradient of max pooling (see the module docstring); `input` is the forward's input."""

    kind = "resample_max_backward"
    INPUTS = ("grad", "input")

    def in_dims(self, ctx: NodeContext) -> tuple[int, ...]:
        return ctx.tensor("input").dim

    def reference(self, ins, outs):
        dy, x = ins
        assert dy is not None and x is not None
        geo = self.geometry(dy.shape, x.shape)
        w, s, pre, post = geo.window, geo.stride, geo.pre_padding, geo.post_padding
        nsp = len(w)
        xp = np.pad(x, [(0, 0), (0, 0), *zip(pre, post)], constant_values=-np.inf)
        v = np.lib.stride_tricks.sliding_window_view(xp, w, axis=tuple(range(2, 2 + nsp)))
        strided = (slice(None), slice(None), *(slice(None, None, st) for st in s))
        v = v[strided]
        arg = np.argmax(v.reshape(*v.shape[: 2 + nsp], -1), axis=-1)  # the first maximum (or NaN)
        return [_scatter(lambda k, tap: np.where(arg == k, dy, 0.0), x.shape, dy.shape[2:], w, s, pre, post)]


# -- the custom ops these were (graph files written before they were typed ops) ----------------------


def _ints(params: dict[str, Param], name: str, op_name: str) -> tuple[int, ...]:
    try:
        text = str(params[name])
        return tuple(int(v) for v in text.split(",")) if text else ()
    except (KeyError, ValueError) as err:
        raise AttributeValueError(
            f"{op_name}: window, stride, pre_padding and post_padding must be comma-separated "
            f"ints ({type(err).__name__}: {err})",
            rule="pooling_backward.geometry",
            hint="build the op through autodiff's resample rule",
        ) from None


def _geometry_params(params: dict[str, Param], op_name: str) -> dict[str, tuple[int, ...]]:
    return {name: _ints(params, name, op_name) for name in _GEOMETRY}


def _avg_from_params(params: dict[str, Param]) -> ResampleAvgBackward:
    kind = ResampleAvgBackward.kind
    mode = next((m for m in _AVERAGES if m.value == params.get("mode")), None)
    if mode is None:
        raise AttributeValueError(
            f"{kind}: mode {params.get('mode')!r} is not an average pooling mode",
            rule="pooling_backward.mode",
            hint="mode='avg_include_padding' or 'avg_exclude_padding'",
        )
    return ResampleAvgBackward(mode=mode, in_dim=_ints(params, "in_dim", kind), **_geometry_params(params, kind))


def _max_from_params(params: dict[str, Param]) -> ResampleMaxBackward:
    return ResampleMaxBackward(**_geometry_params(params, ResampleMaxBackward.kind))


LEGACY_CUSTOM.register(ResampleAvgBackward.kind, _avg_from_params)
LEGACY_CUSTOM.register(ResampleMaxBackward.kind, _max_from_params)

# (the op kinds, under the names the modules that emit and run them used)
AVG_BACKWARD = ResampleAvgBackward.kind
MAX_BACKWARD = ResampleMaxBackward.kind
