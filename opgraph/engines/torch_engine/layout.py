"""Layout ops in torch: reshape (logical row-major order), permute, slicing, torch.cat, and slice's
backward (zeros with the slice written in). They move data in its stored type (no trip through the
compute type, so integers of any size stay exact); views where torch can make them, materialised when
they are written to a bound buffer.
"""

from __future__ import annotations

import builtins
from typing import Any

from ...ops.layout import Concatenate, Slice, SliceBackward, Transpose
from .common import Call, implements


@implements("reshape")
def reshape(call: Call) -> list[Any]:
    out = call.out("output")
    assert out is not None
    return [call.raw("input").reshape(out.dim)]


@implements("transpose")
def transpose(call: Call) -> list[Any]:
    return [call.raw("input").permute(*call.node.op_as(Transpose).permutation)]


@implements("slice")
def slice_(call: Call) -> list[Any]:
    x = call.raw("input")
    bounds = call.node.op_as(Slice).bounds(None, tuple(x.shape))
    return [x[tuple(builtins.slice(*b) for b in bounds)]]


@implements("slice_backward")
def slice_backward(call: Call) -> list[Any]:
    import torch

    op = call.node.op_as(SliceBackward)
    dy = call.tensor("grad")
    dx = torch.zeros(op.in_dim, dtype=dy.dtype, device=dy.device)
    dx[tuple(builtins.slice(*b) for b in op.slices)] = dy
    return [dx]


@implements("concatenate")
def concatenate(call: Call) -> list[Any]:
    import torch

    xs = [call.raw(r) for r in call.node.op.input_roles()]
    return [torch.cat(xs, dim=call.node.op_as(Concatenate).axis % xs[0].dim())]
