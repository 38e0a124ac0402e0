"""Attention operands that are views of memory: q/k/v (and the backward's o/dO) read in place through
slices, reshapes and transposes of tensors in memory (the heads of a fused qkv projection), and the
backward's dQ/dK/dV written through transposes and reshapes, and into their slots of a concatenation
(the projection's input gradient). Each as a gemm `View`: the buffer, an element offset, strides."""

from __future__ import annotations

from ....core.config import Support
from ....core.ir import Node
from ....core.piece import Piece, make_piece
from ....core.tensor import TensorDesc
from ....ops.layout import Transpose
from ..gemm import VIEW_KINDS, View, memory_views
from ..gemm.analysis import reshape_strides

ROLES = ("q", "k", "v")


def _readers(piece: Piece) -> dict[int, list[Node]]:
    """The piece's nodes reading each tensor, by UID."""
    readers: dict[int, list[Node]] = {}
    for n in piece.nodes:
        for u in n.input_uids():
            readers.setdefault(u, []).append(n)
    return readers


def operand_views(piece: Piece, node: Node, template: str) -> dict[int, View] | Support:
    """The piece's slices/transposes/reshapes, which must be chains from tensors in memory ending at
    operands of `node` that the kernel reads from memory (sdpa: q, k, v; sdpa_backward: q, k, v, o,
    dO): those operands' Views by UID."""
    before = piece.nodes[:piece.nodes.index(node)]
    chain = [n for n in before if n.kind in VIEW_KINDS]
    if not chain:
        return {}
    views = memory_views(make_piece(piece.graph, piece.index, before))
    if isinstance(views, Support):
        return views
    roles = ROLES if node.kind == "sdpa" else (*ROLES, "o", "dO")
    operands = {node.input(r) for r in roles}
    readers = _readers(piece)
    for n in chain:
        out = n.output_uids()[0]
        if out in piece.outputs:
            return Support.no(f"{n.label()}: its result is needed outside the kernel; the {template} template "
                              "reads views in place and stores none", n)
        for r in readers.get(out, []):
            if r is node and out not in operands:
                return Support.no(f"{n.label()} feeds {node.label()} where the {template} template reads no views "
                                  f"(only {', '.join(roles)})", n)
            if r is not node and r.kind not in VIEW_KINDS:
                return Support.no(f"{n.label()} feeds {r.label()}; the {template} template reads views only as "
                                  f"{node.label()}'s operands, not in prologues", n)
    return {u: v for u, v in views.items() if u in operands}


def gradient_targets(piece: Piece, node: Node, template: str) -> dict[int, View] | Support:
    """Where sdpa_backward's dQ/dK/dV go when the piece holds ops after it: each gradient through a
    chain of transposes and reshapes to a tensor in memory, or on into its slot of a concatenation of
    all of them; the memory each gradient is written to, as a View, by gradient UID."""
    after = piece.nodes[piece.nodes.index(node) + 1:]
    if not after:
        return {}
    readers = _readers(piece)
    concat = [n for n in after if n.kind == "concatenate"]
    bad = next((n for n in after if n.kind not in ("transpose", "reshape", "concatenate")), None)
    if bad is not None or len(concat) > 1:
        bad = bad or concat[1]
        return Support.no(f"the {template} template writes dQ, dK and dV through transposes and reshapes (and one "
                          f"concatenation of them); {bad.label()} makes its own piece", bad)
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
                return Support.no(f"{piece.tensor(u).label()} is read twice or also stored; the {template} template "
                                  "writes each gradient once", nxt[0])
            kept = piece.tensor(nxt[0].output_uids()[0]).data_type is piece.tensor(g).data_type
            if not kept:  # (the kernel writes the gradient's own type: a rounding on the way would be skipped)
                return Support.no(f"{nxt[0].label()} changes the data type of {piece.tensor(g).label()}; the {template} "
                                  "template writes each gradient in its own type", nxt[0])
            if nxt[0].kind == "concatenate":
                break
            chain.append(nxt[0])
            u = nxt[0].output_uids()[0]
        chains[g] = chain
        ends[u] = g
    on = {id(n) for ch in chains.values() for n in ch} | {id(n) for n in concat}
    stray = next((n for n in after if id(n) not in on), None)
    if stray is not None:
        return Support.no(f"{stray.label()} does not move {node.label()}'s gradients; the {template} template writes "
                          "only those", stray)
    out: dict[int, View] = {}
    if concat:
        c = concat[0]
        if set(c.input_uids()) != set(ends) or len(c.input_uids()) != len(ends):
            return Support.no(f"{c.label()} joins other tensors than {node.label()}'s gradients; the {template} "
                              "template writes only those", c)
        y = piece.tensor(c.output_uids()[0])
        if y.uid not in piece.outputs:
            return Support.no(f"{c.label()}: its result is read in the piece; the {template} template writes the "
                              "gradients' concatenation to memory only", c)
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
                return Support.no(f"{n.label()} regroups axes whose strides are not one run; the {template} template "
                                  "cannot write its input in place", n)
            view = View(view.base, view.offset, TensorDesc(src.uid, "", src.dim, strides, src.data_type))
        if view.base != g:
            out[g] = view
    return {g: v for g, v in out.items() if g in chains}


def _inverse_strides(n: Node, out: TensorDesc, src: TensorDesc) -> tuple[int, ...] | None:
    """The strides of transpose/reshape `n`'s input `src` inside the memory its output `out` lies in."""
    if isinstance(n.op, Transpose):
        strides = [0] * len(src.dim)
        for k, p in enumerate(n.op.permutation):
            strides[p] = out.stride[k]
        return tuple(strides)
    return reshape_strides(out.dim, out.stride, src.dim)
