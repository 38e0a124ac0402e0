"""Translators of the ops language models add to the table: embedding lookup, boolean not, RMSNorm
(masked_fill is torch_ops.py's, beside where).

    embedding(W, idx)          -> embedding (opgraph.ops.gather), padding_idx carried for the backward
    bitwise_not(mask), bool    -> logical_not
    rms_norm(x, shape, w, eps) -> rmsnorm (inference form; eps None is finfo(x.dtype).eps, PyTorch's)
    a & b, a | b, a ^ b on bool (__and__, bitwise_and, logical_xor, ...) -> logical_and / logical_or / cmp_neq
    diff(x, n, dim, prepend, append) -> x[1:] - x[:-1] along dim (slices; != for bool), n times
    x[i0, i1, ...] (aten.index) with constant positions affine in the result's coordinates (broadcast
        aranges: attention_mask[b, None, None, kv]) -> slices, permute, reshape, broadcast of x;
        gather(x, dim, index) likewise
    table[idx] (other integer positions, one index tensor on axis 0) -> embedding(table as [V, rest]);
        gather at computed positions -> embedding(x as a column, index * stride + the other axes' offsets)
        (integer tables go through a float one: exact below 2^24 elements and values)
    pad(x, pads, 'constant', v) -> concatenations with a broadcast block of v (negative pads: slices);
        zeros read only by convolutions -> their padding (no op)
    roll(x, shifts, dims) -> per axis concatenate(x[n-s:], x[:n-s])
    cumsum(x, dim) -> cumsum (opgraph.ops.scan)
"""

from __future__ import annotations

from typing import Any

from ..core.tensor import Tensor
from .torch_importer import Args, Importer, Untranslatable, Value, og_dims, symbolic
from .torch_ops import TRANSLATORS, _axis, _expand_to, _meta, _operands, _shape, _slice_value, op
from .torch_ops_nn import pad_absorbed


@op("embedding")
def _embedding(imp: Importer, node: Any, a: Args) -> Tensor:
    w, idx = a["weight"], a["indices"]
    if a.get("scale_grad_by_freq") or a.get("sparse"):
        raise Untranslatable("embedding with scale_grad_by_freq or sparse gradients")
    if w.rank != 2 or idx.dtype.is_floating_point:
        raise Untranslatable("embedding of a table that is not 2-D, or with floating indices")
    pad = int(a.get("padding_idx", -1))
    pad = pad + w.shape[0] if pad < -1 else pad  # aten keeps -1 for none; other negatives count back
    t = imp.g.embedding(imp.tensor(w), imp.reshaped(idx, idx.shape or (1,)), padding_idx=pad, name=imp.op_name())
    return t if idx.rank else imp.reshape(t, [w.shape[1]], name=imp.op_name("squeeze"))


@op("bitwise_not")
def _bitwise_not(imp: Importer, node: Any, a: Args) -> Tensor:
    x = a["self"]
    if x.dtype != imp.torch.bool:
        raise Untranslatable("bitwise_not of an integer tensor")
    return imp.g.logical_not(imp.tensor(x), name=imp.op_name())


@op("rms_norm")
def _rms_norm(imp: Importer, node: Any, a: Args) -> Tensor:
    x, shape, w = a["input"], list(a["normalized_shape"]), a.get("weight")
    full = (1,) * (x.rank - len(shape)) + tuple(shape)
    eps = a.get("eps")
    if eps is None:
        eps = imp.torch.finfo(x.dtype).eps
    if not isinstance(eps, (int, float)):
        raise Untranslatable("rms_norm with a tensor eps")
    torch = imp.torch
    scale = (
        imp.reshaped(w, full)
        if w is not None
        else imp.tensor(imp.constant_value(torch.ones(full, dtype=imp.g.intermediate_data_type.to_torch()), "ones"))
    )
    if tuple(_shape(node)) != x.shape:
        raise Untranslatable("rms_norm whose result is not the input's shape")
    return imp.g.rmsnorm("inference", imp.tensor(x), scale, epsilon=float(eps), name=imp.op_name())[0]


# -- masks and positions: logical ops on bool, differences, indexing by constant positions ---------------

_LOGICAL = {
    "__and__": "logical_and",
    "bitwise_and": "logical_and",
    "__or__": "logical_or",
    "bitwise_or": "logical_or",
    "logical_xor": "cmp_neq",
    "__xor__": "cmp_neq",
    "bitwise_xor": "cmp_neq",
}


def _logical(builder: str) -> Any:
    def translate(imp: Importer, node: Any, a: Args) -> Tensor:
        x, y = a["self"], a["other"]
        bools = all(not isinstance(v, Value) or v.dtype == imp.torch.bool for v in (x, y))
        if not bools and builder != "cmp_neq" or not bools and _meta(node).dtype != imp.torch.bool:
            raise Untranslatable(f"{node.target} of integer tensors (bitwise)")
        xs, ys = _operands(imp, node, x, y)
        if not isinstance(xs, Tensor):
            xs, ys = ys, xs
        return getattr(imp.g, builder)(xs, ys, name=imp.op_name())

    return translate


for _name, _builder in _LOGICAL.items():
    TRANSLATORS.register(_name, _logical(_builder))


@op("diff")
def _diff(imp: Importer, node: Any, a: Args) -> Any:
    """diff(x, n, dim, prepend, append) = x[1:] - x[:-1] along dim (n times; bool: x[1:] != x[:-1])."""
    x = a["self"]
    axis = _axis(a["dim"], x.rank)
    parts = [v for v in (a.get("prepend"), x, a.get("append")) if v is not None]
    if any(not isinstance(v, Value) or v.rank != x.rank for v in parts):
        raise Untranslatable("diff with a prepend/append of another rank")
    shape = list(x.shape)
    shape[axis] = sum(v.shape[axis] for v in parts)
    cur: Any = (
        x
        if len(parts) == 1
        else Value(
            tuple(shape),
            x.dtype,
            tensor=imp.g.concatenate([imp.tensor(v) for v in parts], axis, name=imp.op_name("cat")),
        )
    )
    for _ in range(int(a.get("n", 1))):
        size = cur.shape[axis]
        hi = _slice_value(imp, cur, axis, 1, size, 1)
        lo = _slice_value(imp, cur, axis, 0, size - 1, 1)
        hi_t, lo_t = (imp.tensor(v) if isinstance(v, Value) else v for v in (hi, lo))
        d = (
            imp.g.cmp_neq(hi_t, lo_t, name=imp.op_name())
            if x.dtype == imp.torch.bool
            else imp.g.sub(hi_t, lo_t, name=imp.op_name())
        )
        d.set_data_type(x.dtype)
        shape = list(cur.shape)
        shape[axis] -= 1
        cur = Value(tuple(shape), x.dtype, tensor=d)
    return cur.tensor if cur.tensor is not None else cur


@op("index")
def _index(imp: Importer, node: Any, a: Args) -> Any:
    """x[i0, i1, ...] with constant integer index tensors whose positions are an affine function of
    the result's coordinates (aranges broadcast against each other: attention_mask[b, None, None, kv]):
    slices, a permutation, a reshape and a broadcast of x, no gather."""
    torch = imp.torch
    x, indices = a["self"], list(a["indices"])
    if symbolic(list(x.shape)) or symbolic(list(_shape(node))):
        from .torch_ops_dynamic import index_dynamic

        return index_dynamic(imp, node, x, indices)
    if not all(
        i is None
        or isinstance(i, Value)
        and i.source is not None
        and i.source.kind == "constant"
        and not i.source.views
        and i.example is not None
        for i in indices
    ):
        return _index_rows(imp, node, x, indices)
    if any(i is not None and i.dtype == torch.bool for i in indices):
        raise Untranslatable("indexing by a boolean mask")
    positions = torch.arange(max(1, _numel(x.shape))).reshape(x.shape)[
        tuple(slice(None) if i is None else imp.constants[i.source.key] for i in indices)
    ]
    return _positions_view(imp, node, x, positions)


_SMALL = 1 << 24  # elements a float32 holds every index (and integer value) of exactly


def _float_table(imp: Importer, x: Value, rows: int) -> Tensor:
    """x seen as a [rows, numel/rows] table of a floating type (integer and bool tensors cast: exact
    below 2^24), for an embedding lookup."""
    table = imp.reshaped(x, (rows, _numel(x.shape) // rows))
    if x.dtype.is_floating_point:
        return table
    if _numel(x.shape) > _SMALL:
        raise Untranslatable("gathering from a large integer tensor")
    imp.note(f"{imp.node.name}: an integer tensor gathered through a floating table (exact below 2^24)")
    return imp.g.identity(table, name=imp.op_name("as_float"))


def _from_table(imp: Importer, node: Any, rows: Tensor, x: Value) -> Tensor:
    out = imp.reshape(rows, list(og_dims(_shape(node))), name=imp.op_name("reshape"))
    if x.dtype.is_floating_point:
        return out
    return imp.g.identity(out.set_data_type(imp.g.intermediate_data_type), name=imp.op_name("cast"))


def _index_rows(imp: Importer, node: Any, x: Value, indices: list[Any]) -> Tensor:
    """table[idx] (one integer index tensor on axis 0: a relative-position bias table read at a
    buffer's positions) -> embedding over the table seen as [V, rest]."""
    idx = indices[0] if len(indices) == 1 else None
    if not isinstance(idx, Value) or idx.dtype.is_floating_point or idx.dtype == imp.torch.bool or x.rank < 1:
        raise Untranslatable("indexing by computed positions other than one integer index tensor on axis 0")
    table = _float_table(imp, x, x.shape[0])
    rows = imp.g.embedding(table, imp.reshaped(idx, idx.shape or (1,)), name=imp.op_name("rows"))
    return _from_table(imp, node, rows, x)


def _gather_computed(imp: Importer, node: Any, x: Value, axis: int, index: Value) -> Tensor:
    """gather(x, axis, index) at computed positions (a buffer read at positions made from the input:
    RoBERTa's token types): flat positions index * stride + the other axes' offsets (a constant), an
    embedding over x seen as a column."""
    torch = imp.torch
    if index.dtype.is_floating_point or index.dtype == torch.bool or _numel(x.shape) > _SMALL:
        raise Untranslatable("gather of a large tensor, or by non-integer positions")
    strides = [_numel(x.shape[d + 1 :]) for d in range(x.rank)]
    base = torch.zeros(index.shape, dtype=torch.int64)
    for d, n in enumerate(index.shape):
        if d != axis:
            base = base + torch.arange(n).reshape([n if i == d else 1 for i in range(index.rank)]) * strides[d]
    g = imp.g
    scaled = g.mul(imp.tensor(index), strides[axis], name=imp.op_name("stride")).set_data_type("int64")
    flat = g.add(scaled, imp.tensor(imp.constant_value(base, "gather_base")), name=imp.op_name("positions"))
    flat.set_data_type("int64")
    rows = g.embedding(_float_table(imp, x, _numel(x.shape)), flat, name=imp.op_name("rows"))
    return _from_table(imp, node, rows, x)


@op("gather")
def _gather(imp: Importer, node: Any, a: Args) -> Any:
    """gather(x, dim, index) with a constant index whose positions are affine in the result's
    coordinates (BERT's token_type_ids buffer read at positions arange(S)): a view of x, as `index`."""
    torch = imp.torch
    x, index = a["self"], a["index"]
    if not (
        isinstance(index, Value)
        and index.source is not None
        and index.source.kind == "constant"
        and not index.source.views
    ):
        return _gather_computed(imp, node, x, _axis(a["dim"], x.rank), index)
    flat = torch.arange(max(1, _numel(x.shape))).reshape(x.shape)
    positions = torch.gather(flat, _axis(a["dim"], x.rank), imp.constants[index.source.key])
    return _positions_view(imp, node, x, positions)


def _positions_view(imp: Importer, node: Any, x: Value, positions: Any) -> Any:
    """The elements of x at flat row-major `positions` (shape: the node's result) as a view of x."""
    torch = imp.torch
    shape = _shape(node)
    if tuple(positions.shape) != shape:
        raise Untranslatable("indexing whose result shape PyTorch computes otherwise")
    plan = _affine_view(positions, x.shape)
    if plan is None:
        raise Untranslatable("indexing by positions that are not an affine function of the result's coordinates")
    starts, steps, order = plan
    cur: Any = x
    sizes = list(x.shape)
    for d in range(x.rank):
        n = shape[order.index(d)] if d in order else 1
        sizes[d] = n
        cur = _as_value(
            _slice_value(imp, cur, d, starts[d], starts[d] + steps[d] * (n - 1) + 1, steps[d]), x.dtype, sizes
        )
    used = [d for d in order if d is not None]
    perm = used + [d for d in range(x.rank) if d not in order]
    if perm != list(range(x.rank)):
        sizes = [sizes[d] for d in perm]
        cur = _as_value(
            imp.view(cur, torch.ops.aten.permute.default, perm)
            or imp.g.transpose(imp.tensor(cur), perm, name=imp.op_name("permute")),
            x.dtype,
            sizes,
        )
    # the result: the used axes in order, 1 on broadcast axes, then broadcast
    kept = tuple(n if d is not None else 1 for n, d in zip(shape, order))
    if cur.shape != kept:
        cur = _as_value(imp.reshaped(cur, kept), x.dtype, kept)
    if kept == shape:
        return cur.tensor if cur.tensor is not None else cur
    return _expand_to(imp, cur, shape)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _as_value(v: Any, dtype: Any, shape: Any) -> Value:
    if isinstance(v, Value):
        return v
    return Value(tuple(int(d) for d in shape), dtype, tensor=v)


def _affine_view(positions: Any, in_shape: tuple[int, ...]) -> tuple[list[int], list[int], list[Any]] | None:
    """For flat positions P [out...] into a row-major tensor of `in_shape`: (start per input axis, step
    per input axis, the input axis each output axis walks (None: broadcast or size 1)) when
    P = offset + sum_k step_k * stride(axis_k) * j_k with distinct axes, else None."""
    import torch

    p = positions.to(torch.int64)
    rank = len(in_shape)
    strides = [_numel(in_shape[d + 1 :]) for d in range(rank)]
    offset = int(p.flatten()[0]) if p.numel() else 0
    starts = []
    rem = offset
    for s in strides:
        starts.append(rem // s)
        rem %= s
    steps = [1] * rank
    order: list[Any] = []
    expect_p = torch.full(p.shape, offset, dtype=torch.int64)
    for k, n in enumerate(p.shape):
        if n == 1:
            order.append(None)
            continue
        idx = [0] * p.dim()
        idx[k] = 1
        delta = int(p[tuple(idx)]) - offset
        if delta == 0:
            order.append(None)
            continue
        axis = next(
            (
                d
                for d in range(rank)
                if delta > 0 and delta % strides[d] == 0 and delta // strides[d] < in_shape[d] and d not in order
            ),
            None,
        )
        if axis is None:
            return None
        steps[axis] = delta // strides[axis]
        if starts[axis] + steps[axis] * (n - 1) >= in_shape[axis]:
            return None
        order.append(axis)
        coord = torch.arange(n).reshape([n if i == k else 1 for i in range(p.dim())])
        expect_p = expect_p + coord * delta
    if not torch.equal(expect_p, p):
        return None
    return starts, steps, order


@op("pad", "constant_pad_nd")
def _pad(imp: Importer, node: Any, a: Args) -> Any:
    """F.pad(x, pads, 'constant', value): per axis from the last, a negative pad a slice, a positive one
    a concatenation with a block of `value` (one element broadcast, no memory)."""
    x: Value = a["self"] if "self" in a else a["input"]
    if pad_absorbed(node):  # its convolutions take the zeros as their padding: nothing to compute here
        return Value(_shape(node), x.dtype)
    mode = a.get("mode", "constant")
    if mode != "constant":
        raise Untranslatable(f"padding mode {mode!r}")
    value = a.get("value")
    value = 0.0 if value is None else value
    if isinstance(value, Value):
        raise Untranslatable("a tensor padding value")
    pads = list(a["pad"])
    cur: Any = x
    shape = list(x.shape)
    for i in range(len(pads) // 2):
        axis = x.rank - 1 - i
        before, after = int(pads[2 * i]), int(pads[2 * i + 1])
        if before < 0 or after < 0:
            start, stop = max(0, -before), shape[axis] - max(0, -after)
            cur = _as_value(
                _slice_value(imp, cur, axis, start, stop, 1), x.dtype, shape[:axis] + [stop - start] + shape[axis + 1 :]
            )
            shape[axis] = stop - start
            before, after = max(0, before), max(0, after)
        if before == 0 and after == 0:
            continue
        parts = []
        for n, where in ((before, "before"), (shape[axis], None), (after, "after")):
            if n == 0:
                continue
            if where is None:
                parts.append(imp.tensor(cur))
                continue
            block = shape[:axis] + [n] + shape[axis + 1 :]
            parts.append(imp.tensor(_filled_value(imp, block, value, x.dtype)))
        shape[axis] += before + after
        cur = _as_value(imp.g.concatenate(parts, axis, name=imp.op_name("pad")), x.dtype, shape)
    return cur.tensor if cur.tensor is not None else cur


def _filled_value(imp: Importer, shape: list[int], value: Any, dtype: Any) -> Value:
    torch = imp.torch
    one = torch.full((1,), value, dtype=dtype)
    source = imp.constant(one, "pad_value").view(torch.ops.aten.expand.default, list(shape))
    return Value(tuple(shape), dtype, source=source, example=one.expand(*shape))


@op("roll")
def _roll(imp: Importer, node: Any, a: Args) -> Any:
    """roll(x, shifts, dims) = per axis cat([x[-s:], x[:-s]]) (dims empty: over the flattened x)."""
    x = a["self"]
    shifts, dims = list(a["shifts"]), list(a.get("dims") or [])
    if not dims:
        raise Untranslatable("roll over the flattened tensor")
    cur: Any = x
    for s, d in zip(shifts, dims):
        axis = _axis(d, x.rank)
        n = x.shape[axis]
        s = int(s) % n if n else 0
        if s == 0:
            continue
        head = _slice_value(imp, cur, axis, n - s, n, 1)
        tail = _slice_value(imp, cur, axis, 0, n - s, 1)
        parts = [imp.tensor(v) if isinstance(v, Value) else v for v in (head, tail)]
        cur = _as_value(imp.g.concatenate(parts, axis, name=imp.op_name()), x.dtype, x.shape)
    return cur.tensor if isinstance(cur, Value) and cur.tensor is not None else cur


@op("cumsum")
def _cumsum(imp: Importer, node: Any, a: Args) -> Tensor:
    """cumsum(x, dim, dtype) -> cumsum (opgraph.ops.scan); the result in PyTorch's dtype."""
    x = a["self"]
    return imp.g.cumsum(imp.tensor(x), _axis(a["dim"], x.rank), name=imp.op_name())
