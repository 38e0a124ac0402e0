"""Scans: the running sum along one axis (cumsum), forwards or backwards.

    cumsum(x, axis, reverse=False) -> y, the input's dims
        y[..., i, ...] = sum_{j <= i} x[..., j, ...]      (reverse: sum_{j >= i})

Language models build positions from masks with it (RoBERTa's position ids: cumsum(input_ids !=
pad) * mask + pad; packed-sequence ids: cumsum(diff(position_ids) != 1)); its gradient is the reverse
scan of the output's gradient. Types: any input type (a bool or integer mask counts); the output
takes the graph's defaults unless set (an imported model's: PyTorch's, int64 for an integer or bool
input). The sums run in the compute type; NaN and infinities propagate to every later position.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.errors import AttributeValueError
from ..core.op import NodeContext, Op, TensorSpec, graph_method, register_op
from ..core.tensor import packed_strides


@register_op
@dataclass(frozen=True, kw_only=True)
class Cumsum(Op):
    """y = the running sum of x along `axis` (from the end when `reverse`)."""

    kind = "cumsum"
    DYNAMIC = True
    INPUTS = ("input",)
    OUTPUTS = ("output",)
    axis: int
    reverse: bool = False

    def infer(self, ctx: NodeContext) -> list[TensorSpec]:
        dim = tuple(ctx.tensor("input").dim)
        return [TensorSpec(dim, packed_strides(dim))]

    def check(self, ctx: NodeContext) -> None:
        rank = len(ctx.tensor("input").dim)
        if not 0 <= self.axis < rank:
            ctx.error(
                AttributeValueError,
                f"axis {self.axis} is not an axis of the rank-{rank} input",
                tensor="input",
                rule="cumsum.axis",
                hint=f"pass an axis in [0, {rank})",
            )

    def reference(self, ins, outs):
        (x,) = ins
        if self.reverse:
            return [np.flip(np.cumsum(np.flip(x, self.axis), axis=self.axis), self.axis)]
        return [np.cumsum(x, axis=self.axis)]


@graph_method
def cumsum(self, input, axis: int, reverse: bool = False, compute_data_type=None, name: str = ""):
    """The running sum along one axis.

    Shapes: input of any rank; the output has its dims.

    Layouts: any input strides; the output is packed row-major.

    Types: any input type (bool and integer masks count); sums in `compute_data_type`.

    Formula: `y[..., i, ...] = sum_{j <= i} x[..., j, ...]` (reverse: `sum_{j >= i}`).

    Args:
        input: x.
        axis: the scanned axis (0-based, non-negative).
        reverse: scan from the end (the gradient of a forward scan).
        compute_data_type: the type the sums run in.
        name: the op's name.

    Returns:
        y, x's dims.

    Example:
        ```python
        mask = g.tensor(dim=[8, 128], name="mask", data_type=og.DataType.INT64)
        positions = g.cumsum(mask, axis=1)
        ```
    """
    return self._add_op(
        Cumsum(axis=int(axis), reverse=bool(reverse)), [input], name=name, compute_data_type=compute_data_type
    )[0]
