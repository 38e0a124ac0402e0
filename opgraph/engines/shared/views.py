"""Operands that are views of memory, as the engines that read them in place see them: a slice,
transpose or reshape of a tensor in memory (a chain of them composes) is a `View` (the buffer, an
element offset, strides); attention's q/k/v (and the backward's o/dO) read through such views (the heads
of a fused qkv projection), and the backward's dQ/dK/dV written through transposes and reshapes into
their slots of a concatenation (the projection's input gradient). The generated kernels and the cuDNN
engine both read and write attention operands so; no engine owns this analysis."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...core.config import Support
from ...core.ir import Node
from ...core.piece import Piece, make_piece
from ...core.tensor import TensorDesc, reshape_strides
from ...ops.layout import VIEW_KINDS, Reshape, Slice, Transpose
from .symbolic import symbolic_piece


@dataclass(frozen=True)
class View:
    """A slice/transpose of a tensor in memory, read in place: `desc` describes the view (its dims,
    and strides into the buffer of `base`) from element `offset` of that buffer."""

    base: int
    offset: int
    desc: TensorDesc


def view_of(
    node: Node, src: TensorDesc, base: int, offset: int, uid: int, out_dims: Sequence[Any] | None = None
) -> View | str:
    """The view `node` makes of `src` (itself read from buffer `base` at `offset`), or why not.
    `out_dims`: the output's dims, which a reshape without dims of its own takes (a dynamic graph's
    reshapes to dims of its dynamic dims)."""
    op = node.op
    if isinstance(op, Slice):
        bounds = op.bounds(None, src.dim)
        offset += sum(start * s for (start, _, _), s in zip(bounds, src.stride))
        dims = tuple(_length(*b) for b in bounds)
        strides = tuple(s * step for (_, _, step), s in zip(bounds, src.stride))
    elif isinstance(op, Transpose):
        perm = tuple(op.permutation)
        dims = tuple(src.dim[p] for p in perm)
        strides = tuple(src.stride[p] for p in perm)
    elif isinstance(op, Reshape) and (op.dim is not None or out_dims is not None):
        if op.dim is None:
            dims = tuple(out_dims)  # type: ignore[arg-type]
        else:
            known = math.prod(d for d in op.dim if d != -1)
            dims = tuple(src.numel // known if d == -1 else d for d in op.dim)
        reshaped = reshape_strides(src.dim, src.stride, dims)
        if reshaped is None:
            return f"{node.label()} regroups axes whose strides are not one run; it needs a copy"
        strides = reshaped
    else:
        return f"{node.label()} is not a view"
    return View(base, offset, TensorDesc(uid, "", dims, strides, src.data_type))


def _length(start: Any, stop: Any, step: int) -> Any:
    """The length of a slice's range; over a dynamic axis an expression (bounds are proved to keep >= 1
    element)."""
    if isinstance(start, int) and isinstance(stop, int):
        return len(range(start, stop, step))
    return (stop - start + step - 1) // step


def own_dims(piece: Piece, node: Node) -> tuple[Any, ...] | None:
    """The dims a reshape without dims of its own (an imported graph's, over dynamic dims) is read in
    place as: its output's, where the piece is static or the reshape is a view at every shape of the
    piece's bucket too (its view chain analysed over the bucket's symbolic origin, as the bucket's
    kernel is generated: the hint's decision must not make a kernel per shape); else None (a copy)."""
    if not isinstance(node.op, Reshape) or node.op.dim is not None:
        return None
    if piece.graph.origin is not None and not _view_over_bucket(piece, node):
        return None
    return tuple(piece.tensor(node.output_uids()[0]).dim)


def _view_over_bucket(piece: Piece, node: Node) -> bool:
    """Whether the view chain of the piece's nodes that ends at `node` is a view of memory over the
    piece's symbolic origin (memoized on the origin graph by the chain's node positions)."""
    k = next(i for i, n in enumerate(piece.nodes) if n is node)
    producers = {n.output_uids()[0]: n for n in piece.nodes[:k] if n.kind in VIEW_KINDS}
    chain, u = [node], node.input_uids()[0]
    while u in producers:
        chain.append(producers[u])
        u = producers[u].input_uids()[0]
    origin = piece.graph.origin
    assert origin is not None
    at = piece.graph.node_positions
    key = ("view_over_bucket", tuple(at[id(n)] for n in reversed(chain)))
    memo = origin.graph.memo
    found = memo.get(key)
    if found is None:
        symbolic = symbolic_piece(make_piece(piece.graph, piece.index, chain[::-1]))
        try:
            views = None if symbolic is None else memory_views(symbolic)
        except TypeError:  # decided by a dynamic size's value
            views = None
        found = memo[key] = views is not None and not isinstance(views, Support)
    return found


def memory_views(piece: Piece) -> dict[int, View] | Support:
    """The piece's slice/transpose nodes as views of tensors in memory (a chain of them composes),
    by output UID; Support.no where one reads a value the piece computes (that needs a copy)."""
    produced = {u for n in piece.nodes for u in n.output_uids()}
    views: dict[int, View] = {}
    for node in piece.nodes:
        if node.kind not in VIEW_KINDS:
            continue
        src, out = node.input_uids()[0], node.output_uids()[0]
        if src in views:
            v = view_of(node, views[src].desc, views[src].base, views[src].offset, out, own_dims(piece, node))
        elif src in produced:
            return Support.no(
                f"{node.label()} takes a computed value; a slice/transpose is read in place "
                "from a tensor in memory only",
                node,
            )
        else:
            v = view_of(node, piece.tensor(src), src, 0, out, own_dims(piece, node))
        if isinstance(v, str):
            return Support.no(v, node)
        if piece.tensor(out).data_type is not v.desc.data_type:
            return Support.no(f"{node.label()} changes the data type; a view keeps its source's", node)
        views[out] = v
    return views


ROLES = ("q", "k", "v")


def _readers(piece: Piece) -> dict[int, list[Node]]:
    """The piece's nodes reading each tensor, by UID."""
    readers: dict[int, list[Node]] = {}
    for n in piece.nodes:
        for u in n.input_uids():
            readers.setdefault(u, []).append(n)
    return readers


def operand_views(piece: Piece, node: Node, template: str, also: tuple[str, ...] = ()) -> dict[int, View] | Support:
    """The piece's slices/transposes/reshapes, which must be chains from tensors in memory ending at
    operands of `node` that the kernel reads from memory (sdpa: q, k, v; sdpa_backward: q, k, v, o,
    dO; and the roles in `also` where the kernel reads those through views too): those operands'
    Views by UID."""
    before = piece.nodes[: piece.nodes.index(node)]
    chain = [n for n in before if n.kind in VIEW_KINDS]
    if not chain:
        return {}
    views = memory_views(make_piece(piece.graph, piece.index, before))
    if isinstance(views, Support):
        return views
    roles = (*(ROLES if node.kind == "sdpa" else (*ROLES, "o", "dO")), *also)
    operands = {node.input(r) for r in roles if r in node.op.input_roles()}
    readers = _readers(piece)
    for n in chain:
        out = n.output_uids()[0]
        if out in piece.outputs:
            return Support.no(
                f"{n.label()}: its result is needed outside the kernel; the {template} template "
                "reads views in place and stores none",
                n,
            )
        for r in readers.get(out, []):
            if r is node and out not in operands:
                return Support.no(
                    f"{n.label()} feeds {node.label()} where the {template} template reads no views "
                    f"(only {', '.join(roles)})",
                    n,
                )
            if r is not node and r.kind not in VIEW_KINDS:
                return Support.no(
                    f"{n.label()} feeds {r.label()}; the {template} template reads views only as "
                    f"{node.label()}'s operands, not in prologues",
                    n,
                )
    return {u: v for u, v in views.items() if u in operands}


def gradient_targets(piece: Piece, node: Node, template: str) -> dict[int, View] | Support:
    """Where sdpa_backward's dQ/dK/dV go when the piece holds ops after it: each gradient through a
    chain of transposes and reshapes to a tensor in memory, or on into its slot of a concatenation of
    all of them; the memory each gradient is written to, as a View, by gradient UID."""
    after = piece.nodes[piece.nodes.index(node) + 1 :]
    if not after:
        return {}
    readers = _readers(piece)
    concat = [n for n in after if n.kind == "concatenate"]
    bad = next((n for n in after if n.kind not in ("transpose", "reshape", "concatenate")), None)
    if bad is not None or len(concat) > 1:
        bad = bad or concat[1]
        return Support.no(
            f"the {template} template writes dQ, dK and dV through transposes and reshapes (and one "
            f"concatenation of them); {bad.label()} makes its own piece",
            bad,
        )
    chains: dict[int, list[Node]] = {}
    ends: dict[int, int] = {}  # chain end uid -> gradient uid
    for role in ("dQ", "dK", "dV"):
        g = node.output(role)
        if g is None:
            continue
        chain, u = [], g
        while True:
            nxt = readers.get(u, [])
            if not nxt:
                break
            if len(nxt) > 1 or u in piece.outputs:
                return Support.no(
                    f"{piece.tensor(u).label()} is read twice or also stored; the {template} template "
                    "writes each gradient once",
                    nxt[0],
                )
            kept = piece.tensor(nxt[0].output_uids()[0]).data_type is piece.tensor(g).data_type
            if not kept:  # (the kernel writes the gradient's own type: a rounding on the way would be skipped)
                return Support.no(
                    f"{nxt[0].label()} changes the data type of {piece.tensor(g).label()}; the {template} "
                    "template writes each gradient in its own type",
                    nxt[0],
                )
            if nxt[0].kind == "concatenate":
                break
            chain.append(nxt[0])
            u = nxt[0].output_uids()[0]
        chains[g] = chain
        ends[u] = g
    on = {id(n) for ch in chains.values() for n in ch} | {id(n) for n in concat}
    stray = next((n for n in after if id(n) not in on), None)
    if stray is not None:
        return Support.no(
            f"{stray.label()} does not move {node.label()}'s gradients; the {template} template writes only those",
            stray,
        )
    out: dict[int, View] = {}
    if concat:
        c = concat[0]
        if set(c.input_uids()) != set(ends) or len(c.input_uids()) != len(ends):
            return Support.no(
                f"{c.label()} joins other tensors than {node.label()}'s gradients; the {template} "
                "template writes only those",
                c,
            )
        y = piece.tensor(c.output_uids()[0])
        if y.uid not in piece.outputs:
            return Support.no(
                f"{c.label()}: its result is read in the piece; the {template} template writes the "
                "gradients' concatenation to memory only",
                c,
            )
        axis = c.op.axis % len(y.dim)  # type: ignore[attr-defined]
        at = 0
        for u in c.input_uids():
            t = piece.tensor(u)
            out[u] = View(y.uid, at * y.stride[axis], TensorDesc(u, "", t.dim, y.stride, t.data_type))
            at += t.dim[axis]
    for end, g in ends.items():
        view = out.get(end) or View(end, 0, piece.tensor(end))
        for n in reversed(chains[g]):
            src = piece.tensor(n.input_uids()[0])
            strides = _inverse_strides(n, view.desc, src)
            if strides is None:
                return Support.no(
                    f"{n.label()} regroups axes whose strides are not one run; the {template} template "
                    "cannot write its input in place",
                    n,
                )
            view = View(view.base, view.offset, TensorDesc(src.uid, "", src.dim, strides, src.data_type))
        if view.base != g:
            out[g] = view
    return {g: v for g, v in out.items() if g in chains}


def written_views(piece: Piece, nodes: Sequence[Node], template: str) -> dict[int, tuple[int, View]] | Support:
    """Where a kernel writes the values that transposes/reshapes (`nodes`: views of values the piece
    computes) carry out of it: each chain of them, from a computed value to a tensor the piece writes
    and nothing in it reads, becomes a store of that value through the strides it has inside the
    chain's end (the inverse of each view). By the end's UID: (the value's UID, the View it is
    stored through: base the end, desc the value's dims with strides into that buffer)."""
    readers = _readers(piece)
    mine = {n.output_uids()[0]: n for n in nodes}
    out: dict[int, tuple[int, View]] = {}
    for first in nodes:
        start = first.input_uids()[0]
        if start in mine:
            continue
        chain, n = [], first
        while True:
            if not isinstance(n.op, (Transpose, Reshape)):
                return Support.no(
                    f"{n.label()} slices a computed value; the {template} template writes only transposes "
                    "and reshapes of what it computes",
                    n,
                )
            if piece.tensor(n.output_uids()[0]).data_type is not piece.tensor(start).data_type:
                return Support.no(f"{n.label()} changes the data type; a view keeps its source's", n)
            chain.append(n)
            u = n.output_uids()[0]
            nxt = readers.get(u, [])
            if not nxt:
                break
            if len(nxt) > 1 or u in piece.outputs or nxt[0].output_uids()[0] not in mine:
                return Support.no(
                    f"{piece.tensor(u).label()}, a view of a computed value, is read in the piece or written "
                    f"out before its last view; the {template} template writes such views only at the end of "
                    "a chain",
                    nxt[0],
                )
            n = nxt[0]
        if u not in piece.outputs:
            return Support.no(f"{chain[-1].label()}: nothing reads its result", chain[-1])
        desc = piece.tensor(u)
        for n in reversed(chain):
            src = piece.tensor(n.input_uids()[0])
            strides = _inverse_strides(n, desc, src)
            if strides is None:
                return Support.no(
                    f"{n.label()} regroups axes whose strides are not one run; the {template} template "
                    "cannot write its input in place",
                    n,
                )
            desc = TensorDesc(src.uid, "", src.dim, strides, src.data_type)
        out[u] = (start, View(u, 0, desc))
    return out


def _inverse_strides(n: Node, out: TensorDesc, src: TensorDesc) -> tuple[int, ...] | None:
    """The strides of transpose/reshape `n`'s input `src` inside the memory its output `out` lies in."""
    if isinstance(n.op, Transpose):
        strides = [0] * len(src.dim)
        for k, p in enumerate(n.op.permutation):
            strides[p] = out.stride[k]
        return tuple(strides)
    return reshape_strides(out.dim, out.stride, src.dim)
