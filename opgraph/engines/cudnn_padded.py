"""Bucket attention through one cuDNN plan (docs/design/dynamic-shapes.md, "Bucket attention").

A cuDNN SDPA plan is made for one shape, and cuDNN 9.19's SDPA engines take no execute-time shape
override. The padded form serves every shape of a dynamic plan's bucket with one plan: it is built at
the bucket's largest shape with cuDNN's padding mask (per-batch `seq_len_q` / `seq_len_kv`) and ragged
offsets on Q, K, V and O (each batch's first element, which makes the batch stride a run-time value).
At a shape (batch b, lengths s_q and s_kv) the first b batches get those lengths and the offsets of
the shape's layout, the batches past b length 0 (cuDNN reads and writes nothing of them). Those
values lie in a small int32 device buffer each shape's kernel owns (`lengths`), written when the
shape's plan is made; nothing is built, planned or compiled per shape.

It holds where the in-batch layout is the same at every shape: heads and head dims fixed, the strides
of heads, rows and head dims fixed (the heads of a projection's [batch, seq, heads * dim] output read in
place, as imported transformers give them), only batch and sequence lengths varying; a forward without
Stats, a user padding mask, bias, dropout, ALiBi, a sliding window or a bottom-right diagonal, one op
alone with its views, q, k and v tensors of their own. The layout is checked at the bucket's smallest
and largest shapes and the piece's own, and again at each shape a kernel is made for.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.ir import FinalGraph, Node
from ..core.piece import Piece
from ..ops.attention import _Attention, extensions
from .cudnn_sdpa import MOVES, attention_views, operand_slots
from .shared.views import View

ROLES = ("q", "k", "v", "o")
# the padded form's own tensors, in the order the cuDNN graph numbers them after the piece's operands
EXTRAS = ("seq_len_q", "seq_len_kv", "ragged_q", "ragged_k", "ragged_v", "ragged_o")
# the launch's stand-in UIDs for them (never a graph's: UIDs are non-negative)
EXTRA_UIDS = {name: -1 - i for i, name in enumerate(EXTRAS)}
_INT32_MAX = (1 << 31) - 1
_ALIGN = 4  # int32s: each section of the lengths buffer starts 16 bytes in


@dataclass(frozen=True)
class Layout:
    """An operand's memory at one shape: dims and strides (as cuDNN declares it) and the element
    where it starts in its buffer."""

    dim: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int

    def fits(self, largest: Layout) -> bool:
        """Whether this layout is `largest`'s within a batch: the same heads and head dims, the same
        strides of heads, rows and head dims (a stride along an axis of one element is never stepped)."""
        return all(
            (i == 2 or self.dim[i] == largest.dim[i]) and (self.dim[i] == 1 or self.stride[i] == largest.stride[i])
            for i in (1, 2, 3)
        )


@dataclass(frozen=True)
class PaddedForm:
    """What the bucket's plan is built at: the piece at the bucket's largest shape, its batch count, its
    operands' layouts there (role order q, k, v, o), and what the plan binds (the count of its operand
    slots and which of them are views: the same at every shape the plan runs)."""

    largest: Piece
    batch: int
    layouts: tuple[Layout, ...]
    slots: int
    viewed: frozenset[int]


def attention_node(piece: Piece) -> Node | None:
    found = [n for n in piece.nodes if n.kind in ("sdpa", "sdpa_backward")]
    return found[0] if len(found) == 1 else None


def role_uids(node: Node) -> tuple[int, ...]:
    q, k, v = (node.input(r) for r in ("q", "k", "v"))
    return (q, k, v, node.output("o"))  # type: ignore[return-value]


def layouts(piece: Piece, node: Node, views: dict[int, View]) -> tuple[Layout, ...]:
    """The q, k, v and o layouts at the piece's shape (through their views where read or written so)."""
    found = []
    for uid in role_uids(node):
        if uid in views:
            v = views[uid]
            found.append(Layout(tuple(v.desc.dim), tuple(v.desc.stride), v.offset))
        else:
            t = piece.tensor(uid)
            found.append(Layout(tuple(t.dim), tuple(t.stride), 0))
    return tuple(found)


def padded_problem(piece: Piece, node: Node) -> str | None:
    """Why the padded form does not run this attention node (None: it may, layouts permitting)."""
    op = node.op_as(_Attention)
    if node.kind != "sdpa":
        return "the padded form runs forward attention only"
    other = next((n for n in piece.nodes if n is not node and n.kind not in MOVES), None)
    if other is not None:
        return f"the padded form runs one attention op and the views it reads, not {other.label()}"
    if len({node.input(r) for r in ("q", "k", "v")}) < 3:
        return "the padded form needs q, k and v to be tensors of their own (each has its ragged offsets)"
    if node.output("stats") is not None:
        return "the padded form writes no Stats (a training forward runs the generated kernel in a bucket)"
    if op.use_padding_mask or op.use_alibi_mask or op.use_causal_mask_bottom_right:
        return "the padded form takes no padding mask of the op's own, ALiBi or bottom-right diagonal"
    if op.sliding_window_length is not None:
        return "the padded form takes no sliding window"
    if extensions(node) or op.score_mod is not None or op.dropout_probability is not None:
        return "the padded form takes no packed or paged operands, sinks, score modifier or dropout"
    for role in ("bias", "dropout_mask", "seq_len_q", "seq_len_kv"):
        if role in op.input_roles() and node.input(role) is not None:
            return f"the padded form takes no {role}"
    return None


def form_of(
    largest: Piece, node: Node, views: dict[int, View], others: list[tuple[Piece, dict[int, View]]]
) -> PaddedForm | str:
    """The padded form given the piece at the bucket's largest shape (`views`: its attention operands'
    views) and the same piece at other shapes of the bucket, or why the layouts do not allow it."""
    there = layouts(largest, node, views)
    for piece, seen in others:
        for role, a, b in zip(ROLES, layouts(piece, node, seen), there):
            if len(a.dim) != 4 or len(b.dim) != 4:
                return f"the padded form needs 4-d operands ('{role}' has {len(a.dim)} dims)"
            if not a.fits(b):
                return (
                    f"'{role}' changes its layout within the bucket (dims {list(a.dim)} strides {list(a.stride)} "
                    f"at one shape, {list(b.dim)} / {list(b.stride)} at its largest): the padded form needs fixed "
                    "heads and in-batch strides"
                )
    batch = there[0].dim[0]
    for role, b in zip(ROLES, there):
        if b.dim[0] != batch:
            return f"'{role}' has {b.dim[0]} batches where q has {batch}"
        if b.offset + batch * b.stride[0] > _INT32_MAX:
            return f"'{role}' spans more than 2**31 elements at the bucket's largest shape (int32 ragged offsets)"
    keys, _ = operand_slots(largest)
    return PaddedForm(largest, batch, there, len(keys), frozenset(views))


def padded_form(piece: Piece) -> PaddedForm | str | None:
    """The padded form of an attention piece planned for a dynamic plan's bucket whose shapes change
    its operands; why not, where they change but the form does not hold; None for any other piece.
    Memoized in the piece's graph."""
    origin = piece.graph.origin
    node = attention_node(piece)
    if origin is None or node is None or not origin.varies((*node.input_uids(), *node.output_uids())):
        return None
    key = ("cudnn-padded", tuple(id(n) for n in piece.nodes), piece.inputs, piece.outputs)
    memo = piece.graph.memo
    if key not in memo:
        memo[key] = _form(piece, node, origin.at_largest(), origin.at_smallest())
    return memo[key]


def _form(piece: Piece, node: Node, largest_graph: FinalGraph, smallest_graph: FinalGraph) -> PaddedForm | str:
    """The form checked at the piece's own shape and at the bucket's smallest, against its largest (the
    in-batch layout must be the same at all three: an expression of a varying dim is not)."""
    why = padded_problem(piece, node)
    if why is not None:
        return why
    at = piece.graph.node_positions

    def moved(graph: FinalGraph) -> Piece:
        return Piece(
            piece.index, tuple(graph.nodes[at[id(n)]] for n in piece.nodes), piece.inputs, piece.outputs, graph
        )

    largest, smallest = moved(largest_graph), moved(smallest_graph)
    found = [(p, attention_views(p)) for p in (largest, piece, smallest)]
    for _, views in found:
        if isinstance(views, str):
            return views
    (top, top_views), *others = ((p, v or {}) for p, v in found)
    return form_of(top, node, top_views, others)  # type: ignore[arg-type]


def _aligned(count: int) -> int:
    return -(-count // _ALIGN) * _ALIGN


def sections(batch: int) -> dict[str, tuple[int, int]]:
    """Where each extra lies in the lengths buffer: (first int32, count)."""
    out, at = {}, 0
    for name in EXTRAS:
        count = batch if name.startswith("seq_len") else batch + 1
        out[name] = (at, count)
        at += _aligned(count)
    return out


def lengths(form: PaddedForm, piece: Piece, views: dict[int, View]) -> list[int] | str:
    """The int32 values of the lengths buffer at the shape of `piece` (the bucket's piece there, its
    attention operands' views `views`), or why the bucket's plan cannot run that shape."""
    node = attention_node(piece)
    if node is None:
        return "no attention node"
    here = layouts(piece, node, views)
    for role, uid, a, fixed in zip(ROLES, role_uids(node), here, form.layouts):
        if not a.fits(fixed):
            return f"'{role}' has another in-batch layout at this shape ({list(a.dim)} / {list(a.stride)})"
        if a.dim[2] > fixed.dim[2]:
            return f"'{role}' has {a.dim[2]} rows, more than the bucket's plan ({fixed.dim[2]})"
        itemsize = piece.tensor(views[uid].base if uid in views else uid).data_type.itemsize
        if (a.stride[0] * itemsize) % 16 and a.dim[0] > 1:
            return f"'{role}''s batch stride {a.stride[0]} is not 16-byte aligned"
    b = here[0].dim[0]
    if b > form.batch or here[3].dim[0] != b:
        return f"batch {b} is outside the bucket's plan ({form.batch} batches)"
    spans = sections(form.batch)
    last_start, last_count = spans[EXTRAS[-1]]
    values = [0] * (last_start + _aligned(last_count))
    per_role = dict(zip(ROLES, here))
    for name, (start, count) in spans.items():
        if name == "seq_len_q":
            got = [here[0].dim[2]] * b + [0] * (count - b)
        elif name == "seq_len_kv":
            got = [here[1].dim[2]] * b + [0] * (count - b)
        else:
            step = per_role[name.removeprefix("ragged_")].stride[0]
            got = [min(i, b) * step for i in range(count)]
        values[start : start + count] = got
    if max(values) > _INT32_MAX:
        return "a ragged offset at this shape passes 2**31 elements (int32 offsets)"
    return values


__all__ = [
    "EXTRAS",
    "EXTRA_UIDS",
    "Layout",
    "PaddedForm",
    "form_of",
    "lengths",
    "padded_form",
    "padded_problem",
    "sections",
]
