"""Concatenations in generated pointwise kernels: y = concatenate(x_0, ..., x_n-1, axis) computed per
element of the iteration space as a select over the coordinate c along the axis,

    y = where(c < e_0, x_0 at c, where(c < e_1, x_1 at c - e_0, ...)),   e_k = d_0 + ... + d_k,

each operand evaluated in a frame of its own: its loads (and gen_index coordinates) at the coordinate
shifted by the operand's offset, masked where the operand does not apply (so no load leaves its
tensor). An operand is any pointwise DAG over tensors in memory and their views: the rotary embedding's
rotate_half, cat(-x[..., d/2:], x[..., :d/2]), fuses with the multiply-adds around it. Nodes are emitted
on demand, per frame: from the piece's outputs back to the tensors in memory, a concatenation's
operands in their frames (a node read in two frames is computed in each). In a dynamic plan's kernel
(sizes.py) an operand's size along the axis may be dynamic: the ends e_k and shifts are then run-time
size arguments, spelled by the indexer's `text`.

A slice_backward (the gradient of a slice: dy written into zeros, ViT's class-token pooling x[:, 0]) is
framed the same way: dy computed in a frame shifted to the slice's start along each sliced axis, masked
to the slice, and zero outside it; a strided slice's (Swin's patch merging, x[:, 0::2, 1::2]) frame takes
the coordinate (c - start) // step, masked to the positions the slice read.

The part walk (pointwise.py, knob PARTS): where every concatenation joins along the space's innermost axis and
their operands' bounds, in the space's coordinates, are multiples of a width W (`part_width`), the kernel walks
that axis W elements a part, each part emitted on its own with the coordinate's range known (the indexer's
`span`): a concatenation then takes the one operand the part lies in, no select, its loads unmasked by the
operand's guard. The rotary embedding's cat(-x[..., 32:], x[..., :32]) over D = 64 walks in two parts: each
element of x is read where its own part and its partner's use it, not under two half-masked loads.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import Any

from ....core.config import Support
from ....core.ir import Node
from ....core.piece import Piece
from ....core.tensor import TensorDesc
from ....ops.layout import VIEW_KINDS, slice_length
from ..expr import Emitter
from ..sizes import above_one
from ._gather import EMBEDDING, emit_embedding

CONCAT = "concatenate"
SLICE_BACKWARD = "slice_backward"
FRAMED = frozenset({CONCAT, SLICE_BACKWARD})  # ops whose operands are computed in frames of their own


def producers(piece: Piece) -> dict[int, Node]:
    """The node of the piece writing each tensor, by UID."""
    return {u: n for n in piece.nodes for u in n.output_uids()}


def demanded(piece: Piece, roots: Iterable[int], made: Mapping[int, Node]) -> list[Node]:
    """The piece's non-view nodes that the values `roots` need in their frame, in the piece's order:
    back from the roots to the tensors in memory, not through a concatenation or a slice_backward (their
    operands are computed in frames of their own)."""
    need: set[int] = set()
    stack = list(roots)
    while stack:
        node = made.get(stack.pop())
        if node is None or id(node) in need:
            continue
        need.add(id(node))
        if node.kind not in FRAMED:
            stack.extend(node.input_uids())
    return [n for n in piece.nodes if id(n) in need and n.kind not in VIEW_KINDS]


def _axis(node: Node, rank: int) -> int:
    return node.op.axis % rank  # type: ignore[attr-defined]


def _broadcasts(dims: tuple[Any, ...], frame: tuple[Any, ...]) -> bool:
    return len(dims) == len(frame) and all(a == b or a == 1 for a, b in zip(dims, frame))


def check_frames(piece: Piece, tensors: Mapping[int, TensorDesc], space: tuple[int, ...]) -> Support | None:
    """Why the piece's values do not fit the frames they are computed in (each node's results broadcast
    to its frame's dims; a concatenation's operands to the frame with the axis at their own size, a
    slice_backward's to the slice's), or None where they do."""
    made = producers(piece)

    def walk(roots: Iterable[int], frame: tuple[Any, ...]) -> Support | None:
        for node in demanded(piece, roots, made):
            for u in node.output_uids():
                if not _broadcasts(tensors[u].dim, frame):
                    return Support.no(
                        f"{tensors[u].label()} dims {list(tensors[u].dim)} do not broadcast to the dims "
                        f"{list(frame)} it is computed at",
                        node,
                    )
            if node.kind == SLICE_BACKWARD:
                bounds = node.op.slices  # type: ignore[attr-defined]
                if any(b[2] != 1 and not all(isinstance(v, int) for v in b) for b in bounds):
                    return Support.no("a slice_backward of a strided slice with dynamic bounds", node)
                why = walk(node.input_uids(), tuple(slice_length(b) for b in bounds))
                if why is not None:
                    return why
                continue
            if node.kind != CONCAT or len(node.input_uids()) == 1:
                continue
            out = tensors[node.output_uids()[0]]
            axis = _axis(node, len(out.dim))
            for u in node.input_uids():
                d = tensors[u].dim[axis]
                why = walk([u], (*frame[:axis], d, *frame[axis + 1 :]))
                if why is not None:
                    return why
        return None

    return walk(piece.outputs, space)


def part_width(piece: Piece, tensors: Mapping[int, TensorDesc], space: tuple[Any, ...], axis: int) -> int | None:
    """The widest W dividing the space's `axis` into parts that each lie in one operand of every concatenation
    (in every frame: a concatenation inside another's operand counts at its frame's offset), where every
    concatenation joins along `axis` and the piece has no slice_backward; None where W would be the axis
    itself (no concatenation splits it), a size is not static, or a concatenation joins another axis."""
    size = space[axis]
    if not isinstance(size, int):
        return None
    made = producers(piece)
    bounds: set[int] = {size}

    def walk(roots: Iterable[int], shift: int) -> bool:
        for node in demanded(piece, roots, made):
            if node.kind == SLICE_BACKWARD:
                return False
            if node.kind != CONCAT:
                continue
            if len(node.input_uids()) == 1:  # (a copy: its operand emitted in this frame, _emit_concat)
                if not walk(node.input_uids(), shift):
                    return False
                continue
            if _axis(node, len(tensors[node.output_uids()[0]].dim)) != axis:
                return False
            at = 0
            for u in node.input_uids():
                d = tensors[u].dim[axis]
                if not isinstance(d, int):
                    return False
                bounds.add(shift + at)
                if not walk([u], shift + at):
                    return False
                at += d
        return True

    if not walk(piece.outputs, 0):
        return None
    width = math.gcd(*bounds)
    return width if width < size else None


class ShiftedIndexer:
    """An indexer's frame moved by `shift` along `axis` (a concatenation's operand), loads masked by
    `guard` (where the operand applies) besides the base's own mask. With `step` > 1 (a slice_backward of a
    strided slice, Swin's x[:, 0::2]) the frame's coordinate along `axis` is (c - shift) // step of the
    base's c, where `guard` holds only the positions the slice read."""

    def __init__(self, base: Any, axis: int, shift: Any, guard: str, step: int = 1) -> None:
        self.base, self.axis, self.shift, self.guard, self.step = base, axis, shift, guard, step
        self.text = getattr(base, "text", str)  # spells a size (a dynamic one: its run-time argument, sizes.py)

    def offset(self, desc: TensorDesc) -> str:
        if self.step != 1 and above_one(desc.dim[self.axis]):
            # the base's offset without the axis, then the axis's term at the frame's coordinate
            flat = dataclasses.replace(
                desc, stride=tuple(0 if a == self.axis else s for a, s in enumerate(desc.stride))
            )
            offset = self.base.offset(flat)
            term = f"{self.coord(self.axis, desc)} * {self.text(desc.stride[self.axis])}"
            return term if offset == "0" else f"{offset} + {term}"
        offset = self.base.offset(desc)
        moved = self.shift * desc.stride[self.axis] if above_one(desc.dim[self.axis]) else 0
        return f"{offset} - {self.text(moved)}" if moved != 0 else offset

    def mask(self) -> str:
        base = self.base.mask()
        return f"{base} & {self.guard}" if self.guard else base

    def load(self, desc: TensorDesc, ptr: str) -> str:
        if _shares_loads(self):  # (a part of the part walk: its loads are shared, at the address less the shift)
            return self.load_shifted(desc, ptr, 0)
        offset = "0" if desc.numel == 1 else self.offset(desc)
        if offset == "0":  # one element, or broadcast along every axis: in range everywhere
            return f"tl.load({ptr})"
        return f"tl.load({ptr} + {offset}, mask={self.mask()}, other=0)"

    def load_shifted(self, desc: TensorDesc, ptr: str, shift: int) -> str:
        assert self.step == 1, "a strided frame has a guard: its loads are not shared"
        return str(self.base.load_shifted(desc, ptr, shift + self.shift))

    def store(self, desc: TensorDesc, ptr: str, value: str) -> str:
        raise NotImplementedError("a concatenation's operand is computed, never stored")

    def coord(self, axis: int, desc: TensorDesc) -> str:
        coord = self.base.coord(axis, desc)
        if axis != self.axis or not above_one(desc.dim[axis]):
            return coord
        shifted = f"({coord} - {self.text(self.shift)})" if self.shift != 0 else coord
        return f"({shifted} // {self.step})" if self.step != 1 else shifted

    def span(self, axis: int) -> tuple[int, int] | None:
        """The coordinate's range along `axis` in this frame, where the part walk knows it."""
        span = span_of(self.base, axis)
        if span is None or axis != self.axis:
            return span
        if self.step != 1:
            return None
        return span[0] - self.shift, span[1] - self.shift


def _shares_loads(indexer: Any) -> bool:
    """Whether `indexer` is a part of the part walk (pointwise.PartIndexer) in frames without guards."""
    if isinstance(indexer, ShiftedIndexer):
        return not indexer.guard and _shares_loads(indexer.base)
    return hasattr(indexer, "load_shifted")


def span_of(indexer: Any, axis: int) -> tuple[int, int] | None:
    """[lo, hi): the range of `indexer`'s coordinate along `axis` known when the code is generated (a part of
    the part walk), or None."""
    span = getattr(indexer, "span", None)
    return span(axis) if span is not None else None


def emit_frame(piece: Piece, emitter: Emitter, roots: Iterable[int], made: Mapping[int, Node] | None = None) -> None:
    """Emit the nodes that `roots` need in `emitter`'s frame (concatenations and slice_backwards with
    their operands in frames of their own)."""
    made = producers(piece) if made is None else made
    for node in demanded(piece, roots, made):
        if node.kind == CONCAT:
            _emit_concat(piece, emitter, node, made)
        elif node.kind == SLICE_BACKWARD:
            _emit_slice_backward(piece, emitter, node, made)
        else:
            emit_node(emitter, node)


def emit_node(emitter: Emitter, node: Node) -> None:
    """One node other than a concatenation: a lookup (_gather.py) or a pointwise op."""
    if node.kind == EMBEDDING:
        emit_embedding(emitter, node)
    else:
        emitter.emit(node)


def _subframe(emitter: Emitter, indexer: Any, suffix: str) -> Emitter:
    return Emitter(
        emitter.tensors,
        emitter.compute,
        indexer,
        ptr=emitter.ptr,
        scalar=emitter.scalar,
        suffix=f"{emitter.suffix}_{suffix}",
    )


def _emit_slice_backward(piece: Piece, emitter: Emitter, node: Node, made: Mapping[int, Node]) -> None:
    """dx = dy where the coordinate lies in the slice (dy read at the coordinate less the slice's start),
    else 0."""
    out = node.output_uids()[0]
    desc = emitter.tensors[out]
    text = getattr(emitter.indexer, "text", str)
    indexer, guards = emitter.indexer, []
    for axis, (start, stop, step) in enumerate(node.op.slices):  # type: ignore[attr-defined]
        if start == 0 and stop == desc.dim[axis] and step == 1:
            continue
        c = emitter.indexer.coord(axis, desc)
        checks = [f"({c} >= {text(start)})"] if start != 0 else []
        checks += [f"({c} < {text(stop)})"] if stop != desc.dim[axis] else []
        if step != 1:  # (the positions the strided slice read)
            checks.append(f"((({c} - {start}) % {step}) == 0)" if start else f"(({c} % {step}) == 0)")
        guard = " & ".join(checks)
        guards.append(guard)
        indexer = ShiftedIndexer(indexer, axis, start, guard, step)
    (dy,) = node.input_uids()
    sub = _subframe(emitter, indexer, str(out))
    emit_frame(piece, sub, [dy], made)
    value = sub.operand(dy)  # (a tensor in memory: its load is emitted here)
    emitter.lines.extend(sub.lines)
    emitter.assign(out, f"tl.where({' & '.join(guards)}, {value}, 0)" if guards else value)


def _emit_concat(piece: Piece, emitter: Emitter, node: Node, made: Mapping[int, Node]) -> None:
    out = node.output_uids()[0]
    ins = node.input_uids()
    if len(ins) == 1:  # (a copy: the value itself, in this frame)
        emit_frame(piece, emitter, ins, made)
        emitter.assign(out, emitter.operand(ins[0]))
        return
    desc = emitter.tensors[out]
    axis = _axis(node, len(desc.dim))
    span = span_of(emitter.indexer, axis)
    if span is not None:  # (a part of the part walk: the one operand the part lies in, part_width)
        start = 0
        for k, u in enumerate(ins):
            d = emitter.tensors[u].dim[axis]
            if start <= span[0] and span[1] <= start + d:
                sub = _subframe(emitter, ShiftedIndexer(emitter.indexer, axis, start, ""), f"{out}_{k}")
                emit_frame(piece, sub, [u], made)
                value = sub.operand(u)  # (a tensor in memory: its load is emitted here)
                emitter.lines.extend(sub.lines)
                emitter.assign(out, value)
                return
            start += d
        raise AssertionError(f"part {span} of {node.label()} lies across its operands (part_width)")
    c = emitter.indexer.coord(axis, desc)
    text = getattr(emitter.indexer, "text", str)  # (a dynamic end: its run-time argument, sizes.py)
    values: list[str] = []
    ends: list[Any] = []
    at: Any = 0
    for k, u in enumerate(ins):
        d = emitter.tensors[u].dim[axis]
        guard = " & ".join(
            [
                *([f"({c} >= {text(at)})"] if at != 0 else []),
                *([f"({c} < {text(at + d)})"] if k < len(ins) - 1 else []),
            ]
        )
        sub = _subframe(emitter, ShiftedIndexer(emitter.indexer, axis, at, guard), f"{out}_{k}")
        emit_frame(piece, sub, [u], made)
        values.append(sub.operand(u))
        emitter.lines.extend(sub.lines)
        at += d
        ends.append(at)
    expr = values[-1]
    for value, end in zip(reversed(values[:-1]), reversed(ends[:-1])):
        expr = f"tl.where({c} < {text(end)}, {value}, {expr})"
    emitter.assign(out, expr)
