"""Reductions and genstats in torch. The reduced axes are read off the output's dims (as in the op).
Sums, means and extrema reduce them in one torch call (one pass over the input, any strides);
products (torch.prod takes one axis) and the no-axis case (each element reduced on its own, as in
the reference) first move the reduced axes last and flatten them into one.
"""

from __future__ import annotations

from typing import Any

from ...ops.reduction import Reduction, ReductionMode, reduced_axes
from .common import Call, implements

R = ReductionMode


def _flattened(x: Any, axes: tuple[int, ...]) -> Any:
    """x with the kept axes first (in order) and the reduced axes flattened into the last one."""
    kept = [a for a in range(x.dim()) if a not in axes]
    return x.permute(*kept, *axes).reshape(*(x.shape[a] for a in kept), -1)


def _reduce(mode: ReductionMode, v: Any, dim: Any) -> Any:
    import torch

    if mode is R.ADD:
        return v.sum(dim, keepdim=True)
    if mode is R.MUL:
        return v.prod(dim, keepdim=True)
    if mode is R.MIN:
        return v.amin(dim, keepdim=True)  # NaN propagates
    if mode is R.MAX:
        return v.amax(dim, keepdim=True)
    if mode is R.AMAX:
        return v.abs().amax(dim, keepdim=True)
    if mode is R.AVG:
        return v.mean(dim, keepdim=True)
    if mode is R.NORM1:
        return v.abs().sum(dim, keepdim=True)
    if mode is R.NORM2:
        return torch.sqrt((v * v).sum(dim, keepdim=True))
    if mode is R.MUL_NO_ZEROS:
        return torch.where(v == 0, torch.ones_like(v), v).prod(dim, keepdim=True)
    raise AssertionError(mode)


@implements("reduction")
def reduction(call: Call) -> list[Any]:
    x = call.tensor("input")
    out = call.out("output")
    assert out is not None
    mode = call.node.op_as(Reduction).mode
    axes = reduced_axes(tuple(x.shape), out.dim)
    if axes and mode not in (R.MUL, R.MUL_NO_ZEROS):
        return [_reduce(mode, x, axes)]
    return [_reduce(mode, _flattened(x, axes), -1).reshape(out.dim)]


@implements("genstats")
def genstats(call: Call) -> list[Any]:
    x = call.tensor("input")
    axes = tuple(a for a in range(x.dim()) if a != 1)
    s = x.sum(dim=axes, keepdim=True) if call.wants("sum") else None
    sq = (x * x).sum(dim=axes, keepdim=True) if call.wants("sq_sum") else None
    return [s, sq]
