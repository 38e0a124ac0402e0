"""Views alone that no strides describe, as copies of the pointwise template: a chain of reshapes,
transposes and slices of a tensor in memory whose result is not one strided view of it (Swin's window
partition and MobileViT's patch unfolding reshape a transposed tensor, merging axes that are not one
run of memory). Each output element is read from the coordinates the chain maps it to: walking the
chain back from the output, a transpose permutes the coordinates, a slice offsets and scales them, and
a reshape turns them into the element's row-major rank and splits that by the input's dims. Sizes are
spelled by `text` (sizes.Sizes.text where a dynamic plan's kernel takes them at run time: the chain's
structure is the same at every shape of a bucket, so one source copies at all of them)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ....core.config import Support
from ....core.ir import Node
from ....core.piece import Piece
from ....core.tensor import TensorDesc, packed_strides
from ....ops.layout import VIEW_KINDS, Reshape, Slice, Transpose
from ...shared.views import own_dims, view_of
from ..sizes import above_one


def view_chains(piece: Piece) -> dict[int, tuple[Node, ...]] | Support:
    """The piece (views alone) as a chain of views from a tensor in memory to each output, by output UID
    (the chain from the source on), where no chain is one strided view of its source; Support.no where it
    is not that. (A strided view is left to the kernel that reads it, in place; the partitioner places a
    view just before its reader, and a copy taken here would take it from that kernel.)"""
    chains = chains_of(piece)
    if chains is None:
        return Support.no("the piece computes values; a view copy moves views of tensors in memory only")
    for u, chain in chains.items():
        if _strided(chain, piece):
            source = piece.tensor(chain[0].input_uids()[0])
            return Support.no(
                f"{piece.tensor(u).label()} is a strided view of {source.label()}: the kernel that "
                "reads it reads it in place (a view alone is copied only where no strides describe it)",
                chain[-1],
            )
    return chains


def chains_of(piece: Piece) -> dict[int, tuple[Node, ...]] | None:
    """The chain of views from a tensor in memory to each output of the piece, by output UID; None
    where the piece holds other nodes than views. (Strided or not: a copy through coordinates is right
    either way, so a dynamic plan's kernel may copy at every shape what is strided at some.)"""
    producer = {n.output_uids()[0]: n for n in piece.nodes if n.kind in VIEW_KINDS}
    if len(producer) != len(piece.nodes):
        return None
    chains: dict[int, tuple[Node, ...]] = {}
    for u in piece.outputs:
        chain, v = [], u
        while v in producer:
            chain.append(producer[v])
            v = producer[v].input_uids()[0]
        chains[u] = tuple(reversed(chain))
    return chains


def _strided(chain: tuple[Node, ...], piece: Piece) -> bool:
    """Whether the chain's result is one strided view of its source."""
    src = chain[0].input_uids()[0]
    desc, offset = piece.tensor(src), 0
    for n in chain:
        v = view_of(n, desc, src, offset, n.output_uids()[0], own_dims(piece, n))
        if isinstance(v, str):
            return False
        desc, offset = v.desc, v.offset
    return True


def _product(terms: list[tuple[str, Any]], text: Callable[[Any], str]) -> str:
    return " + ".join(c if s == 1 else f"{c} * {text(s)}" for c, s in terms) or "0"


def _split(rank: str, dims: tuple[Any, ...], text: Callable[[Any], str]) -> list[str]:
    """The coordinates of row-major rank `rank` (a name) in `dims` (a dynamic dim is never 1: a
    symbol's axis is walked whatever its value)."""
    strides = packed_strides(dims)
    out = []
    for axis, (d, s) in enumerate(zip(dims, strides)):
        if d == 1:
            out.append("0")
            continue
        e = rank if s == 1 else f"({rank} // {text(s)})"
        outermost = all(dims[a] == 1 for a in range(axis))
        out.append(e if outermost else f"({e} % {text(d)})")
    return out


def source_offset(
    chain: tuple[Node, ...],
    coords: list[str],
    tensors: Mapping[int, TensorDesc],
    prefix: str,
    text: Callable[[Any], str] = str,
) -> tuple[list[str], str]:
    """(lines, offset): the element offset, in the chain's source tensor, of the output element at
    `coords` (expressions, one per output axis), through lines naming each reshape's rank
    `{prefix}_{k}`; `text` spells a size (sizes.Sizes.text for a dynamic one)."""
    lines: list[str] = []
    for k, n in enumerate(reversed(chain)):
        src, dst = tensors[n.input_uids()[0]], tensors[n.output_uids()[0]]
        op = n.op
        if isinstance(op, Transpose):
            new = ["0"] * len(src.dim)
            for axis, p in enumerate(op.permutation):
                new[p] = coords[axis]
        elif isinstance(op, Slice):
            bounds = op.bounds(None, src.dim)
            new = [
                c
                if (start, step) == (0, 1)
                else f"({text(start)} + {c} * {step})"
                if step != 1
                else f"({text(start)} + {c})"
                for c, (start, _, step) in zip(coords, bounds)
            ]
        else:
            assert isinstance(op, Reshape)
            rank = f"{prefix}_{k}"
            terms = [(c, s) for c, s, d in zip(coords, packed_strides(dst.dim), dst.dim) if above_one(d)]
            lines.append(f"{rank} = {_product(terms, text)}")
            new = _split(rank, src.dim, text)
        coords = new
    base = tensors[chain[0].input_uids()[0]]
    terms = [(c, s) for c, s, d in zip(coords, base.stride, base.dim) if above_one(d) and s != 0]
    return lines, _product(terms, text)
