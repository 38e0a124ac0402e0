"""Products of one operand computed in one kernel where the estimates say it pays.

The partitioner gives each matmul a piece of its own: a Llama block's SwiGLU is [gate projection + SiLU]
then [up projection x that], and its key and value projections are two pieces reading the same
normalized activations. Two neighbouring pieces whose matmuls multiply the same A by B operands of one
shape are weighed as one piece (the matmul template computes the products side by side from each A tile:
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
    from ..core.ir import Node
    from ..engines.base import Engine


def _main(piece: Piece) -> Node | None:
    """The piece's one matmul (None: not one)."""
    mains = [n for n in piece.nodes if n.kind == "matmul"]
    return mains[0] if len(mains) == 1 else None


def _product(piece: Piece) -> int | None:
    """The A operand of the piece's one matmul (None: not one matmul)."""
    main = _main(piece)
    a = main.input("A") if main is not None else None
    return a if isinstance(a, int) else None


def _alike_over_bucket(piece: Piece, other: Piece) -> bool:
    """Whether the two pieces' matmuls have B operands and results of the same dims at every shape of the
    piece's bucket (their symbolic dims equal), where the graph is a bucket's: dims that only agree at
    the hint would give a merged piece that no kernel serves at the bucket's other shapes."""
    origin = piece.graph.origin
    if origin is None:
        return True
    symbolic = origin.graph.tensors
    one, two = _main(piece), _main(other)
    if one is None or two is None:
        return False
    for first, second in ((one.input("B"), two.input("B")), (one.output_uids()[0], two.output_uids()[0])):
        if not (isinstance(first, int) and isinstance(second, int) and first in symbolic and second in symbolic):
            return False
        if symbolic[first].dim != symbolic[second].dim:
            return False
    return True


def merge_siblings(
    pieces: list[Piece], cuts: list[Cut], engines: Sequence[Engine], device: Device, modes: Sequence[HeurMode]
) -> tuple[list[Piece], list[Cut]]:
    """`pieces` with neighbours whose matmuls share A merged where that is estimated faster (re-indexed),
    and the cuts between merged pieces dropped."""
    if not weighs_pieces(device, modes):
        return pieces, cuts
    groups: list[list[Piece]] = []
    i = 0
    while i < len(pieces):
        piece = pieces[i]
        if i + 1 < len(pieces):
            nxt = pieces[i + 1]
            a = _product(piece)
            if a is not None and a == _product(nxt) and _alike_over_bucket(piece, nxt):
                merged = make_piece(piece.graph, piece.index, [*piece.nodes, *nxt.nodes])
                found = first_estimate(merged, engines, device, modes)
                apart = [first_estimate(p, engines, device, modes) for p in (piece, nxt)]
                if (
                    found is not None
                    and all(a is not None and a[1] == found[1] for a in apart)
                    and found[0] < sum(a[0] for a in apart if a is not None)
                ):
                    groups.append([piece, nxt])
                    i += 2
                    continue
        groups.append([piece])
        i += 1
    if len(groups) == len(pieces):
        return pieces, cuts
    new_index = [j for j, group in enumerate(groups) for _ in group]  # each old piece's new index
    out = [
        group[0]
        if group[0].index == j and len(group) == 1
        else make_piece(pieces[0].graph, j, [n for p in group for n in p.nodes])
        for j, group in enumerate(groups)
    ]
    kept = [Cut(new_index[c.before], c.node, c.reasons) for c in cuts if new_index[c.before] != new_index[c.before + 1]]
    return out, kept


def refine(
    pieces: list[Piece], cuts: list[Cut], engines: Sequence[Engine], device: Device, modes: Sequence[HeurMode]
) -> tuple[list[Piece], list[Cut]]:
    """The partition's pieces re-cut where the engines' estimates say so: matmul prologues apart
    (prologue_split.py), then products of one operand together (merge_siblings)."""
    pieces, cuts = split_prologues(pieces, cuts, engines, device, modes)
    return merge_siblings(pieces, cuts, engines, device, modes)
