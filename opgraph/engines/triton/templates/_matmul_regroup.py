"""A 2-D matmul whose epilogue goes through reshapes that only regroup its rows: AOTAutograd's Linear over
[N, H, W, C] activations is `view -> mm -> view`, so the bias, the GELU and a residual add meet the GEMM's
[M, N] result reshaped to [N, H, W, C'] (and back). Each such reshape is the same memory in the same order;
`regroup_rows` gives the piece with every epilogue tensor of the wider rank merged into [M, N] rows (same
UIDs, same memory: `_matmul_fold.merged_rows`) and the reshapes as pointwise identities, so that the
template fuses them as from_torch's batched matmul is fused. Pieces whose tensors do not nest so (a
per-sample scale, a transposed layout), or with an op whose attributes name axes of the wider tensors
(genstats, an index along an axis, a view of a wider tensor), stay as they are."""

from __future__ import annotations

import math

from ....core.ir import Node
from ....core.piece import Piece
from ....core.tensor import TensorDesc
from ....ops.layout import VIEW_KINDS
from ....ops.pointwise import Pointwise, PointwiseMode
from ._matmul_fold import merged_rows, overlaid

__all__ = ["regroup_rows"]


def regroup_rows(piece: Piece) -> Piece | None:
    """The piece with its epilogue's row-regrouping reshapes made identities and the wider tensors merged
    into the matmul's [M, N] (module docstring), or None where it has none or a tensor does not merge."""
    mains = [n for n in piece.nodes if n.kind == "matmul"]
    if len(mains) != 1:
        return None
    main = mains[0]
    c = piece.tensor(main.output_uids()[0])
    if len(c.dim) != 2 or not all(isinstance(d, int) for d in c.dim):
        return None
    rows, cols = c.dim
    path = {main.output_uids()[0]}
    regroups: list[Node] = []
    after = piece.nodes[piece.nodes.index(main) + 1 :]
    for node in after:
        ins = node.input_uids()
        if node.kind == "reshape" and ins and ins[0] in path:
            out = piece.tensor(node.output_uids()[0])
            if out.dim[-1] != cols or math.prod(out.dim[:-1]) != rows:
                return None
            regroups.append(node)
        elif not _keeps_meaning(node, piece):
            return None
        elif node.kind != "pointwise" or not set(ins) & path:
            continue
        path.update(node.output_uids())
    if not regroups:
        return None
    new: dict[int, TensorDesc] = {}
    for u in {u for n in after for u in (*n.input_uids(), *n.output_uids())}:
        t = piece.tensor(u)
        if len(t.dim) <= 2 or t.numel == 1:  # (a view's source of lower rank stays as it is)
            continue
        merged = merged_rows(t, 0, len(t.dim) - 1, rows)
        if merged is None:
            return None
        new[u] = merged
    identity = Pointwise(mode=PointwiseMode.IDENTITY)
    replaced = {id(n): Node(identity, n.name, n.inputs, n.outputs, n.compute_data_type) for n in regroups}
    return overlaid(piece, new, replaced)


def _keeps_meaning(node: Node, piece: Piece) -> bool:
    """Whether `node` means the same over merged rows: pointwise ops naming no axis and reductions (which
    name theirs by their output's dims of 1); a view only where none of its tensors is merged (its
    attributes name axes); nothing else (genstats sums per channel, axis 1)."""
    if node.kind == "pointwise":
        return getattr(node.op, "axis", None) is None
    if node.kind == "reduction":
        return True
    if node.kind in VIEW_KINDS:
        return all(len(piece.tensor(u).dim) <= 2 for u in (*node.input_uids(), *node.output_uids()))
    return False
