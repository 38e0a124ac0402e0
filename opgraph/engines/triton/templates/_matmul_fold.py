"""Folding a matmul's batch axes into its rows: C[b..., M, N] = A[b..., M, K] @ B[1..., K, N], B the
same matrix for every batch entry (a Linear layer over [N, H, W, C] activations, channels-last CNNs
and ViT tokens), is one 2-D GEMM of M' = prod(b...) * M rows where A's and C's batch and row axes nest
in memory. Unfolded, each batch entry is a grid slice of its own: a ConvNeXt block's MLP over
[64, 14, 14, 384] ran 896 slices of 14 rows in 64-row tiles (a fifth of each tile's rows real) and
no operand had the single batch axis a TMA descriptor takes.

`fold_rows` gives the piece over tensors with those axes merged (same UIDs, same memory, lower rank)
where every tensor of the piece allows it, else None; the matmul template matches that piece. The
matmul, elementwise ops and reductions fold (a reduction names its axes by its output's dims of 1, which
merge like any tensor's: a bias gradient summed over batch and tokens becomes a sum over the rows); B is
read by the matmul alone and its batch axes are dropped rather than merged, through the transposes and
slices it is read by in place (a Linear's weight in a training step's data gradient), whose attributes
lose those axes. Other views and index-generating ops (whose attributes name axes) do not fold. A piece
folds wherever it can, a product beside the matmul (GemmPiece.siblings) with it: a 2-D product has 2-D
descriptors and TMA stores on Hopper, which a batch axis takes from it (the Llama zoo model's projections
over [8, 1024, d] activations, bench/results/constants.md#folded-rows). In a dynamic plan's bucket the
decision is the symbolic piece's (the bucket's kernel takes M' = batch x rows as a run-time size) and the
piece at a shape follows it."""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Iterator, Mapping

from ....core.ir import Node
from ....core.piece import Piece
from ....core.tensor import TensorDesc
from ....ops.layout import Reshape, Slice, Transpose
from ..sizes import symbolic_piece

__all__ = ["BChain", "a_chain", "b_chains", "b_unbatched", "fold_rows", "merged_rows", "overlaid"]


class _Overlay(Mapping[int, TensorDesc]):
    """The graph's tensors with some replaced (no copy of the whole graph's table per match)."""

    def __init__(self, base: Mapping[int, TensorDesc], new: dict[int, TensorDesc]) -> None:
        self.base, self.new = base, new

    def __getitem__(self, uid: int) -> TensorDesc:
        found = self.new.get(uid)
        return found if found is not None else self.base[uid]

    def __iter__(self) -> Iterator[int]:
        return iter(self.base)

    def __len__(self) -> int:
        return len(self.base)


def merged_rows(t: TensorDesc, lo: int, hi: int, rows: int) -> TensorDesc | None:
    """`t` with axes lo..hi-1 merged into one of `rows` (or 1, broadcast) elements; None where they do
    not nest in memory or broadcast over only some of them."""
    dims, strides = t.dim[lo:hi], t.stride[lo:hi]
    size = math.prod(dims)
    if size == 1:
        dim, stride = 1, strides[-1]
    elif size == rows:
        kept = [(d, s) for d, s in zip(dims, strides) if d != 1]
        if any(kept[i][1] != kept[i + 1][1] * kept[i + 1][0] for i in range(len(kept) - 1)):
            return None
        dim, stride = size, kept[-1][1]
    else:
        return None
    return dataclasses.replace(t, dim=(*t.dim[:lo], dim, *t.dim[hi:]), stride=(*t.stride[:lo], stride, *t.stride[hi:]))


def fold_rows(piece: Piece) -> Piece | None:
    """The piece with the matmul's broadcast batch axes folded into its rows (module docstring), or None.
    A piece of a dynamic plan's bucket folds as its symbolic origin does (the bucket's kernel is decided
    over that: sizes.bucket_analysis), so that the two agree."""
    if piece.graph.origin is None:
        lo = _fold_axis(piece)
    else:
        symbolic = symbolic_piece(piece)
        lo = _fold_axis(symbolic) if symbolic is not None else None
    return None if lo is None else _folded(piece, lo)


def _fold_axis(piece: Piece) -> int | None:
    """The first axis of the run folded into the rows (B broadcast over it and those up to the rows), where
    the piece is plain and folding changes its tiling; None otherwise. Sizes may be expressions (a
    bucket's symbolic piece): a dynamic axis counts as more than 1, a dynamic M as not filling tiles."""
    graph = piece.graph
    mains = [n for n in piece.nodes if n.kind == "matmul"]
    if not mains or any(n.input("A") != mains[0].input("A") for n in mains):
        return None
    main = mains[0]
    a_uid, b_uid, c_uid = main.input("A"), main.input("B"), main.output_uids()[0]
    if not isinstance(a_uid, int) or not isinstance(b_uid, int):
        return None
    chain = b_chains(piece, mains)
    if chain is None:
        return None
    b_views, b_side = chain.views, chain.side
    a_views = a_chain(piece, a_uid)[0]
    for n in piece.nodes:
        if n.kind == "matmul" or id(n) in b_views or id(n) in a_views:
            continue
        if _leading_ones(n, piece) is not None:
            continue  # (a bias given the output's rank: _folded checks it broadcasts over the rows)
        if n.kind not in _FOLDING_KINDS or getattr(n.op, "axis", None) is not None:
            return None
    if a_uid in b_side or any(
        u in b_side for n in piece.nodes if n not in mains and id(n) not in b_views for u in n.input_uids()
    ):
        return None  # (B's batch axes are dropped, not merged: another reader would index them as rows)
    if any(u in b_side for n in piece.nodes if id(n) in b_views for u in n.output_uids() if u in piece.outputs):
        return None
    a, b, c = graph.tensors[a_uid], graph.tensors[b_uid], graph.tensors[c_uid]
    rank = len(c.dim)
    if len(a.dim) != rank or len(b.dim) != rank:
        return None
    lo = rank - 2
    while lo > 0 and b.dim[lo - 1] == 1:
        lo -= 1
    return None if lo == rank - 2 else lo


_FOLDING_KINDS = ("pointwise", "reduction")  # (genstats sums per channel, axis 1: no rows to merge)


@dataclasses.dataclass(frozen=True)
class BChain:
    """The piece's views that make B, read from B up: `views` all of them (ids); `at_rank` those at the
    product's rank, whose attributes lose the folded axes (up to and with a reshape adding unit axes);
    `side` B and the tensors those views other than the reshape read (their folded axes are dropped);
    `unbatched` the tensors from the reshape up, which have no batch axes to drop."""

    views: frozenset[int]
    at_rank: frozenset[int]
    side: frozenset[int]
    unbatched: frozenset[int]


def b_chains(piece: Piece, mains: list[Node]) -> BChain | None:
    """The B chains of every product of the piece (one, or one with its siblings) as one."""
    found = []
    for main in mains:
        b_uid = main.input("B")
        chain = _b_chain(piece, b_uid) if isinstance(b_uid, int) else None
        if chain is None:
            return None
        found.append(chain)
    return BChain(
        *(frozenset().union(*(getattr(c, f) for c in found)) for f in ("views", "at_rank", "side", "unbatched"))
    )


def _b_chain(piece: Piece, b_uid: int) -> BChain | None:
    """B's chain of transposes and slices read in place from memory, and a reshape giving a matrix leading
    unit axes (a weight broadcast over a batch, as PyTorch's matmul does for [B, S, K] @ [K, N]); empty
    where B is an input, None where something else makes it."""
    producer = {u: n for n in piece.nodes for u in n.output_uids()}
    views: set[int] = set()
    at_rank: set[int] = set()
    side: set[int] = {b_uid}
    unbatched: set[int] = set()
    below = False  # (past the reshape)
    u = b_uid
    while (node := producer.get(u)) is not None:
        reshape = _leading_ones(node, piece) is not None
        if not reshape and not isinstance(node.op, (Transpose, Slice)):
            return None
        views.add(id(node))
        sources = node.input_uids()
        if not below:
            at_rank.add(id(node))
        (unbatched if below or reshape else side).update(sources)
        below = below or reshape
        u = sources[0]
    return BChain(frozenset(views), frozenset(at_rank), frozenset(side), frozenset(unbatched))


def a_chain(piece: Piece, a_uid: int) -> tuple[frozenset[int], Node | None, frozenset[int]]:
    """A's views read in place from memory, where A is a reshape's result (the attention output's heads
    transposed back to tokens and merged, read by the output projection): (the chain's nodes by id, the reshape,
    the tensors before it, which keep their rank); empty where A is made otherwise or a tensor of the chain is
    read by another op or leaves the piece. The reshape's result merges its rows like any tensor's, so the
    reshape is rewritten to those dims (the views before it are read as they are). Static shapes only: whether
    the folded reshape is a view in place is not decided over a bucket's symbolic sizes, and a bucket piece folds
    as its symbolic piece does (fold_rows)."""
    producer = {u: n for n in piece.nodes for u in n.output_uids()}
    reshape = producer.get(a_uid)
    empty: tuple[frozenset[int], Node | None, frozenset[int]] = (frozenset(), None, frozenset())
    if reshape is None or not isinstance(reshape.op, Reshape):
        return empty
    if not all(isinstance(d, int) for n in piece.nodes for u in n.output_uids() for d in piece.tensor(u).dim):
        return empty
    readers: dict[int, int] = {}
    for n in piece.nodes:
        for u in n.input_uids():
            readers[u] = readers.get(u, 0) + 1
    views, before = {id(reshape)}, set()
    u = reshape.input_uids()[0]
    while True:
        if readers.get(u, 0) != 1 or u in piece.outputs:
            return empty
        before.add(u)
        node = producer.get(u)
        if node is None:  # (read from memory)
            return frozenset(views), reshape, frozenset(before)
        if not isinstance(node.op, (Transpose, Reshape, Slice)):
            return empty
        views.add(id(node))
        u = node.input_uids()[0]


def _leading_ones(node: Node, piece: Piece) -> int | None:
    """How many leading unit axes a reshape adds to its input's dims (it adds only those), or None."""
    if not isinstance(node.op, Reshape):
        return None
    x, y = (piece.tensor(u).dim for u in (node.input_uids()[0], node.output_uids()[0]))
    added = len(y) - len(x)
    if added < 1 or tuple(y[added:]) != tuple(x) or any(d != 1 for d in y[:added]):
        return None
    return added


def _dropped(t: TensorDesc, drop: range) -> TensorDesc:
    keep = [i for i in range(len(t.dim)) if i not in drop]
    return dataclasses.replace(t, dim=tuple(t.dim[i] for i in keep), stride=tuple(t.stride[i] for i in keep))


def _view_without(node: Node, drop: range, rank: int, piece: Piece) -> Node | None:
    """A transpose or slice of B's chain with axes `drop` (all of size 1, kept in place) left out of its
    attributes, or a reshape adding unit axes with fewer of them; None where the view moves them."""
    op = node.op
    keep = [i for i in range(rank) if i not in drop]
    added = _leading_ones(node, piece)
    if added is not None:
        if drop.stop > added:  # (a dropped axis the reshape does not add)
            return None
        dim = piece.tensor(node.output_uids()[0]).dim
        return dataclasses.replace(node, op=Reshape(dim=tuple(dim[i] for i in keep)))
    if isinstance(op, Transpose):
        perm = tuple(op.permutation)
        if len(perm) != rank or any(perm[i] != i for i in drop):
            return None
        op = dataclasses.replace(op, permutation=tuple(keep.index(perm[i]) for i in keep))
    else:
        assert isinstance(op, Slice)
        if len(op.slices) != rank:
            return None
        op = dataclasses.replace(op, slices=tuple(op.slices[i] for i in keep))
    return dataclasses.replace(node, op=op)


def b_unbatched(
    piece: Piece, chain: BChain, drop: range, rank: int
) -> tuple[dict[int, TensorDesc], dict[int, Node]] | None:
    """B's chain with its batch axes `drop` (all of one element) left out: the descriptions of the tensors B
    is made from and the chain's views at the product's rank rewritten without those axes; None where a
    view moves them or a tensor has them larger than one."""
    replaced: dict[int, Node] = {}
    for n in piece.nodes:
        if id(n) in chain.at_rank:
            kept = _view_without(n, drop, rank, piece)
            if kept is None:
                return None
            replaced[id(n)] = kept
    new: dict[int, TensorDesc] = {}
    for u in chain.side:
        t = piece.graph.tensors[u]
        if len(t.dim) != rank or any(t.dim[i] != 1 for i in drop):
            return None
        new[u] = _dropped(t, drop)
    return new, replaced


def _folded(piece: Piece, lo: int) -> Piece | None:
    """The piece with axes lo..M of its tensors merged (B's lo..K-1 dropped, and so the tensors and views
    that make it), where every tensor allows it."""
    graph = piece.graph
    mains = [n for n in piece.nodes if n.kind == "matmul"]
    c_uid = mains[0].output_uids()[0]
    rows_of = (mains[0].input("A"), *(n.output_uids()[0] for n in mains))
    rank = len(graph.tensors[c_uid].dim)
    rows = math.prod(graph.tensors[c_uid].dim[lo : rank - 1])
    drop = range(lo, rank - 2)
    chain = b_chains(piece, mains)
    assert chain is not None  # (_fold_axis)
    views, b_side = chain.views, chain.side
    found = b_unbatched(piece, chain, drop, rank)
    if found is None:
        return None
    new, replaced = found
    unbatched = set(chain.unbatched)
    _, a_reshape, a_before = a_chain(piece, mains[0].input("A"))  # type: ignore[arg-type]
    unbatched |= a_before
    for n in piece.nodes:  # a bias given the output's rank: its unit axes merge like the rows'
        if id(n) not in views and _leading_ones(n, piece) is not None:
            y = graph.tensors[n.output_uids()[0]]
            merged = merged_rows(y, lo, rank - 1, rows)
            if len(y.dim) != rank or merged is None or merged.dim[lo] != 1:
                return None
            replaced[id(n)] = dataclasses.replace(n, op=Reshape(dim=tuple(merged.dim)))
            unbatched.update(n.input_uids())
    for u in {u for n in piece.nodes for u in (*n.input_uids(), *n.output_uids())} - unbatched:
        t = graph.tensors[u]
        if u in b_side:  # (described by b_unbatched)
            continue
        if len(t.dim) != rank:
            if t.numel == 1:  # (a one-element operand broadcasts at any rank)
                continue
            return None
        merged = merged_rows(t, lo, rank - 1, rows)
        if merged is None or (u in rows_of and merged.dim[lo] != rows):
            return None
        new[u] = merged
    if a_reshape is not None:
        replaced[id(a_reshape)] = dataclasses.replace(
            a_reshape, op=Reshape(dim=tuple(new[a_reshape.output_uids()[0]].dim))
        )
    return overlaid(piece, new, replaced)


def overlaid(piece: Piece, tensors: dict[int, TensorDesc], replaced: Mapping[int, Node]) -> Piece:
    """The piece over its graph with `tensors` replacing some descriptors and `replaced` (id of a node ->
    its replacement) some nodes: same UIDs, same memory."""
    graph = piece.graph
    # a shallow copy: the nodes, and all that is derived from them, are the graph's own (a replace would
    # derive them again, for every match of a growing piece: quadratic in the graph); what is derived
    # from the tensors' sizes is not
    copied = copy.copy(graph)
    object.__setattr__(copied, "tensors", _Overlay(graph.tensors, tensors))
    object.__setattr__(copied, "_at", {})
    for derived in ("_shape_function", "node_positions", "memo"):  # (by the nodes' ids, or over the tensors)
        copied.__dict__.pop(derived, None)
    if replaced:  # in the graph's node order too (a bucket's symbolic piece maps nodes by it)
        object.__setattr__(copied, "nodes", tuple(replaced.get(id(n), n) for n in graph.nodes))
    nodes = tuple(replaced.get(id(n), n) for n in piece.nodes)
    return dataclasses.replace(piece, nodes=nodes, graph=copied, growth=None)
