"""Embedding lookups in generated pointwise kernels: y[i..., d] = weight[indices[i...], d], an index
outside [0, V) reading zeros (ops/gather.py), computed per element of the iteration space like any
pointwise value: the index loaded at the coordinates i..., the table at that row and column d, the
load masked off where the index is out of range (so no index, whatever it holds, reads outside the
table). The lookup fuses with the pointwise ops around it (GPT-2's token + position embeddings).
"""

from __future__ import annotations

from ....core.config import Support
from ....core.ir import Node
from ....core.piece import Piece
from ....core.tensor import TensorDesc
from ..expr import TL_DTYPE, Emitter, compute_type, from_storage

EMBEDDING = "embedding"
INT32_ROWS = 2**31 - 1  # the largest element offset a row computed in int32 reaches


def check_gathers(piece: Piece, produced: set[int], tensors: dict[int, TensorDesc]) -> Support | None:
    """Why an embedding of the piece cannot be read in its kernel: its table or indices computed in
    the piece (a value is computed at the coordinates of the space, not at those of a row), or passed
    by value; None where every one can."""
    for node in piece.nodes:
        if node.kind != EMBEDDING:
            continue
        for role in ("weight", "indices"):
            u = node.input(role)
            assert isinstance(u, int)
            if u in produced or tensors[u].is_pass_by_value:
                return Support.no(
                    f"{node.label()}'s {role} {tensors[u].label()} is computed in the piece or passed by value; "
                    "the pointwise template gathers rows from tensors in memory only",
                    node,
                )
    return None


def emit_embedding(emitter: Emitter, node: Node) -> None:
    """The lookup's value at the emitter's coordinates (see the module docstring)."""
    w_uid, idx_uid = node.input("weight"), node.input("indices")
    assert isinstance(w_uid, int) and isinstance(idx_uid, int)
    out = node.output_uids()[0]
    w, idx, y = emitter.tensors[w_uid], emitter.tensors[idx_uid], emitter.tensors[out]
    last = len(y.dim) - 1
    # the indices as a tensor of the space: broadcast along the embedding axis
    spread = TensorDesc(idx.uid, "", (*idx.dim, 1), (*idx.stride, 0), idx.data_type)
    wide = w.dim[0] * w.stride[0] + w.dim[1] * w.stride[1] > INT32_ROWS
    row, valid = f"row{out}{emitter.suffix}", f"valid{out}{emitter.suffix}"
    index = emitter.indexer.load(spread, emitter.ptr(idx_uid))
    if "mask=" not in index:  # one index for the block: a block of it (Triton's interpreter has no `&` of
        # a block boolean and a scalar one); the flat walk's `lin` is there (FLAT_ONLY)
        index = f"{index} + tl.zeros_like(lin).to({TL_DTYPE[idx.data_type]})"
    emitter.lines.append(f"{row} = {index}")
    # (in range as loaded, before the row is narrowed: an INT64 index 2**32 + 1 is out of range)
    emitter.lines.append(f"{valid} = ({row} >= 0) & ({row} < {w.dim[0]})")
    emitter.lines.append(f"{row} = {row}.to({'tl.int64' if wide else 'tl.int32'})")
    offset = f"{row} * {w.stride[0]}"
    if w.dim[1] > 1:
        col = emitter.indexer.coord(last, y)
        offset += f" + {col}" if w.stride[1] == 1 else f" + {col} * {w.stride[1]}"
    mask = emitter.indexer.mask()  # type: ignore[attr-defined]
    load = f"tl.load({emitter.ptr(w_uid)} + {offset}, mask={mask} & {valid}, other=0)"
    typ = compute_type([w.data_type, y.data_type]) if emitter.compute == "tl.float64" else emitter.compute
    emitter.assign(out, from_storage(load, w.data_type, typ), typ)
