"""Products of one operand computed in one kernel where the estimates say it pays.

The partitioner gives each matmul a piece of its own: a Llama block's SwiGLU is [gate projection + SiLU]
then [up projection x that], and its key and value projections are two pieces reading the same
normalized activations. Two pieces whose matmuls multiply the same A by B operands of one shape (neighbours,
or a few pieces apart where those do not read the first: a training step's weight casts) are weighed as
one piece (the matmul template computes the products side by side from each A tile:
GemmPiece.siblings), against the two apart, with the engines' estimates (the first config each ranking
gives, as the build would run it): merged, A is read once, no intermediate between them goes through
memory (SiLU(gate) is read by the up projection's epilogue in registers), and one launch is saved. They
are merged where one engine goes first on the merged piece and on both apart (its cost model weighs both
ways; another engine's first config may run only one of the products, or both as one graph it gets
wrong: cudnn_frontend._side_by_side) and the merged piece's estimate is below the sum of the two. In a
dynamic plan's bucket the estimates are the hint's, and the merged kernel takes its sizes at run time as
the two would.

`refine` is what the planners run after the partition: prologues apart (prologue_split.py), then this.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..core.config import HeurMode
from ..core.piece import Piece, make_piece
from .partition import Cut
from .prologue_split import first_estimate, split_prologues, weighs_pieces

if TYPE_CHECKING:
    from ..core.device import Device
    from ..engines.base import Engine


def _product(piece: Piece) -> int | None:
    """The A operand of the piece's one matmul (None: not one matmul)."""
    mains = [n for n in piece.nodes if n.kind == "matmul"]
    if len(mains) != 1:
        return None
    a = mains[0].input("A")
    return a if isinstance(a, int) else None


def _alike_over_bucket(piece: Piece, other: Piece) -> bool:
    """Whether the two pieces' matmuls have B operands and results of the same dims at every shape of the
    piece's bucket (their symbolic dims equal), where the graph is a bucket's: dims that only agree at
    the hint would give a merged piece that no kernel serves at the bucket's other shapes."""
    origin = piece.graph.origin
    if origin is None:
        return True
    symbolic = origin.graph.tensors
    mains = [next(n for n in p.nodes if n.kind == "matmul") for p in (piece, other)]
    for uids in ([m.input("B") for m in mains], [m.output_uids()[0] for m in mains]):
        if not all(isinstance(u, int) and u in symbolic for u in uids):
            return False
        if symbolic[uids[0]].dim != symbolic[uids[1]].dim:
            return False
    return True


LOOKAHEAD = 2  # pieces the first of two siblings may be moved past (a training step's weight casts between them)


def _reads_from(piece: Piece, source: Piece) -> bool:
    """Whether `piece` reads a tensor `source` makes."""
    made = {u for n in source.nodes for u in n.output_uids()}
    return any(u in made for n in piece.nodes for u in n.input_uids() if isinstance(u, int))


def _pays(piece: Piece, other: Piece, engines: Sequence[Engine], device: Device, modes: Sequence[HeurMode]) -> bool:
    """Whether one engine goes first on the two products merged and on each apart, and estimates the merged
    piece below the two apart."""
    merged = make_piece(piece.graph, piece.index, [*piece.nodes, *other.nodes])
    found = first_estimate(merged, engines, device, modes)
    apart = [first_estimate(p, engines, device, modes) for p in (piece, other)]
    return (
        found is not None
        and all(a is not None and a[1] == found[1] for a in apart)
        and found[0] < sum(a[0] for a in apart if a is not None)
    )


def merge_siblings(
    pieces: list[Piece], cuts: list[Cut], engines: Sequence[Engine], device: Device, modes: Sequence[HeurMode]
) -> tuple[list[Piece], list[Cut]]:
    """`pieces` with pairs whose matmuls share A merged where that is estimated faster (re-indexed), and the
    cuts into merged pieces dropped. The pair is neighbours, or up to LOOKAHEAD pieces apart where none of
    the pieces between reads the first (a training step casts each weight in a piece of its own, between
    the SwiGLU's gate and up projections): the merged piece then runs where the second did."""
    if not weighs_pieces(device, modes):
        return pieces, cuts
    into: dict[int, int] = {}  # second's index -> the first's, merged into its place
    moved: set[int] = set()
    for i, piece in enumerate(pieces):
        a = _product(piece)
        if a is None or i in moved or i in into:
            continue
        for j in range(i + 1, min(len(pieces), i + 2 + LOOKAHEAD)):
            other = pieces[j]
            if j in into or _product(other) != a:
                continue
            if any(_reads_from(pieces[k], piece) for k in range(i + 1, j)) or not _alike_over_bucket(piece, other):
                break
            if _pays(piece, other, engines, device, modes):
                into[j] = i
                moved.add(i)
            break
    if not into:
        return pieces, cuts
    groups = [[pieces[into[j]], p] if j in into else [p] for j, p in enumerate(pieces) if j not in moved]
    out = [
        group[0]
        if group[0].index == g and len(group) == 1
        else make_piece(pieces[0].graph, g, [n for p in group for n in p.nodes])
        for g, group in enumerate(groups)
    ]
    # a cut is kept where its node still begins a piece: it is then the cut before that piece
    begins = {id(piece.nodes[0]): g for g, piece in enumerate(out)}
    kept = [Cut(begins[id(c.node)] - 1, c.node, c.reasons) for c in cuts if begins.get(id(c.node), 0) > 0]
    return out, kept


def refine(
    pieces: list[Piece], cuts: list[Cut], engines: Sequence[Engine], device: Device, modes: Sequence[HeurMode]
) -> tuple[list[Piece], list[Cut]]:
    """The partition's pieces re-cut where the engines' estimates say so: matmul prologues apart
    (prologue_split.py), then products of one operand together (merge_siblings)."""
    pieces, cuts = split_prologues(pieces, cuts, engines, device, modes)
    return merge_siblings(pieces, cuts, engines, device, modes)
