"""Translations at dynamic sizes (from_torch with dynamic_shapes) where the static ones would read a
size: an expand to dynamic sizes, a slice of a dynamic axis, an arange of a dynamic length. What they
cannot express is an `UnsupportedGraphError` naming the node (`dynamic_refusal`)."""

from __future__ import annotations

from typing import Any

from .torch_importer import Args, Importer, Value, dynamic_refusal, symbolic
from .torch_symbolic import to_shape, to_symint


def expand_dynamic(imp: Importer, x: Value, shape: tuple[Any, ...]) -> Any:
    """An expand to dynamic sizes. An axis of x that is 1 grows to a static size by a product with
    ones of that size (a constant), to a dynamic size by a sum with zeros of that size (made in the
    graph from a tensor that has the size: `zeros_of`); a dynamic axis of x is never broadcast."""
    lead = (1,) * (len(shape) - x.rank) + tuple(x.shape)
    if any(d != 1 and d != t for d, t in zip(lead, shape)):
        raise dynamic_refusal(imp.node, f"expands [{', '.join(map(str, x.shape))}] to another size", shape)
    grown = tuple(t if d == 1 and t != 1 and not symbolic(t) else 1 for d, t in zip(lead, shape))
    out: Any = imp.at_rank(x, len(shape)) if x.rank != len(shape) or not all(g == 1 for g in grown) else x
    if not all(g == 1 for g in grown):
        ones = imp.constant_value(imp.torch.ones(grown, dtype=x.dtype), "ones")
        out = imp.g.mul(out, imp.tensor(ones), name=imp.op_name())
    dynamic = [i for i, (d, t) in enumerate(zip(lead, shape)) if d == 1 and symbolic(t)]
    if not dynamic:
        return out
    if isinstance(out, Value):
        out = imp.tensor(out)
    for i in dynamic:
        zeros = zeros_of(imp, shape[i], i, len(shape))
        if x.dtype == imp.torch.bool:
            out = imp.g.logical_or(out, imp.g.cmp_lt(zeros, 0, name=imp.op_name("false")), name=imp.op_name())
        else:
            out = imp.g.add(out, zeros, name=imp.op_name())
        out.set_data_type(x.dtype)
    return out


def zeros_of(imp: Importer, size: Any, axis: int, rank: int) -> Any:
    """Zeros (int64) of dims [1, .., size, .., 1] (`size` at `axis`), computed from a tensor in the
    graph that has a dim `size` (its first row's index, minus itself)."""
    index, _ = _positions(imp, imp.node, size, "needs a tensor of dynamic size {size}, which no input has")
    index.set_data_type(imp.torch.int64)
    zero = imp.g.sub(index, index, name=imp.op_name("zero")).set_data_type(imp.torch.int64)
    return imp.reshape(zero, [size if i == axis else 1 for i in range(rank)], name=imp.op_name("zeros"))


def _positions(imp: Importer, node: Any, size: Any, refusal: str) -> tuple[Any, int]:
    """0, 1, .., size - 1 along the axis of a tensor in the graph that has a dim `size` (gen_index of
    its first row, the holder's rank and that axis kept), and that rank; `refusal` when no tensor has it."""
    holder = next(
        (v for v in imp.env.values() if isinstance(v, Value) and v.tensor is not None and size in v.shape),
        None,
    )
    if holder is None:
        raise dynamic_refusal(node, refusal.format(size=size), [size])
    k = list(holder.shape).index(size)
    t = holder.tensor
    if holder.rank > 1:
        t = imp.g.slice(
            t, [slice(None) if i == k else slice(0, 1) for i in range(holder.rank)], name=imp.op_name("row")
        )
    return imp.g.gen_index(t, axis=k, name=imp.op_name("index")), holder.rank


def slice_dynamic(imp: Importer, x: Value, axis: int, start: Any, stop: Any, step: Any) -> Any:
    """A slice where the axis or the bounds are dynamic: the whole axis is x itself; int bounds from
    the start go to the slice op (which proves them within the axis over its range)."""
    start, stop = to_symint(start), to_symint(stop)  # (a torch.compile graph's SymInt bounds as the dims')
    size = x.shape[axis]
    whole = stop == size or (isinstance(stop, int) and stop >= 2**62)
    if start == 0 and step == 1 and whole:
        return x
    if whole and isinstance(stop, int):
        stop = size
    elif isinstance(stop, int) and stop < 0:  # counted from the end: x[:, :-1]
        stop = size + stop
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
    index, rank = _positions(imp, node, n, "is an arange whose length is no input's dim")
    index.set_data_type(node.meta["val"].dtype)
    if rank > 1:
        index = imp.reshape(index, [n], name=imp.op_name("flat"))
    if step != 1:
        index = imp.g.mul(index, step, name=imp.op_name("step"))
    if start != 0:
        index = imp.g.add(index, start, name=imp.op_name("start"))
    return imp.result(index, node.meta["val"])


def full_dynamic(imp: Importer, node: Any, fill: Any, shape: tuple[Any, ...]) -> Any:
    """ones / zeros / full of a dynamic shape (an attention mask's default): the value as a constant of
    one element per axis, expanded to the shape (`expand_dynamic`: a dynamic axis from a tensor in the
    graph that has that size)."""
    if not isinstance(fill, (bool, int, float)):
        raise dynamic_refusal(node, "fills a tensor of a dynamic size with a computed value", shape)
    meta = node.meta["val"]
    one = imp.constant_value(imp.torch.full((1,) * len(shape), fill, dtype=meta.dtype), "fill")
    out = expand_dynamic(imp, one, shape)
    return out if isinstance(out, Value) else imp.result(out, meta)


def index_dynamic(imp: Importer, node: Any, x: Value, indices: list[Any]) -> Any:
    """x[i0, i1, ...] at dynamic sizes where every index is the identity position of its axis (an arange
    of the axis' length, unsqueezed: transformers' mask functions read `x[batch_idx, q_idx]` so): the
    result is x with its axes placed where the indices put them (a transpose and a reshape)."""
    fx_indices = node.args[1]
    out_shape = to_shape(node.meta["val"].shape)
    if len(fx_indices) > x.rank or any(i is None for i in fx_indices):
        raise dynamic_refusal(node, "indexes a dynamic tensor other than by positions along each axis", out_shape)
    placed = []  # the result axis of each indexed axis of x
    for axis, index in enumerate(fx_indices):
        length = _identity_positions(index)
        shape = to_shape(index.meta["val"].shape) if hasattr(index, "meta") else ()
        where = [k for k, d in enumerate(shape) if d != 1]
        if length is None or len(where) > 1 or to_shape([length])[0] != x.shape[axis]:
            raise dynamic_refusal(node, "indexes a dynamic tensor at computed positions", out_shape)
        offset = len(out_shape) - len(shape)  # indices broadcast from the right
        placed.append(offset + (where[0] if where else len(shape) - 1))
    rest = list(range(len(fx_indices), x.rank))  # axes not indexed keep their order after the indexed ones
    if len(set(placed)) != len(placed) or rest:
        raise dynamic_refusal(node, "indexes a dynamic tensor with positions that share an axis", out_shape)
    order = sorted(range(len(placed)), key=lambda k: placed[k])
    t = imp.tensor(x)
    if order != list(range(len(placed))):
        t = imp.g.transpose(t, order, name=imp.op_name("order"))
    return imp.reshape(t, list(out_shape), name=imp.op_name("place"))


def _identity_positions(index: Any) -> Any:
    """The length n when an FX index node is arange(n) (+ 0), unsqueezed or viewed; else None."""
    seen = 0
    # (only the partition's own nodes: a placeholder, whose target is its name, says nothing of its values)
    while getattr(index, "op", None) == "call_function" and seen < 16:
        seen += 1
        name = str(index.target)
        if "unsqueeze" in name or "view" in name or "expand" in name or "reshape" in name:
            index = index.args[0]
        elif "add" in name and len(index.args) > 1 and index.args[1] == 0:
            index = index.args[0]
        elif name.startswith("aten.slice.Tensor") and _whole_slice(index):
            index = index.args[0]
        elif name.startswith("aten.arange.default"):
            return index.meta["val"].shape[0]
        elif name.startswith("aten.arange.start"):
            start, step = index.args[0], index.args[2] if len(index.args) > 2 else 1
            return index.meta["val"].shape[0] if start == 0 and step == 1 else None
        else:
            return None
    return None


def _whole_slice(node: Any) -> bool:
    """Whether an FX slice node takes its whole axis from 0 (x[:, 0:], transformers' masks' x[:, :INT64_MAX])."""
    start, end, step = (list(node.args[2:5]) + [None] * 3)[:3]
    return start in (None, 0) and step in (None, 1) and (end is None or isinstance(end, int) and end >= 2**62)
