"""The gradient of a split: a tensor read through slices that tile one of its axes (the q, k and v of a
fused projection) gets the sum of one slice_backward per slice (zeros plus a copy each). That sum is a
concatenate of the slices' gradients, which `joined` makes instead, dropping the slice_backward ops:

- slice_backward outputs summed directly (`_joined_slices`);
- the same chain of transposes and reshapes over each slice_backward output (`_joined_chains`): the
  graph's view placement (graph/placement.py) gives every reader of a shared view chain a copy of its
  own, so an imported `qkv.reshape(B, T, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)` reads q, k and v
  through three reshape-permute-slice chains, whose gradients are the chain's backward over each
  slice_backward. The sum is the chain's backward once, over the concatenate.
"""

from __future__ import annotations

from typing import Any

from ..core.tensor import Tensor
from ..ops.layout import Reshape, Transpose
from .rules import GradBuilder, dim_of

__all__ = ["joined"]


def joined(g: Any, b: GradBuilder, parts: list[Any]) -> list[Any]:
    """`parts` (the contributions to one gradient) with the slices' gradients of a split joined."""
    return _joined_slices(g, b, _joined_chains(g, b, parts))


def _drop(g: Any, b: GradBuilder, ids: set[int]) -> None:
    """Remove the ops writing the tensors of `ids` (by id()) and the tensors themselves."""
    g._records = [r for r in g._records if not any(id(o) in ids for o in r.outputs if o is not None)]
    g._tensors = [t for t in g._tensors if id(t) not in ids]
    b._by_dims = {k: v for k, v in b._by_dims.items() if id(v) not in ids}
    g._invalidate()


def _joined_slices(g: Any, b: GradBuilder, parts: list[Any]) -> list[Any]:
    """Contributions that are slice_backward outputs of slices tiling their input along one axis
    (step 1, no gap, no overlap) replaced by one concatenate of the slices' gradients."""
    grads = b.slice_grads
    tiles = [p for p in parts if isinstance(p, Tensor) and id(p) in grads]
    if len(tiles) < 2:
        return parts
    dims = dim_of(tiles[0])
    bounds = [grads[id(p)][1] for p in tiles]
    axes = {a for bs in bounds for a, bound in enumerate(bs) if tuple(bound) != (0, dims[a], 1)}
    if len(axes) != 1:
        return parts
    axis = axes.pop()
    order = sorted(zip(bounds, tiles), key=lambda z: z[0][axis][0])
    end = 0
    for bs, _ in order:
        if bs[axis][2] != 1 or bs[axis][0] != end:
            return parts
        end = bs[axis][1]
    dys = [grads[id(p)][0] for _, p in order]
    if end != dims[axis] or len({d._data_type for d in dys}) > 1:
        return parts
    ids = {id(p) for p in tiles}
    _drop(g, b, ids)
    return [b.concatenate(dys, axis), *(p for p in parts if id(p) not in ids)]


def _chain(b: GradBuilder, producer: dict[int, Any], part: Any) -> tuple[tuple[Any, ...], Tensor, list[Tensor]] | None:
    """(the transposes and reshapes from `part` down, the slice_backward output under them, the
    tensors they write) where `part` is made so and each of those tensors is read by the chain alone.
    `producer`: the graph's op records by id() of their outputs."""
    if not isinstance(part, Tensor):
        return None
    ops: list[Any] = []
    written: list[Tensor] = []
    t = part
    while id(t) not in b.slice_grads:
        r = producer.get(id(t))
        if r is None or not isinstance(r.op, (Transpose, Reshape)) or b.value_readers(t) != (0 if t is part else 1):
            return None
        ops.append(r.op)
        written.append(t)
        t = r.inputs[0]
        if not isinstance(t, Tensor):
            return None
    if not ops or b.value_readers(t) != 1:
        return None
    return tuple(ops), t, written


def _joined_chains(g: Any, b: GradBuilder, parts: list[Any]) -> list[Any]:
    """Contributions that are one chain of transposes and reshapes over slice_backward outputs tiling
    an axis, replaced by the chain over one concatenate of the slices' gradients."""
    if len(parts) < 2:
        return parts
    producer = {id(o): r for r in g._records for o in r.outputs if o is not None}
    chains = {id(p): c for p in parts if (c := _chain(b, producer, p)) is not None}
    groups: dict[tuple[Any, ...], list[Any]] = {}
    for p in parts:
        if id(p) in chains:
            groups.setdefault(chains[id(p)][0], []).append(p)
    for ops, members in groups.items():
        if len(members) < 2:
            continue
        bases = [chains[id(p)][1] for p in members]
        joined_bases = _joined_slices(g, b, bases)
        if len(joined_bases) != 1:
            continue
        _drop(g, b, {id(t) for p in members for t in chains[id(p)][2]})
        t = joined_bases[0]
        for op in reversed(ops):
            t = b.transpose(t, op.permutation) if isinstance(op, Transpose) else b.reshape(t, op.dim)
        gone = {id(p) for p in members}
        parts = [t, *(p for p in parts if id(p) not in gone)]
    return parts
