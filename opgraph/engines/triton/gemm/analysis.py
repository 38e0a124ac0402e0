"""Recognising a GEMM-class piece: the main op, operand prologues and memory views, the epilogue, the final reductions."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ....core.config import Support
from ....core.errors import expect
from ....core.ir import Node
from ....core.piece import Piece
from ....core.tensor import TensorDesc
from ....ops.reduction import GenStats, Reduction, ReductionMode, reduced_axes
from ...shared.views import View, own_dims, view_of
from ..expr import elementwise
from ..sizes import above_one
from .constants import REDUCE_KINDS, VIEW_KINDS
from .space import OutputSpace


@dataclass(frozen=True)
class Reduce:
    """A reduction at the end of the epilogue. `along` is "rows" when it sums the tile's rows (one
    result per column: genstats of a conv), "cols" (one result per row: a row reduction) or "all" (one
    result per batch entry, or one: an fp8 GEMM's amax); `batch_reduced` says whether the per-program
    axes are reduced too."""

    node: Node
    source: int
    along: str
    batch_reduced: bool
    count: int  # elements reduced into each result (AVG)


@dataclass(frozen=True)
class GemmPiece:
    piece: Piece
    main: Node
    space: OutputSpace
    prologue: Mapping[int, tuple[Node, ...]]  # operand uid -> the nodes computing it, in order
    views: Mapping[int, View]
    epilogue: tuple[Node, ...]
    reductions: tuple[Reduce, ...]
    stores: tuple[int, ...]  # uids the epilogue writes to memory (the main output included if needed)
    # products of the same A by other B operands of B's shape (SwiGLU's gate and up projections), each
    # tile of them computed beside main's from the same A tiles: their outputs are epilogue values
    siblings: tuple[Node, ...] = ()

    @property
    def out(self) -> int:
        uid = self.main.output_uids()[0]
        return uid

    @property
    def mains(self) -> tuple[Node, ...]:
        """The main op and its siblings."""
        return (self.main, *self.siblings)

    @property
    def swapped_heads(self) -> int | None:
        """The head dims whose halves the epilogue swaps in registers (half_swap), or None: then every
        (sub)tile of the epilogue must hold whole heads."""
        if not any(n.kind in ("slice", "concatenate") for n in self.epilogue):
            return None
        return self.space.dims[self.space.cols[-1]]

    def tensor(self, uid: int) -> TensorDesc:
        view = self.views.get(uid)
        return view.desc if view is not None else self.piece.tensor(uid)

    def operand(self, role: str) -> TensorDesc:
        uid = self.main.input(role)
        assert isinstance(uid, int)
        return self.tensor(uid)

    def moved_bytes(self) -> int:
        """Bytes the piece reads and writes at least once (its inputs and outputs; a tensor it updates in
        place, an optimizer's moments and parameters, both read and written)."""
        p = self.piece
        updated = {u for n in p.nodes for u in set(n.input_uids()) & set(n.output_uids())}
        return sum(
            p.tensor(u).nbytes * (2 if u in updated else 1)
            for u in (*p.inputs, *p.outputs)
            if not p.tensor(u).is_pass_by_value
        )


def _broadcasts_to(dim: tuple[int, ...], space: tuple[int, ...]) -> bool:
    if math.prod(dim) == 1:
        return True
    return len(dim) == len(space) and all(a == b or a == 1 for a, b in zip(dim, space))


def _sibling_verdict(main: Node, other: Node, piece: Piece) -> str | None:
    """Why `other` cannot be computed beside `main` in one kernel (None: it can): the same A tensor, a B
    of the same shape and type, the same output shape and the same attributes."""
    if other.input("A") != main.input("A"):
        return f"{other.label()} multiplies another A than {main.label()}; one kernel computes products of one A"
    b, b2 = piece.tensor(main.input("B")), piece.tensor(other.input("B"))  # type: ignore[arg-type]
    if b.dim != b2.dim or b.data_type is not b2.data_type:
        return f"{other.label()}'s B is {list(b2.dim)} {b2.data_type.name}, {main.label()}'s {list(b.dim)} {b.data_type.name}"
    out, out2 = piece.tensor(main.output_uids()[0]), piece.tensor(other.output_uids()[0])
    if out.dim != out2.dim or main.op != other.op or main.compute_data_type is not other.compute_data_type:
        return f"{other.label()} and {main.label()} differ in their outputs or attributes"
    return None


def analyze(
    piece: Piece,
    main_kinds: Sequence[str],
    space_of: Callable[[Node], OutputSpace],
    main_label: str,
    siblings: bool = False,
) -> tuple[GemmPiece | None, Support]:
    """Split `piece` into prologue / main op / epilogue / reductions, or say why it is not one
    GEMM-class kernel. With `siblings`, later main ops that multiply the main op's A by a B of its shape
    are computed beside it (GemmPiece.siblings); their B operands are read from memory, through views."""
    mains = [n for n in piece.nodes if n.kind in main_kinds]
    if not mains:
        return None, Support.no(f"the piece has no {main_label}")
    if len(mains) > 1 and not siblings:
        return None, Support.no(f"one {main_label} per kernel; this piece has {len(mains)}", mains[1])
    main = mains[0]
    for other in mains[1:]:
        why = _sibling_verdict(main, other, piece)
        if why is not None:
            return None, Support.no(why, other)
    at = piece.nodes.index(main)
    sibling_ids = {id(n) for n in mains[1:]}
    before = piece.nodes[:at]
    producer = {u: n for n in piece.nodes for u in n.output_uids()}
    outputs = set(piece.outputs)
    graph = piece.graph
    members = {id(n) for n in piece.nodes}

    # -- prologue: what each operand is computed from --
    views: dict[int, View] = {}
    prologue: dict[int, tuple[Node, ...]] = {}
    used: set[int] = set()
    late: set[int] = set()  # the view nodes reading a sibling's B, wherever they are in the piece
    for other in mains[1:]:
        b_uid = other.input("B")
        assert isinstance(b_uid, int)
        step = producer.get(b_uid)
        b_views = []
        while step is not None:
            if step.kind not in VIEW_KINDS:
                return None, Support.no(
                    f"{step.label()} computes the B of {other.label()}; a product beside another reads its B "
                    "from memory (through views)",
                    step,
                )
            b_views.append(step)
            step = producer.get(step.input_uids()[0])
        for n in sorted(b_views, key=lambda n: piece.nodes.index(n)):
            view = _in_place(n, piece, views, "prologue")
            if isinstance(view, str):
                return None, Support.no(view, n)
            views[n.output_uids()[0]] = view
            late.add(id(n))
    after = [n for n in piece.nodes[at + 1 :] if id(n) not in late]
    for role in main.op.input_roles():
        operand = main.input(role)
        if not isinstance(operand, int):
            continue
        operand_dims = piece.tensor(operand).dim
        chain: list[Node] = []
        stack = [operand]
        while stack:
            u = stack.pop()
            node = producer.get(u)
            if node is None or node is main or id(node) in {id(c) for c in chain}:
                continue
            if node not in before:
                return None, Support.no(f"{node.label()} feeds the {main.kind} but comes after it", node)
            if node.kind in VIEW_KINDS:
                src = node.input_uids()[0]
                src_node = producer.get(src)
                if src_node is not None and src_node.kind not in VIEW_KINDS:
                    return None, Support.no(
                        f"{node.label()} takes a computed value; only tensors in memory are read through "
                        "a slice/transpose in a GEMM prologue",
                        node,
                    )
                chain.append(node)
                stack.append(src)
                continue
            if not elementwise(node):
                return None, Support.no(
                    f"{node.label()} cannot run in the prologue of a {main.kind} "
                    "(only pointwise ops and slice/transpose views can)",
                    node,
                )
            dim = piece.tensor(expect(node.outputs[0], f"the output of {node.label()}")).dim
            if not _broadcasts_to(dim, operand_dims):
                return None, Support.no(
                    f"{node.label()} computes dims {list(dim)}, which do not broadcast "
                    f"to the {main.kind} operand's {list(operand_dims)}",
                    node,
                )
            chain.append(node)
            stack.extend(node.input_uids())
        order = sorted(chain, key=lambda n: piece.nodes.index(n))
        prologue[operand] = tuple(n for n in order if n.kind not in VIEW_KINDS)
        for n in order:
            used.add(id(n))
            if n.kind in VIEW_KINDS:
                view = _in_place(n, piece, views, "prologue")
                if isinstance(view, str):
                    return None, Support.no(view, n)
                views[n.output_uids()[0]] = view
    for node in before:
        if id(node) in late:
            continue
        if id(node) not in used:
            return None, Support.no(
                f"{node.label()} comes before the {main.kind} but does not compute its operands", node
            )
        for u in node.output_uids():
            if u in outputs:
                return None, Support.no(
                    f"{node.label()} is in the {main.kind}'s prologue but its result is needed outside "
                    "the kernel; prologue values are recomputed per tile and never stored",
                    node,
                )
            for c in graph.consumers(u):
                if id(c) in members and c is not main and id(c) not in sibling_ids and c not in before:
                    return None, Support.no(f"{c.label()} reads a prologue value of the {main.kind}", c)

    # -- epilogue and reductions --
    space = space_of(main)
    epilogue_uids = {main.output_uids()[0]}
    epilogue: list[Node] = []
    reductions: list[Reduce] = []
    stores = [main.output_uids()[0]] if main.output_uids()[0] in outputs else []
    position = {id(n): i for i, n in enumerate(piece.nodes)}
    halves: set[int] = set()  # values of one half of a split product's head dims (half_swap)
    for node in after:
        if halves.intersection(node.input_uids()) or (node.kind in ("slice", "concatenate") and space.cols):
            why = half_swap(node, piece, space, epilogue_uids, halves, outputs)
            if why is not None:
                return None, Support.no(why, node)
            epilogue.append(node)
            epilogue_uids.update(node.output_uids())
            stores += [u for u in node.output_uids() if u in outputs]
            continue
        if id(node) in sibling_ids:
            product = node.output_uids()[0]
            epilogue_uids.add(product)
            if product in outputs:
                stores.append(product)
            continue
        if node.kind in VIEW_KINDS and node.input_uids()[0] not in epilogue_uids:
            # a view of memory an epilogue op reads (a bias reshaped to the output's rank): read in place
            found = _memory_view(node, piece, views, producer, outputs)
            if isinstance(found, str):
                return None, Support.no(found, node)
            views[node.output_uids()[0]] = found
            continue
        for u in node.input_uids():
            p = producer.get(u)
            # a value written in place by this op or a later one is read as it is in memory
            if p is not None and u not in epilogue_uids and u not in views and position[id(p)] < position[id(node)]:
                return None, Support.no(
                    f"{node.label()} reads a value that is not on the {main.kind}'s epilogue path", node
                )
        if elementwise(node):
            out = node.outputs[0]
            assert out is not None
            dim = piece.tensor(out).dim
            if not _broadcasts_to(dim, space.dims):
                return None, Support.no(
                    f"{node.label()} computes dims {list(dim)}, which do not broadcast to "
                    f"the {main.kind} output's {list(space.dims)}",
                    node,
                )
            if out in outputs:
                if dim != space.dims:
                    return None, Support.no(
                        f"{node.label()} stores dims {list(dim)}; the epilogue stores "
                        f"only results of the output's dims {list(space.dims)}",
                        node,
                    )
                stores.append(out)
            epilogue.append(node)
            epilogue_uids.add(out)
            continue
        if node.kind in REDUCE_KINDS:
            if node.input_uids()[0] not in epilogue_uids:
                return None, Support.no(f"{node.label()} does not reduce a value of the {main.kind}'s epilogue", node)
            red = _reduction(node, piece, space)
            if isinstance(red, str):
                return None, Support.no(red, node)
            for u in node.output_uids():
                if any(id(c) in members for c in graph.consumers(u)):
                    return None, Support.no(
                        f"an op of the piece reads the result of {node.label()}, which "
                        "is complete only after the kernel",
                        node,
                    )
            reductions.append(red)
            continue
        return None, Support.no(
            f"{node.label()} cannot follow a {main.kind} in one kernel (the epilogue "
            "runs pointwise ops, then genstats or a reduction)",
            node,
        )
    gp = GemmPiece(
        piece, main, space, prologue, views, tuple(epilogue), tuple(reductions), tuple(stores), tuple(mains[1:])
    )
    return gp, Support.yes()


def half_swap(
    node: Node, piece: Piece, space: OutputSpace, values: set[int], halves: set[int], outputs: set[int]
) -> str | None:
    """Why `node` is not a step of a swap of the halves of a split product's head dims (the rotary
    embedding's rotate_half, `cat(-x[..., D/2:], x[..., :D/2])`), which the epilogue makes in registers;
    None where it is: a slice of an epilogue value to one half of the innermost column axis, pointwise ops
    on such halves alone, the concatenation of two of them along that axis. Adds a half's UID to `halves`."""
    axis = space.cols[-1] if space.cols else -1
    head = space.dims[axis]
    ins, out = node.input_uids(), node.output_uids()
    if node.kind == "slice":
        bounds = node.op.bounds(None, piece.tensor(ins[0]).dim)  # type: ignore[attr-defined]
        whole = [(0, d, 1) for d in space.dims]
        half = head // 2
        if (
            ins[0] not in values
            or ins[0] in halves
            or head % 2
            or half & (half - 1)
            or not any(list(bounds) == [*whole[:axis], b, *whole[axis + 1 :]] for b in ((0, half, 1), (half, head, 1)))
        ):
            return (
                f"{node.label()} slices a split product's value other than to a half of its head dims "
                "(a GEMM epilogue swaps halves of a head in registers)"
            )
    elif node.kind == "concatenate":
        if len(ins) != 2 or not set(ins) <= halves or node.op.axis != axis:  # type: ignore[attr-defined]
            return f"{node.label()} joins other than two halves of a split product's head dims"
    elif not elementwise(node) or any(u not in halves for u in ins if piece.tensor(u).numel != 1):
        return f"{node.label()} mixes a half of a head's dims with a whole tensor; only halves meet before the join"
    if node.kind != "concatenate":
        if set(out) & outputs:
            return f"{node.label()} computes a half of a head's dims, which the epilogue does not store"
        halves.update(out)
    return None


def _memory_view(
    node: Node, piece: Piece, views: Mapping[int, View], producer: Mapping[int, Node], outputs: set[int]
) -> View | str:
    """The view `node` makes of a tensor in memory (or of such a view), for the epilogue to read in place,
    or why it cannot be one."""
    src, out = node.input_uids()[0], node.output_uids()[0]
    if out in outputs:
        return f"{node.label()} is needed outside the kernel; a view in a GEMM epilogue is only read"
    if src not in views and src in producer:
        return (
            f"{node.label()} takes a computed value; only tensors in memory are read through a view in a GEMM epilogue"
        )
    return _in_place(node, piece, views, "epilogue")


def _in_place(node: Node, piece: Piece, views: Mapping[int, View], where: str) -> View | str:
    """The view `node` makes of its input, a tensor in memory or a view already found, or why it is none."""
    src, out = node.input_uids()[0], node.output_uids()[0]
    if src in views:
        base, off, src_desc = views[src].base, views[src].offset, views[src].desc
    else:
        base, off, src_desc = src, 0, piece.tensor(src)
    view = view_of(node, src_desc, base, off, out, own_dims(piece, node))
    if not isinstance(view, str) and piece.tensor(out).data_type is not src_desc.data_type:
        return f"{node.label()} changes the data type; a view in a GEMM {where} only moves data"
    return view


def _reduction(node: Node, piece: Piece, space: OutputSpace) -> Reduce | str:
    if space.cols:
        return f"{node.label()} reduces a product whose columns are split into heads; not fused"
    src = node.input_uids()[0]
    x = piece.tensor(src)
    if x.dim != space.dims:
        return f"{node.label()} reduces dims {list(x.dim)}, not the output's {list(space.dims)}"
    if isinstance(node.op, GenStats):
        axes = {a for a in range(len(x.dim)) if a != 1 and above_one(x.dim[a])}
    else:
        assert isinstance(node.op, Reduction)
        if node.op.mode in (ReductionMode.MUL, ReductionMode.MUL_NO_ZEROS):
            return f"{node.label()}: product reductions are not fused into GEMM epilogues"
        out = piece.tensor(node.outputs[0])  # type: ignore[arg-type]
        axes = set(reduced_axes(x.dim, out.dim))
    rows = {a for a in space.rows if above_one(space.dims[a])}
    cols = {space.col} if above_one(space.dims[space.col]) else set()
    batch = {a for a in space.batch if above_one(space.dims[a])}
    if not axes:
        return f"{node.label()} reduces no axis"
    batch_red = axes & batch
    if batch_red and batch_red != batch:
        return f"{node.label()} reduces some batch axes but not all"
    count = math.prod(x.dim[a] for a in axes)
    if rows and rows <= axes and not axes & cols and axes <= rows | batch:
        return Reduce(node, src, "rows", bool(batch_red), count)
    if cols and cols <= axes and not axes & rows and axes <= cols | batch:
        return Reduce(node, src, "cols", bool(batch_red), count)
    if rows and cols and rows | cols <= axes:
        return Reduce(node, src, "all", bool(batch_red), count)
    return (
        f"{node.label()} reduces axes {sorted(axes)}; a GEMM epilogue reduces all of the tile's row "
        f"axes {sorted(rows)}, its column axis {sorted(cols)} or both (plus, optionally, the batch axes)"
    )
