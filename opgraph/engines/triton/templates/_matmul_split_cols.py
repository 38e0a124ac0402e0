"""A matmul whose epilogue splits its columns into heads: a language model's query or key projection,
`x @ Wq -> view [B, S, H, D] -> transpose [B, H, S, D]`, then the rotary embedding (`q * cos +
rotate_half(q) * sin`, cos and sin [1, 1, S, D], rotate_half the concatenation of the negated second
half of D and the first). Unfused, the projection writes q and a pointwise kernel reads it back and writes
the rotated copy (bench/results/constants.md#the-part-walk: 13.4 + 6.1 µs a layer of the Llama zoo model's plan).

`split_columns` gives the piece over an output space of the split dims in the product's order, [B, S,
H, D] (rows B, S; columns H, D: gemm/space.py `cols`), with the product's rows merged into A's
[M, K] and B's broadcast batch axes dropped as _matmul_fold.py does, and every epilogue tensor described
in that order: the product's result and the tensors of its rank split along their last axis, the
tensors of the transposed world ([B, H, S, D]) with their axes permuted (same UIDs, same memory), the
reshape and the transposes as pointwise identities, slices and concatenations with their axes remapped.
cos and sin then index as (s, d) per tile element, and rotate_half is a swap of the halves of D within
the tile's registers (gemm/epilogue.py `emit_half`; bench/results/constants.md#rope-in-the-projections-epilogue).
Pieces that do not fit (a reduction, a view that moves more than unit axes, an op naming an axis other
than a slice or a concatenation) stay as they are."""

from __future__ import annotations

import dataclasses
import math

from ....core.ir import Node
from ....core.piece import Piece
from ....core.tensor import TensorDesc
from ....ops.layout import VIEW_KINDS, Concatenate, Reshape, Slice
from ....ops.pointwise import Pointwise, PointwiseMode
from ._matmul_fold import a_chain, b_chains, b_unbatched, merged_rows, overlaid

__all__ = ["split_columns"]

Perm = tuple[int, ...]  # a tensor's axis i is the space's axis perm[i]


def split_columns(piece: Piece) -> Piece | None:
    """The piece over the split output space (module docstring), or None where it has no such split or
    does not fit."""
    mains = [n for n in piece.nodes if n.kind == "matmul"]
    if not mains or any(n.input("A") != mains[0].input("A") for n in mains):
        return None
    tensors = piece.graph.tensors
    a_uid = mains[0].input("A")
    if not isinstance(a_uid, int):
        return None
    outs = {n.output_uids()[0] for n in mains}
    c = tensors[mains[0].output_uids()[0]]
    rank = len(c.dim)
    if not all(isinstance(d, int) for d in c.dim) or any(tensors[u].dim != c.dim for u in outs):
        return None
    width = c.dim[-1]
    split = _split_of(piece, outs, width)
    if split is None:
        return None
    heads, head_dim = split
    space = (*c.dim[:-1], heads, head_dim)
    rows = math.prod(c.dim[:-1])
    chain = b_chains(piece, mains)
    if chain is None or a_chain(piece, a_uid)[1] is not None:
        return None
    operands = {a_uid, *chain.side, *(n.input("B") for n in mains)}
    if any(operands & set(n.input_uids()) for n in piece.nodes if n.kind != "matmul" and id(n) not in chain.views):
        return None  # (an epilogue op reading A or B would index their merged matrices in the split space)
    found = b_unbatched(piece, chain, range(0, rank - 2), rank)  # (B's batch axes dropped, as folding does)
    if found is None:
        return None
    new, replaced = found
    a = tensors[a_uid]
    if len(a.dim) != rank:
        return None
    merged = merged_rows(a, 0, rank - 1, rows) if rank > 2 else a
    if merged is None:
        return None
    new[a_uid] = merged
    if not _epilogue(piece, outs, mains, chain.views, space, new, replaced):
        return None
    return overlaid(piece, new, replaced)


def _split_of(piece: Piece, outs: set[int], width: int) -> tuple[int, int] | None:
    """(heads, head dim) of the reshapes that split the products' last axis, where every reshape reading a
    value computed in the piece (a product, its sum with a bias) does so alike; None where none does."""
    computed = {u for n in piece.nodes if n.kind not in VIEW_KINDS for u in n.output_uids()}
    found = set()
    for n in piece.nodes:
        if n.kind == "reshape" and n.input_uids()[0] in computed:
            x, y = (piece.tensor(u).dim for u in (n.input_uids()[0], n.output_uids()[0]))
            if len(y) != len(x) + 1 or tuple(y[:-2]) != tuple(x[:-1]) or y[-2] * y[-1] != width or y[-1] == 1:
                return None
            found.add((y[-2], y[-1]))
    return found.pop() if len(found) == 1 else None


def _permuted(t: TensorDesc, perm: Perm) -> TensorDesc:
    """`t` described in the space's axis order (its axis i is the space's perm[i])."""
    dims, strides = [0] * len(perm), [0] * len(perm)
    for i, p in enumerate(perm):
        dims[p], strides[p] = t.dim[i], t.stride[i]
    return dataclasses.replace(t, dim=tuple(dims), stride=tuple(strides))


def _split(t: TensorDesc, heads: int, head_dim: int) -> TensorDesc | None:
    """A tensor of the product's rank with its last axis split into (heads, head_dim) (or kept broadcast)."""
    d, s = t.dim[-1], t.stride[-1]
    if d == heads * head_dim:
        return dataclasses.replace(t, dim=(*t.dim[:-1], heads, head_dim), stride=(*t.stride[:-1], s * head_dim, s))
    if d == 1:
        return dataclasses.replace(t, dim=(*t.dim[:-1], 1, 1), stride=(*t.stride[:-1], s, s))
    return None


def _identity(n: Node) -> Node:
    return Node(Pointwise(mode=PointwiseMode.IDENTITY), n.name, n.inputs, n.outputs, n.compute_data_type)


def _epilogue(
    piece: Piece,
    outs: set[int],
    mains: list[Node],
    b_views: frozenset[int],
    space: tuple[int, ...],
    new: dict[int, TensorDesc],
    replaced: dict[int, Node],
) -> bool:
    """Describe the epilogue's tensors in the space's order (into `new`) and its views (into `replaced`);
    False where something does not fit."""
    at = min(piece.nodes.index(m) for m in mains)  # (a product beside the first may come after its epilogue)
    d = _Describer(piece, space, new, replaced)
    if not all(d.split(u) for u in outs):
        return False
    for i, n in enumerate(piece.nodes):
        if n.kind == "matmul" or id(n) in b_views:
            continue
        if i < at:  # (a prologue: the split piece reads A from memory)
            return False
        if not d.node(n):
            return False
    # (views alone, the value projection's for attention to read in place, are left to their reader)
    return any(n.kind in ("pointwise", "concatenate") and d.perm.keys() & set(n.input_uids()) for n in piece.nodes)


class _Describer:
    """The epilogue's tensors in the space's order: `perm` the axes of each tensor of the space's rank
    (from the split reshape's result through transposes), `new` the descriptions, `replaced` the nodes."""

    def __init__(
        self, piece: Piece, space: tuple[int, ...], new: dict[int, TensorDesc], replaced: dict[int, Node]
    ) -> None:
        self.piece, self.space, self.new, self.replaced = piece, space, new, replaced
        self.tensors = piece.graph.tensors
        self.rank = len(space)
        self.identity: Perm = tuple(range(self.rank))
        self.perm: dict[int, Perm] = {}
        self.producer = {u: n for n in piece.nodes for u in n.output_uids()}

    def _fits(self, t: TensorDesc) -> bool:
        """Whether `t` broadcasts to the space, or is a part of its head dims (a half: analysis.half_swap)."""
        last = len(self.space) - 1
        return all(d in (1, s) or (i == last and s % d == 0) for i, (d, s) in enumerate(zip(t.dim, self.space)))

    def describe(self, u: int, p: Perm) -> bool:
        """Tensor u (of the space's rank) with its axes at `p` in the space."""
        if u in self.perm:
            return self.perm[u] == p
        self.perm[u] = p
        self.new[u] = _permuted(self.tensors[u], p)
        return self._fits(self.new[u])

    def split(self, u: int) -> bool:
        """Tensor u (of the product's rank) with its last axis split into the heads and the head dims."""
        if u in self.new or u in self.perm:
            return u not in self.perm
        t = self.tensors[u]
        found = _split(t, self.space[-2], self.space[-1]) if len(t.dim) == self.rank - 1 else None
        if found is None or not self._fits(found):
            return False
        self.new[u] = found
        return True

    def node(self, n: Node) -> bool:
        """Describe node n's tensors (False: it does not fit)."""
        ins, out = n.input_uids(), n.output_uids()
        if n.kind == "reshape":
            src = ins[0]
            if src in self.new and src not in self.perm:  # (the split of a product's value)
                if self.tensors[out[0]].dim != self.new[src].dim:
                    return False
                self.replaced[id(n)] = _identity(n)
                return self.describe(out[0], self.identity)
            return src not in self.perm  # (a view of memory: described where an op reads it)
        if n.kind in ("transpose", "slice", "concatenate"):
            ps = {self.perm.get(u) for u in ins}
            if len(ps) != 1 or None in ps:
                return False
            (p,) = ps
            assert p is not None
            self.replaced[id(n)] = self._remapped(n, p)
            return self.describe(out[0], self._out_perm(n, p))
        if n.kind != "pointwise" or getattr(n.op, "axis", None) is not None:
            return False
        on_path = {self.perm[u] for u in ins if u in self.perm}
        if len(on_path) > 1:
            return False
        p = on_path.pop() if on_path else self.identity
        for u in ins:
            if not self._operand(u, p):
                return False
        if {len(self.tensors[u].dim) for u in out} == {self.rank - 1}:
            return all(self.split(u) for u in out)
        return all(self.describe(u, p) for u in out)

    def _operand(self, u: int, p: Perm) -> bool:
        """An operand of a pointwise op at permutation `p`: described (a view of memory made to read so)."""
        if u in self.perm or u in self.new or self.tensors[u].numel == 1:
            return True
        size = len(self.tensors[u].dim)
        if size not in (self.rank - 1, self.rank) or not (self.split(u) if size < self.rank else self.describe(u, p)):
            return False
        view = self.producer.get(u)
        if view is None or view.kind not in VIEW_KINDS:
            return True
        if view.kind != "reshape" or view.input_uids()[0] in self.producer:
            return False
        # (read as a reshape to the permuted dims: right where p keeps its axes of more than one element in order,
        # as cos and sin's [B, 1, S, D] -> [B, S, 1, D]; a [1, H, S, 1] operand's would swap H and S)
        moved = [p[i] for i, d in enumerate(self.tensors[u].dim) if d != 1]
        if moved != sorted(moved):
            return False
        self.replaced[id(view)] = dataclasses.replace(view, op=Reshape(dim=tuple(self.new[u].dim)))
        return True

    def _out_perm(self, n: Node, p: Perm) -> Perm:
        if n.kind == "transpose":
            pi = n.op.permutation  # type: ignore[attr-defined]
            return tuple(p[pi[i]] for i in range(self.rank))
        return p

    def _remapped(self, n: Node, p: Perm) -> Node:
        """Node n with its axes in the space's order: a transpose an identity, a slice's bounds and a
        concatenation's axis moved."""
        if n.kind == "transpose":
            return _identity(n)
        if n.kind == "slice":
            bounds = n.op.bounds(None, self.tensors[n.input_uids()[0]].dim)  # type: ignore[attr-defined]
            moved = list(bounds)
            for i, b in enumerate(bounds):
                moved[p[i]] = b
            return dataclasses.replace(n, op=Slice(slices=tuple(moved)))
        op = n.op
        assert isinstance(op, Concatenate)
        return dataclasses.replace(n, op=dataclasses.replace(op, axis=p[op.axis % self.rank]))
