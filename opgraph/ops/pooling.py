"""Pooling: resample (max, average including or excluding padding), optionally with the max index.

resample(input, mode, window, stride, pre_padding, post_padding) pools the spatial axes of an
[N, C, spatial...] input (1, 2 or 3 spatial axes). Per spatial axis d, with x the input size,
w the window, s the stride, pre / post the paddings:

    out[d] = (x[d] + pre[d] + post[d] - w[d]) // s[d] + 1

Output position o reads the window of input positions  o*s - pre + k,  k in [0, w), per axis.
Positions outside [0, x) are padding:

    MAX                  y = max over the window, padding counts as -inf  (NaN propagates)
    AVG_INCLUDE_PADDING  y = (sum over the window, padding counts as 0) / prod(w)
    AVG_EXCLUDE_PADDING  y = (sum over the window's non-padded positions) / (their count)

index (only with generate_index=True, only for MAX): the flat row-major position of the maximum
*within its window*, k_0 * w_1 * w_2 + k_1 * w_2 + k_2 for a 3-D window (padded positions are
counted, so the index is independent of where the window sits); the first maximum wins a tie, the
first NaN wins over numbers. Its type defaults to INT8, as in cuDNN's samples; the type must hold
prod(w) - 1 (set INT32 on the index for windows of more than 128 elements). Dims: those of y.

Rules: window, stride and paddings have one entry per spatial axis (or a single entry, used for
every axis); window >= 1, stride >= 1, padding >= 0; each padding < window in its axis (so every
window overlaps the input: MAX never sees only padding and AVG_EXCLUDE_PADDING never divides by 0;
PyTorch's rule, padding <= window // 2, is stricter); out >= 1.

NaN and infinities (docs/concepts.md, "NaN, infinities and overflow"): MAX as above; the averages
are IEEE sums (a NaN in the window, or +inf and -inf together, give NaN; an infinity gives that
infinity), either answer where the sum's order decides (a partial sum passing the compute type's
range in some orders only).

The padding value is the mode's (cuDNN's NEG_INF_PAD for MAX, ZERO_PAD for the averages); stride
defaults to the window, as in PyTorch.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.dtypes import DataType
from ..core.errors import AttributeValueError, DataflowError, DataTypeError, ShapeError
from ..core.op import NodeContext, Op, TensorSpec, graph_method, register_op
from ..core.tensor import TensorDesc
from .base import batch_only_refusal, strides_like


class ResampleMode(enum.Enum):
    MAX = "max"
    AVG_INCLUDE_PADDING = "avg_include_padding"
    AVG_EXCLUDE_PADDING = "avg_exclude_padding"
    # cuDNN's C++ names for the same modes
    MAXPOOL = "max"
    AVGPOOL_INCLUDE_PADDING = "avg_include_padding"
    AVGPOOL_EXCLUDE_PADDING = "avg_exclude_padding"

    def __repr__(self) -> str:
        return f"ResampleMode.{self.name}"


_GEOMETRY = ("window", "stride", "pre_padding", "post_padding")


@dataclass(frozen=True)
class PoolGeometry:
    """Per-spatial-axis window, stride, paddings and output sizes of one resample."""

    window: tuple[int, ...]
    stride: tuple[int, ...]
    pre_padding: tuple[int, ...]
    post_padding: tuple[int, ...]
    out: tuple[int, ...]


@register_op
@dataclass(frozen=True, kw_only=True)
class Resample(Op):
    """Max / average pooling over the spatial axes of [N, C, spatial...] (see the module docstring)."""

    kind = "resample"
    DYNAMIC = True
    INPUTS = ("input",)
    OUTPUTS = ("output", "index")
    mode: ResampleMode = ResampleMode.MAX
    window: tuple[int, ...]
    stride: tuple[int, ...]
    pre_padding: tuple[int, ...] = (0,)
    post_padding: tuple[int, ...] = (0,)
    generate_index: bool = False

    def geometry(self, ctx: NodeContext | None, x: TensorDesc | tuple[int, ...]) -> PoolGeometry:
        """Validate the attributes against the input and compute the output sizes. With ctx None
        (reference), the attributes are known to be valid."""
        dims = x.dim if isinstance(x, TensorDesc) else tuple(x)

        def fail(cls, msg, rule, hint, tensor="input"):
            assert ctx is not None
            ctx.error(cls, msg, tensor=tensor, rule=rule, hint=hint)

        nsp = len(dims) - 2
        if ctx is not None and not 1 <= nsp <= 3:
            fail(
                ShapeError,
                f"input dims {list(dims)} have rank {len(dims)}; resample pools [N, C, spatial...] "
                "with 1, 2 or 3 spatial axes",
                "resample.rank",
                "give the input rank 3 (NCW), 4 (NCHW) or 5 (NCDHW); NHWC is a matter of strides",
            )
        values: dict[str, tuple[int, ...]] = {}
        for attr in _GEOMETRY:
            v = tuple(getattr(self, attr))
            if len(v) == 1:
                v = v * nsp
            if ctx is not None and len(v) != nsp:
                fail(
                    AttributeValueError,
                    f"{attr} {list(getattr(self, attr))} has {len(getattr(self, attr))} entries but the input "
                    f"{list(dims)} has {nsp} spatial axes",
                    f"resample.{attr}_length",
                    f"give {attr} one entry per spatial axis ({nsp}), or a single value for all of them",
                )
            values[attr] = v
        w, s, pre, post = (values[a] for a in _GEOMETRY)
        if ctx is not None:
            if any(v < 1 for v in w):
                fail(
                    AttributeValueError,
                    f"window {list(w)} has an entry below 1",
                    "resample.window_value",
                    "every window extent must be >= 1",
                )
            if any(v < 1 for v in s):
                fail(
                    AttributeValueError,
                    f"stride {list(s)} has an entry below 1",
                    "resample.stride_value",
                    "every stride must be >= 1",
                )
            if any(v < 0 for v in pre + post):
                fail(
                    AttributeValueError,
                    f"padding pre {list(pre)} / post {list(post)} has a negative entry",
                    "resample.padding_negative",
                    "paddings must be >= 0",
                )
            for axis in range(nsp):
                if pre[axis] >= w[axis] or post[axis] >= w[axis]:
                    fail(
                        AttributeValueError,
                        f"padding (pre {pre[axis]}, post {post[axis]}) of spatial axis {axis} is not below the "
                        f"window {w[axis]}: a window could hold padding only",
                        "resample.padding_window",
                        f"use paddings below {w[axis]} in that axis (PyTorch allows at most {w[axis] // 2})",
                    )
        out = tuple((dims[2 + a] + pre[a] + post[a] - w[a]) // s[a] + 1 for a in range(nsp))
        if ctx is not None and any(o < 1 for o in out):
            axis = next(a for a, o in enumerate(out) if o < 1)
            fail(
                ShapeError,
                f"spatial axis {axis} of size {dims[2 + axis]} with padding {pre[axis]}+{post[axis]} is smaller "
                f"than the window {w[axis]}: the output would have {out[axis]} positions",
                "resample.output_size",
                "use a smaller window or more padding, or a larger input",
            )
        return PoolGeometry(w, s, pre, post, out)

    def dynamic_refusal(self, ctx: NodeContext) -> str | None:
        return batch_only_refusal(ctx, ("input",), "resample")

    def infer(self, ctx: NodeContext) -> list[TensorSpec]:
        x = ctx.tensor("input")
        geo = self.geometry(ctx, x)
        dim = x.dim[:2] + geo.out
        stride = strides_like(dim, x)
        return [TensorSpec(dim, stride), TensorSpec(dim, stride, DataType.INT8)]

    def check(self, ctx: NodeContext) -> None:
        if self.generate_index and self.mode is not ResampleMode.MAX:
            ctx.error(
                AttributeValueError,
                f"generate_index=True is only defined for MAX pooling, not {self.mode.name}",
                tensor="input",
                rule="resample.index_mode",
                hint="drop generate_index, or use mode=ResampleMode.MAX",
            )
        index = ctx.output("index")
        if (index is not None) != self.generate_index:
            ctx.error(
                DataflowError,
                f"the index output is {'present' if index is not None else 'absent'} but generate_index="
                f"{self.generate_index}",
                tensor="input",
                rule="resample.index_output",
                hint="produce the index output exactly when generate_index=True",
            )
        if isinstance(index, TensorDesc):
            n = math.prod(self.geometry(None, ctx.tensor("input").dim).window)
            dt = index.data_type
            if not dt.is_integer:
                ctx.error(
                    DataTypeError,
                    f"the index output has type {dt.name}; it holds window positions",
                    tensor="index",
                    rule="resample.index_type",
                    hint="give the index an integer type (INT8, INT32)",
                )
            if np.iinfo(dt.numpy).max < n - 1:
                ctx.error(
                    DataTypeError,
                    f"the index output's type {dt.name} cannot hold window positions up to {n - 1} "
                    f"(window of {n} elements)",
                    tensor="index",
                    rule="resample.index_range",
                    hint="set the index to a wider type: index.set_data_type(DataType.INT32)",
                )

    def reference(self, ins, outs):
        x = ins[0]
        assert x is not None
        geo = self.geometry(None, x.shape)
        nsp = x.ndim - 2
        pads = [(0, 0), (0, 0)] + list(zip(geo.pre_padding, geo.post_padding))
        is_max = self.mode is ResampleMode.MAX

        def windows(a: np.ndarray) -> np.ndarray:
            # [..., out..., prod(window)]: the strided windows of an already padded array
            v = np.lib.stride_tricks.sliding_window_view(a, geo.window, axis=tuple(range(a.ndim - nsp, a.ndim)))
            lead = a.ndim - nsp
            v = v[(slice(None),) * lead + tuple(slice(None, None, s) for s in geo.stride)]
            return v.reshape(v.shape[: lead + nsp] + (-1,))

        xp = np.pad(x, pads, constant_values=-np.inf if is_max else 0.0)
        v = windows(xp)
        index = None
        if is_max:
            y = np.max(v, axis=-1)
            if outs[1] is not None:
                index = np.argmax(v, axis=-1).astype(np.float64)  # first max, first NaN
        else:
            total = np.sum(v, axis=-1)
            if self.mode is ResampleMode.AVG_INCLUDE_PADDING:
                y = total / math.prod(geo.window)
            else:
                ones = np.pad(np.ones(x.shape[2:]), pads[2:], constant_values=0.0)
                y = total / np.sum(windows(ones), axis=-1)
        return [y, index]


def _ints(value: Any, what: str, name: str) -> tuple[int, ...]:
    items = (value,) if isinstance(value, (int, np.integer)) else value
    try:
        out = tuple(items)
    except TypeError:
        out = None
    if out is None or not out or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in out):
        raise AttributeValueError(
            f"{what} must be an int or a list of ints, got {value!r}",
            op=f"resample '{name}'",
            rule=f"resample.{what}_type",
            hint=f"pass {what} as e.g. [2, 2] (one entry per spatial axis)",
        )
    return tuple(int(v) for v in out)


@graph_method
def resample(
    self,
    input,
    mode=ResampleMode.MAX,
    window=None,
    stride=None,
    pre_padding=None,
    post_padding=None,
    generate_index=False,
    compute_data_type=None,
    name="",
    *,
    padding=None,
):
    """Max or average pooling over the spatial axes of an [N, C, spatial...] tensor.

    Shapes: input [N, C, *spatial] (1-3 spatial axes) -> Y [N, C, *out] with
    `out_d = (in_d + pre_d + post_d - window_d) // stride_d + 1`; index (MAX only) has Y's dims.

    Layouts: any strides (NHWC is the fast one); Y takes the input's axis order.

    Types: float inputs; Y in the graph's intermediate / io type; index INT8 by default (set INT32 on
    it for windows of more than 128 elements).

    Formula: output o reads input positions `o*stride - pre_padding + k`, k in [0, window). MAX: the
    maximum (padding is -inf); AVG_INCLUDE_PADDING: the sum / prod(window) (padding is 0);
    AVG_EXCLUDE_PADDING: the mean of the non-padded positions. index: the maximum's flat row-major
    position within its window.

    Args:
        input: x [N, C, *spatial].
        mode: ResampleMode.MAX, AVG_INCLUDE_PADDING or AVG_EXCLUDE_PADDING, or its name.
        window: the window per spatial axis (an int: every axis); required.
        stride: the step per spatial axis (default: the window).
        pre_padding: padding before each spatial axis (each < its window).
        post_padding: padding after each spatial axis.
        generate_index: also output the index of each maximum (MAX only).
        compute_data_type: the type averages are summed in.
        name: the op's name.
        padding: (keyword) pre and post padding at once.

    Returns:
        [Y, index]; index is None unless generate_index.

    Example:
        ```python
        y, _ = g.resample(x, mode="MAX", window=3, stride=2, padding=1)      # ResNet's stem pool
        ```
    """
    try:
        mode = ResampleMode[mode.upper()] if isinstance(mode, str) else ResampleMode(mode)
    except (KeyError, ValueError):
        raise AttributeValueError(
            f"mode {mode!r} is not a resample mode",
            op=f"resample '{name}'",
            rule="resample.mode",
            hint="pass MAX, AVG_INCLUDE_PADDING or AVG_EXCLUDE_PADDING (an opgraph.ResampleMode or its name)",
        ) from None
    if window is None:
        raise TypeError("resample() needs a window, e.g. window=[2, 2]")
    if padding is not None and (pre_padding is not None or post_padding is not None):
        raise AttributeValueError(
            "padding is given together with pre_padding/post_padding",
            op=f"resample '{name}'",
            rule="resample.padding_conflict",
            hint="pass either padding (both sides) or pre_padding/post_padding",
        )
    if padding is not None:
        pre_padding = post_padding = padding
    w = _ints(window, "window", name)
    op = Resample(
        mode=mode,
        window=w,
        stride=w if stride is None else _ints(stride, "stride", name),
        pre_padding=(0,) if pre_padding is None else _ints(pre_padding, "pre_padding", name),
        post_padding=(0,) if post_padding is None else _ints(post_padding, "post_padding", name),
        generate_index=bool(generate_index),
    )
    outputs = ["output", "index"] if generate_index else ["output"]
    y, index = self._add_op(op, [input], name=name, compute_data_type=compute_data_type, outputs=outputs)
    return [y, index]
