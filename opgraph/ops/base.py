"""Helpers shared by the op-family modules: broadcasting, layouts of outputs, scalar operands.

What an op is (Op, NodeContext, the registries) lives in opgraph.core.op.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..core.errors import ShapeError
from ..core.ir import Const
from ..core.op import NodeContext
from ..core.tensor import TensorDesc, format_dims, is_dynamic, packed_strides, stride_order


def strides_like(dim: Sequence[int], like: TensorDesc | None) -> tuple[int, ...]:
    """Packed strides for `dim` that keep the axis order of `like` (same rank), else row-major."""
    if like is not None and len(like.dim) == len(dim):
        return packed_strides(dim, stride_order(like.stride))
    return packed_strides(dim)


def is_scalar_operand(value: TensorDesc | Const | None) -> bool:
    return isinstance(value, Const) or (isinstance(value, TensorDesc) and value.numel == 1)


def broadcast_dims(ctx: NodeContext, roles: Sequence[str]) -> tuple[int, ...]:
    """Broadcast the dims of the tensors under `roles` (equal rank; 1-element tensors and literals
    broadcast to anything). Raises ShapeError naming the operand that does not fit."""
    present = [(r, ctx.input(r)) for r in roles if ctx.input(r) is not None]
    tensors = [(r, t) for r, t in present if isinstance(t, TensorDesc) and not t.is_scalar]
    if not tensors:
        scalars = [t for _, t in present if isinstance(t, TensorDesc)]
        return max((t.dim for t in scalars), key=len, default=(1,))
    rank = max(len(t.dim) for _, t in tensors)
    out = [1] * rank
    for role, t in tensors:
        if len(t.dim) != rank:
            ctx.error(
                ShapeError,
                f"input '{role}' has rank {len(t.dim)} (dims {list(t.dim)}) but the other operands have rank {rank}",
                tensor=role,
                rule="broadcast.rank",
                hint="give every operand the same rank, with 1 in broadcast axes (a per-channel bias of "
                "an NCHW image is dims [1, C, 1, 1])",
            )
        for axis, (a, b) in enumerate(zip(out, t.dim)):
            # a literal 1 broadcasts; a dynamic dim never does (its value 1 pairs with an equal axis)
            if a != b and not _is_one(a) and not _is_one(b):
                ctx.error(
                    ShapeError,
                    f"input '{role}' dims {format_dims(t.dim)} do not broadcast with {format_dims(out)} at axis "
                    f"{axis} ({b} vs {a})",
                    tensor=role,
                    rule="broadcast.dims",
                    hint="make the axis equal or 1 in one of the operands"
                    + (
                        " (two dynamic sizes are equal only when written alike: declare one Dim for both)"
                        if is_dynamic((a, b))
                        else ""
                    ),
                )
            out[axis] = broadcast_pair(a, b)
    return tuple(out)


def _is_one(d: int) -> bool:
    return isinstance(d, int) and d == 1


def broadcast_pair(a: int, b: int) -> int:
    """The size of an axis where sizes `a` and `b` broadcast (equal, or one a literal 1): `max` for
    ints; a dynamic size is never taken to be 1 (docs/design/dynamic-shapes.md)."""
    return b if _is_one(a) else a


def batch_only_refusal(ctx: NodeContext, roles: Sequence[str], what: str) -> str | None:
    """Why an image op's operands under `roles` have a dynamic dim other than N (axis 0 of each),
    or None: the op takes a dynamic batch only (dynamic channels and spatial dims are not in v1)."""
    for role in roles:
        t = ctx.input(role)
        if isinstance(t, TensorDesc) and (is_dynamic(t.dim[1:]) or (role != roles[0] and is_dynamic(t.dim))):
            return (
                f"{what} takes a dynamic batch (dim 0 of '{roles[0]}'), not the dynamic dims of '{role}' "
                f"{format_dims(t.dim)}: fix the channel and spatial sizes or build a plan per size"
            )
    return None


def first_tensor(ctx: NodeContext, roles: Sequence[str], dim: Sequence[int]) -> TensorDesc | None:
    """The first input tensor of full dims `dim`: the one whose layout an output follows."""
    for r in roles:
        t = ctx.input(r)
        if isinstance(t, TensorDesc) and t.dim == tuple(dim):
            return t
    return None
