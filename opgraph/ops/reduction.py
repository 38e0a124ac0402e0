"""Reductions: reduction(input, mode) over the axes where the output's dim is 1, and genstats.

reduction (cuDNN: the axes to reduce are read off the output tensor's dims, so the user must
``set_dim`` the output). With x the input, y the output, both of rank r, axis a is

    reduced  when y.dim[a] == 1 and x.dim[a] > 1
    kept     when y.dim[a] == x.dim[a]
    (anything else is a ShapeError naming the output)

and, with the sums and products over the reduced axes R (y keeps a 1 in them):

    ADD           sum_R x
    MUL           prod_R x
    MIN / MAX     min_R x / max_R x             (NaN propagates)
    AMAX          max_R |x|
    AVG           sum_R x / |R|                 (|R| = number of reduced elements)
    NORM1         sum_R |x|
    NORM2         sqrt(sum_R x^2)
    MUL_NO_ZEROS  prod_R (x if x != 0 else 1)   (all zeros give 1, the empty product)

The output's type defaults to FLOAT (cuDNN: "the output of a reduction has to be fp32"), whatever
the graph's io / intermediate types are; set_data_type overrides it.

genstats(input) -> [sum, sq_sum], per channel (axis 1) of an [N, C, spatial...] input:

    sum[0, c, 0...]    = sum_{n, spatial} x[n, c, ...]
    sq_sum[0, c, 0...] = sum_{n, spatial} x[n, c, ...]^2

both of dims [1, C, 1, ...] and type FLOAT by default (it is not mean / inv_variance).

NaN and infinities (docs/concepts.md, "NaN, infinities and overflow"): IEEE arithmetic. A NaN among
the reduced elements gives NaN, +inf and -inf among the terms of a sum give NaN, an exact result
beyond the output type is +-inf; where the order of a sum or product decides (a partial result that
passes the compute type's range in some orders only) either answer is correct.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from ..core.dtypes import DataType
from ..core.errors import AttributeValueError, ShapeError
from ..core.op import NodeContext, Op, TensorSpec, graph_method, register_op
from ..core.tensor import TensorDesc
from .base import strides_like


class ReductionMode(enum.Enum):
    ADD = "add"
    MUL = "mul"
    MIN = "min"
    MAX = "max"
    AMAX = "amax"
    AVG = "avg"
    NORM1 = "norm1"
    NORM2 = "norm2"
    MUL_NO_ZEROS = "mul_no_zeros"

    def __repr__(self) -> str:
        return f"ReductionMode.{self.name}"


def reduced_axes(in_dim: tuple[int, ...], out_dim: tuple[int, ...]) -> tuple[int, ...]:
    """The axes a reduction from `in_dim` to `out_dim` reduces (out 1 where in > 1)."""
    return tuple(a for a, (i, o) in enumerate(zip(in_dim, out_dim)) if o == 1 and i != 1)


def _reduce(mode: ReductionMode, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    R = ReductionMode
    with np.errstate(all="ignore"):
        if mode is R.ADD:
            return np.sum(x, axis=axes, keepdims=True)
        if mode is R.MUL:
            return np.prod(x, axis=axes, keepdims=True)
        if mode is R.MIN:
            return np.min(x, axis=axes, keepdims=True)
        if mode is R.MAX:
            return np.max(x, axis=axes, keepdims=True)
        if mode is R.AMAX:
            return np.max(np.abs(x), axis=axes, keepdims=True)
        if mode is R.AVG:
            return np.mean(x, axis=axes, keepdims=True)
        if mode is R.NORM1:
            return np.sum(np.abs(x), axis=axes, keepdims=True)
        if mode is R.NORM2:
            return np.sqrt(np.sum(x * x, axis=axes, keepdims=True))
        if mode is R.MUL_NO_ZEROS:
            return np.prod(np.where(x == 0, 1.0, x), axis=axes, keepdims=True)
    raise AssertionError(mode)


@register_op
@dataclass(frozen=True, kw_only=True)
class Reduction(Op):
    """y = reduce_mode(x) over the axes where y's dim is 1 and x's is not (see the module docstring)."""

    kind = "reduction"
    DYNAMIC = True
    INPUTS = ("input",)
    OUTPUTS = ("output",)
    mode: ReductionMode

    def infer(self, ctx: NodeContext) -> list[TensorSpec]:
        x = ctx.tensor("input")
        out = ctx.output("output")
        dim = None if out is None else out.dim  # the user's set_dim says which axes reduce
        stride = None if dim is None else strides_like(dim, x)
        return [TensorSpec(None, stride, DataType.FLOAT)]

    def check(self, ctx: NodeContext) -> None:
        x = ctx.tensor("input")
        y = ctx.output("output")
        assert isinstance(y, TensorDesc)
        if len(y.dim) != len(x.dim):
            ctx.error(
                ShapeError,
                f"output dims {list(y.dim)} have rank {len(y.dim)} but the input dims {list(x.dim)} have "
                f"rank {len(x.dim)}",
                tensor="output",
                rule="reduction.rank",
                hint="give the output the input's rank, with 1 in every reduced axis (a per-row sum of "
                f"{list(x.dim)} is {list(x.dim[:-1]) + [1]})",
            )
        bad = [a for a, (i, o) in enumerate(zip(x.dim, y.dim)) if o != i and o != 1]
        if bad:
            a = bad[0]
            ctx.error(
                ShapeError,
                f"output dims {list(y.dim)} do not reduce input dims {list(x.dim)}: axis {a} is {y.dim[a]}, "
                f"neither {x.dim[a]} (kept) nor 1 (reduced)",
                tensor="output",
                rule="reduction.dims",
                hint="set each output dim to the input's (kept axis) or to 1 (reduced axis)",
            )

    def reference(self, ins, outs):
        x = ins[0]
        out = outs[0]
        assert x is not None and out is not None
        axes = reduced_axes(x.shape, out.dim)  # may be empty: each element reduced on its own
        return [_reduce(self.mode, x, axes).reshape(out.dim)]


@register_op
@dataclass(frozen=True, kw_only=True)
class GenStats(Op):
    """sum and sum of squares per channel (axis 1) of an [N, C, spatial...] input."""

    kind = "genstats"
    DYNAMIC = True
    INPUTS = ("input",)
    OUTPUTS = ("sum", "sq_sum")

    def infer(self, ctx: NodeContext) -> list[TensorSpec]:
        x = ctx.tensor("input")
        if len(x.dim) < 2:
            ctx.error(
                ShapeError,
                f"input dims {list(x.dim)} have rank {len(x.dim)}; genstats needs [N, C, ...]",
                tensor="input",
                rule="genstats.rank",
                hint="give the input at least two axes, channels in axis 1",
            )
        dim = (1, x.dim[1]) + (1,) * (len(x.dim) - 2)
        spec = TensorSpec(dim, strides_like(dim, x), DataType.FLOAT)
        return [spec, spec]

    def reference(self, ins, outs):
        x = ins[0]
        assert x is not None
        axes = tuple(a for a in range(x.ndim) if a != 1)
        s = np.sum(x, axis=axes, keepdims=True)
        sq = np.sum(x * x, axis=axes, keepdims=True)
        return [s, sq]


# -- builders (names and keyword arguments as in cuDNN frontend's Python API) -----------------------


@graph_method
def reduction(self, input, mode, compute_data_type=None, name=""):
    """Reduce `input` over the axes where the output's dims are 1 (set them with `set_dim`, as in cuDNN).

    Shapes: input x of rank r; the output y of rank r with, per axis, x's dim (kept) or 1 (reduced).

    Layouts: any input strides; y is packed row-major unless set.

    Types: any numeric input; sums in `compute_data_type` (default FLOAT); y is FLOAT by default,
    whatever the graph's io type (cuDNN's rule; `set_data_type` overrides it).

    Formula, over the reduced axes R: ADD `sum_R x`, MUL `prod_R x`, MIN/MAX, AMAX `max_R |x|`,
    AVG `sum_R x / |R|`, NORM1 `sum_R |x|`, NORM2 `sqrt(sum_R x^2)`, MUL_NO_ZEROS (zeros count as 1).

    Args:
        input: x.
        mode: a ReductionMode or its name ("ADD", "MAX", "AVG", ...).
        compute_data_type: the type the reduction runs in.
        name: the op's name.

    Returns:
        y, a virtual tensor whose dims must be set (`.set_dim([...])`).

    Example:
        ```python
        x = g.tensor(dim=[32, 1000], name="logits")
        row_max = g.reduction(x, mode="MAX").set_dim([32, 1])
        total = g.reduction(g.exp(g.sub(x, row_max)), mode="ADD").set_dim([32, 1])
        ```
    """
    try:
        mode = ReductionMode[mode.upper()] if isinstance(mode, str) else ReductionMode(mode)
    except (KeyError, ValueError):
        raise AttributeValueError(
            f"mode {mode!r} is not a reduction mode",
            op=f"reduction '{name}'",
            rule="reduction.mode",
            hint=f"pass an opgraph.ReductionMode or its name: {', '.join(m.name for m in ReductionMode)}",
        ) from None
    return self._add_op(Reduction(mode=mode), [input], name=name, compute_data_type=compute_data_type)[0]


@graph_method
def genstats(self, input, compute_data_type=None, name=""):
    """Per-channel sum and sum of squares of an [N, C, spatial...] tensor (cuDNN's genstats).

    Shapes: input [N, C, *spatial] -> sum and sq_sum [1, C, 1, ...] (the input's rank).

    Layouts: any input strides (NHWC is the fast one, fused after a convolution).

    Types: any float input; sums in `compute_data_type`; outputs FLOAT by default (they are raw
    sums, not mean / inv_variance: mean = sum / M, var = sq_sum / M - mean^2 with M = N*prod(spatial)).

    Formula: `sum[0, c] = sum_{n, spatial} x[n, c, ...]`, `sq_sum[0, c] = sum_{n, spatial} x[n, c, ...]^2`.

    Args:
        input: x [N, C, *spatial].
        compute_data_type: the type the sums run in.
        name: the op's name.

    Returns:
        [sum, sq_sum].

    Example:
        ```python
        y = g.conv_fprop(x, w, padding=1)
        s, sq = g.genstats(y)        # fused into the convolution's epilogue on the GPU
        ```
    """
    s, sq = self._add_op(GenStats(), [input], name=name, compute_data_type=compute_data_type)
    return [s, sq]
