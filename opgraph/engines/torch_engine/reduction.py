"""Reductions and genstats in torch. The reduced axes are read off the output's dims (as in the op);
they are moved last and flattened into one axis, which every mode then reduces (an empty set of
axes becomes an axis of size 1, so each element is reduced on its own, as in the reference).
"""

from __future__ import annotations

from typing import Any

from ...ops.reduction import ReductionMode, reduced_axes
from .common import Call, implements

R = ReductionMode


def _flattened(x: Any, axes: tuple[int, ...]) -> Any:
    """x with the kept axes first (in order) and the reduced axes flattened into the last one."""
    kept = [a for a in range(x.dim()) if a not in axes]
    return x.permute(*kept, *axes).reshape(*(x.shape[a] for a in kept), -1)


def _reduce(mode: ReductionMode, v: Any) -> Any:
    import torch

    if mode is R.ADD:
        return v.sum(-1)
    if mode is R.MUL:
        return v.prod(-1)
    if mode is R.MIN:
        return v.amin(-1)  # NaN propagates
    if mode is R.MAX:
        return v.amax(-1)
    if mode is R.AMAX:
        return v.abs().amax(-1)
    if mode is R.AVG:
        return v.mean(-1)
    if mode is R.NORM1:
        return v.abs().sum(-1)
    if mode is R.NORM2:
        return torch.sqrt((v * v).sum(-1))
    if mode is R.MUL_NO_ZEROS:
        return torch.where(v == 0, torch.ones_like(v), v).prod(-1)
    raise AssertionError(mode)


@implements("reduction")
def reduction(call: Call) -> list[Any]:
    x = call.tensor("input")
    out = call.out("output")
    assert out is not None
    axes = reduced_axes(tuple(x.shape), out.dim)
    return [_reduce(call.node.op.mode, _flattened(x, axes)).reshape(out.dim)]


@implements("genstats")
def genstats(call: Call) -> list[Any]:
    x = call.tensor("input")
    axes = tuple(a for a in range(x.dim()) if a != 1)
    s = x.sum(dim=axes, keepdim=True) if call.wants("sum") else None
    sq = (x * x).sum(dim=axes, keepdim=True) if call.wants("sq_sum") else None
    return [s, sq]
