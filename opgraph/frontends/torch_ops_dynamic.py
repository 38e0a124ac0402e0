"""Translations at dynamic sizes (from_torch with dynamic_shapes) where the static ones would read a
size: an expand to dynamic sizes, a slice of a dynamic axis, an arange of a dynamic length. What they
cannot express is an `UnsupportedGraphError` naming the node (`dynamic_refusal`)."""

from __future__ import annotations

from typing import Any

from .torch_importer import Args, Importer, Value, dynamic_refusal, symbolic


def expand_dynamic(imp: Importer, x: Value, shape: tuple[Any, ...]) -> Any:
    """An expand to dynamic sizes: x times ones that have the target's size on the axes x broadcasts
    (static ones: a dynamic axis of x is never broadcast), 1 elsewhere."""
    lead = (1,) * (len(shape) - x.rank) + tuple(x.shape)
    grown = tuple(t if d == 1 and t != 1 else 1 for d, t in zip(lead, shape))
    if symbolic(grown) or any(d != 1 and d != t for d, t in zip(lead, shape)):
        raise dynamic_refusal(imp.node, f"expands [{', '.join(map(str, x.shape))}] to a dynamic size", shape)
    if all(g == 1 for g in grown):
        return imp.reshaped(x, shape) if len(shape) != x.rank else x
    ones = imp.constant_value(imp.torch.ones(grown, dtype=x.dtype), "ones")
    return imp.g.mul(imp.at_rank(x, len(shape)), imp.tensor(ones), name=imp.op_name())


def slice_dynamic(imp: Importer, x: Value, axis: int, start: Any, stop: Any, step: Any) -> Any:
    """A slice where the axis or the bounds are dynamic: the whole axis is x itself; int bounds from
    the start go to the slice op (which proves them within the axis over its range)."""
    size = x.shape[axis]
    whole = stop == size or (isinstance(stop, int) and stop >= 2**62)
    if start == 0 and step == 1 and whole:
        return x
    if whole and isinstance(stop, int):
        stop = size
    if any(isinstance(v, int) and v < 0 for v in (start, stop)) or not isinstance(step, int) or step < 1:
        raise dynamic_refusal(imp.node, "slices a dynamic axis from its end or with a negative step", x.shape)
    slices = [slice(None)] * axis + [slice(start, stop, step)]
    return imp.g.slice(imp.tensor(x), slices, name=imp.op_name())


def arange_dynamic(imp: Importer, node: Any, a: Args, shape: tuple[Any, ...]) -> Value:
    """arange(start, end, step) of a dynamic length n: the positions along an axis of size n of a
    tensor already in the graph (gen_index of its first row), times step plus start."""
    n = shape[0]
    start, step = a.get("start", 0) or 0, a.get("step", 1) or 1
    if not isinstance(start, (int, float)) or not isinstance(step, (int, float)) or len(shape) != 1:
        raise dynamic_refusal(node, "is an arange with a dynamic start or step", shape)
    holder = next(
        (v for v in imp.env.values() if isinstance(v, Value) and v.tensor is not None and n in v.shape),
        None,
    )
    if holder is None:
        raise dynamic_refusal(node, "is an arange whose length is no input's dim", shape)
    axis = list(holder.shape).index(n)
    t = holder.tensor
    if holder.rank > 1:
        row = [slice(None) if i == axis else slice(0, 1) for i in range(holder.rank)]
        t = imp.g.slice(t, row, name=imp.op_name("row"))
    index = imp.g.gen_index(t, axis=axis, name=imp.op_name("index"))
    index.set_data_type(node.meta["val"].dtype)
    if holder.rank > 1:
        index = imp.reshape(index, [n], name=imp.op_name("flat"))
    if step != 1:
        index = imp.g.mul(index, step, name=imp.op_name("step"))
    if start != 0:
        index = imp.g.add(index, start, name=imp.op_name("start"))
    return imp.result(index, node.meta["val"])
