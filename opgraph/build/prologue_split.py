"""Prologues run apart from their matmul where the estimates say the fused kernel is slower.

The partitioner fuses greedily: a pointwise op whose only reader is a matmul becomes that matmul's
operand prologue (a language model's final RMSNorm before its LM head). The fused kernel applies
the prologue to every operand tile it loads, once per column tile of the product (N / BLOCK_N times
for A), in the registers of the tensor-core loop, and the operand can no longer be read through TMA:
for the LM head of the Llama zoo model (8192 x 32000 x 1024) the fused step took 1,171 µs where the
plain product took 767 and the norm alone 14 (bench/results/constants.md#prologue-split). So each
matmul piece with a prologue is weighed both ways with the engines' estimates (the first config each
ranking gives, as the build would run it): the whole piece, against the prologue and the rest as two
pieces plus a launch; it is split where that is below SPLIT_BELOW of the whole. Convolutions keep
their prologues: their templates offer the pass apart themselves (PROLOGUE_PASS, measured).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..core.config import HeurMode
from ..core.piece import Piece, make_piece
from ..ops.layout import VIEW_KINDS
from .heuristics import rank_configs
from .partition import Cut

if TYPE_CHECKING:
    from ..core.device import Device
    from ..core.ir import Node
    from ..engines.base import Engine

SPLIT_BELOW = 0.9  # apart / fused estimate under which the prologue runs apart
LAUNCH_US = 3.0  # the second launch, added to the apart estimate


def weighs_pieces(device: Device, modes: Sequence[HeurMode]) -> bool:
    """Whether the build re-cuts the partition's pieces by the engines' estimates (on a GPU, where they
    have a cost model; not for a fallback-only build)."""
    return device.is_cuda and not (HeurMode.FALLBACK in modes and len(modes) == 1)


def first_estimate(
    piece: Piece, engines: Sequence[Engine], device: Device, modes: Sequence[HeurMode], engine: str | None = None
) -> tuple[float, str] | None:
    """(estimate, engine) of the piece's first config (as the build would run it), or of the first
    config of `engine` where it offers one: the ways of cutting a piece are weighed in one engine's cost
    model, whose scale the others' need not share (a lone matmul that cuBLAS leads on is still weighed
    as the generated kernel it would be when the fused piece is). None where no config runs it."""
    ranked = list(rank_configs(piece, engines, device, modes).configs)
    if engine is not None:
        ranked = [c for c in ranked if c.engine == engine] or ranked
    if not ranked or ranked[0].estimate_us is None:
        return None
    return ranked[0].estimate_us, ranked[0].engine


def estimate_in(
    piece: Piece, engines: Sequence[Engine], device: Device, modes: Sequence[HeurMode], engine: str | None
) -> float | None:
    """first_estimate's estimate alone, of `engine`'s first config where it offers one."""
    found = first_estimate(piece, engines, device, modes, engine)
    return None if found is None else found[0]


def _parts(piece: Piece) -> list[list[Node]] | None:
    """(prologue, rest) of a matmul piece whose ops before the matmul compute something (not views only)."""
    at = next((i for i, n in enumerate(piece.nodes) if n.kind == "matmul"), None)
    if not at or all(n.kind in VIEW_KINDS for n in piece.nodes[:at]):
        return None
    return [list(piece.nodes[:at]), list(piece.nodes[at:])]


def split_prologues(
    pieces: list[Piece], cuts: list[Cut], engines: Sequence[Engine], device: Device, modes: Sequence[HeurMode]
) -> tuple[list[Piece], list[Cut]]:
    """`pieces` with the prologues worth running apart made pieces of their own (re-indexed), and the
    cuts with one more for each, naming both estimates."""
    if not weighs_pieces(device, modes):
        return pieces, cuts
    groups: list[list[list[Node]]] = []
    added: list[Cut] = []
    for piece in pieces:
        parts = _parts(piece)
        split = None
        if parts is not None:
            graph = piece.graph
            found = first_estimate(piece, engines, device, modes)
            whole, engine = found if found is not None else (None, None)
            pre, rest = (
                estimate_in(make_piece(graph, piece.index, part), engines, device, modes, engine) for part in parts
            )
            if (
                whole is not None
                and pre is not None
                and rest is not None
                and pre + rest + LAUNCH_US < SPLIT_BELOW * whole
            ):
                split = parts
                why = (
                    f"the prologue runs apart: estimated {pre:.0f} + {rest:.0f} µs against {whole:.0f} fused "
                    "[build.prologue_split]"
                )
                added.append(Cut(len(groups), parts[1][0], (("partition", why),)))
        groups.append(split or [list(piece.nodes)])
    if not added:
        return pieces, cuts
    first: list[int] = []  # each old piece's first new index
    out: list[Piece] = []
    for nodes_list in groups:
        first.append(len(out))
        for nodes in nodes_list:
            out.append(make_piece(pieces[0].graph, len(out), nodes))
    moved = [Cut(first[c.before] + len(groups[c.before]) - 1, c.node, c.reasons) for c in cuts]
    moved += [Cut(first[c.before], c.node, c.reasons) for c in added]
    return out, sorted(moved, key=lambda c: c.before)
