"""A dynamic plan's piece over its bucket's symbolic origin: what the engines' analyses decide over
when a kernel is to serve every shape of a bucket (docs/design/dynamic-shapes.md)."""

from __future__ import annotations

import dataclasses

from ...core.ir import Const
from ...core.piece import Piece
from ...core.symbolic_value import SizeValue


def symbolic_piece(piece: Piece) -> Piece | None:
    """The piece over its graph's symbolic origin (the same UIDs; the origin's nodes, whose size
    attributes, such as a reshape's dims, are expressions; the dynamic dims as expressions), where the
    piece's graph has one; None otherwise. A template's analysis run on it decides over the bucket:
    code that compares a dynamic size with an int raises TypeError, which a template takes as
    "generate this piece at its shape"."""
    origin = piece.graph.origin
    if origin is None:
        return None
    at = piece.graph.node_positions  # (FinalGraph.at keeps the nodes' order)
    nodes = tuple(origin.graph.nodes[at[id(n)]] for n in piece.nodes)
    if any(isinstance(v, Const) and isinstance(v.value, SizeValue) for n in nodes for v in n.inputs):
        return None  # a ratio of sizes (a mean's 1/count) is no run-time scalar yet: generated at the shape
    return dataclasses.replace(piece, nodes=nodes, graph=origin.graph, growth=None)
