"""What the normalization templates (norm_stats, rownorm) share: recognising a piece as one
normalization op with a pointwise prologue (ops computing its full-size inputs) and a pointwise
epilogue (ops on its full-size output), addressing tensors of any strides from tile coordinates,
and collecting kernel parameters.

Vocabulary. The *space* is the normalization input's dims. A generated kernel walks it in tiles of
up to two axes; the space's axes are grouped into *components* (e.g. "the reduced axes with strides
above C's"), each addressed by one flat index variable (packed in the input's memory order) that is
either a scalar of the program or varies along one tile axis. A tensor's offset is then a sum over
components: `idx * stride` when the tensor's strides over the component's axes are packed like the
input's, else the index split into coordinates (`(idx // inner) % dim`).
"""

from __future__ import annotations

import re
from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ....core.config import Support
from ....core.device import Device
from ....core.ir import Const, Node, Operand
from ....core.piece import Piece, make_piece
from ....core.symbolic import evaluate
from ....core.tensor import TensorDesc, order_value
from ....ops.layout import VIEW_KINDS
from ...shared.views import View, memory_views, written_views
from ..casts import operand
from ..expr import Emitter, compute_type, elementwise, from_storage, literal, piece_types, scalar_value
from ..sizes import Sizes, above_one
from .base import Match, Params, Template, module_source, program_id

INT32_LIMIT = 2**31 - 1
FULL_ROLES = ("input", "grad")  # roles of a normalization op that live in the full space


@dataclass(frozen=True)
class Fusion:
    """A piece as prologue -> one normalization -> epilogue."""

    norm: Node
    prologue: tuple[Node, ...]
    epilogue: tuple[Node, ...]
    x: TensorDesc  # the normalization's input: its dims are the space (its strides: the memory read)
    # slices/transposes/reshapes of tensors in memory that the kernel reads in place (by the view's UID),
    # and tensors written through transposes/reshapes of values it computes (by the written tensor's UID:
    # the value's UID and its view of that tensor's memory)
    views: Mapping[int, View] = field(default_factory=dict)
    written: Mapping[int, tuple[int, View]] = field(default_factory=dict)

    def prologue_for(self, uids: set[int]) -> tuple[Node, ...]:
        """The prologue nodes that tensors `uids` depend on, in order."""
        needed = set(uids)
        keep: list[Node] = []
        for node in reversed(self.prologue):
            if any(u in needed for u in node.output_uids()):
                keep.append(node)
                needed.update(node.input_uids())
        return tuple(reversed(keep))

    def full_inputs(self) -> set[int]:
        """The normalization's full-size inputs (x, and dy for a backward)."""
        return {
            u for r in FULL_ROLES if r in self.norm.op.input_roles() for u in [self.norm.input(r)] if isinstance(u, int)
        }


def analyze(piece: Piece, kinds: Sequence[str], template: str, views: bool = False) -> Fusion | Support:
    """The piece as a Fusion, or Support.no with the reason it is not one. With `views`, the piece may
    read tensors in memory through slices/transposes/reshapes and write its full-size values through
    transposes/reshapes (the template addresses both through their strides)."""
    if piece.kind_set <= {"pointwise"}:  # (without a pass over a long pointwise piece)
        return Support.no(f"the {template} template needs a {'/'.join(kinds)} op in the piece")
    norms = [n for n in piece.nodes if n.kind in kinds]
    viewed = views and bool(piece.kind_set & set(VIEW_KINDS))
    others = [
        n for n in piece.nodes if n.kind not in kinds and not elementwise(n) and not (viewed and n.kind in VIEW_KINDS)
    ]
    if others:
        return Support.no(
            f"the {template} template fuses one {'/'.join(kinds)} op with pointwise ops; "
            f"{others[0].label()} is neither",
            others[0],
        )
    if not norms:
        return Support.no(f"the {template} template needs a {'/'.join(kinds)} op in the piece")
    if len(norms) > 1:
        return Support.no(
            f"the {template} template runs one {'/'.join(kinds)} op per kernel; this piece has "
            f"{', '.join(n.label() for n in norms)}",
            norms[1],
        )
    read: Mapping[int, View] = {}
    written: Mapping[int, tuple[int, View]] = {}
    if viewed:
        found = _views(piece, template)
        if isinstance(found, Support):
            return found
        read, written = found
    norm = norms[0]
    computing = [n for n in piece.nodes if n.kind not in VIEW_KINDS]
    prologue, epilogue = computing[: computing.index(norm)], computing[computing.index(norm) + 1 :]
    x_uid = norm.input("input")
    assert isinstance(x_uid, int)
    x = read[x_uid].desc if x_uid in read else piece.tensor(x_uid)
    space = x.dim
    produced = {u for n in computing if n is not norm for u in n.output_uids()}
    roles = norm.op.input_roles()
    for role, v in zip(roles, norm.inputs):
        if isinstance(v, int) and role not in FULL_ROLES and v in produced:
            return Support.no(
                f"{role} of {norm.label()} is computed inside the piece; the kernel reads "
                "per-channel parameters, statistics and scalars from memory",
                norm,
            )
        if isinstance(v, int) and role in FULL_ROLES and piece.tensor(v).dim != space:
            return Support.no(
                f"{role} of {norm.label()} has dims {list(piece.tensor(v).dim)}, not the input's {list(space)}", norm
            )
    full_out = norm.outputs[0]
    side_outputs = {u for u in norm.output_uids() if u != full_out}
    for node in (*prologue, *epilogue):
        for u in node.input_uids():
            if u in side_outputs:
                return Support.no(
                    f"{node.label()} reads a statistic of {norm.label()}; fused pointwise ops "
                    "may read its full-size output and tensors from memory only",
                    node,
                )
            d = piece.tensor(u).dim
            if piece.tensor(u).numel != 1 and (len(d) != len(space) or any(a not in (1, b) for a, b in zip(d, space))):
                return Support.no(f"{node.label()} reads dims {list(d)}, which do not broadcast to {list(space)}", node)
        for u in node.output_uids():
            if piece.tensor(u).dim != space:
                return Support.no(
                    f"{node.label()} writes dims {list(piece.tensor(u).dim)}; a pointwise op fused "
                    f"with {norm.label()} must cover its input's dims {list(space)}",
                    node,
                )
    for start, _ in written.values():
        if piece.tensor(start).dim != space or not any(start in n.output_uids() for n in computing):
            return Support.no(
                f"{piece.tensor(start).label()} is written through a view; the {template} template writes "
                f"views of values it computes over {norm.label()}'s input dims {list(space)} only",
                norm,
            )
    return Fusion(norm, tuple(prologue), tuple(epilogue), x, read, written)


def _views(piece: Piece, template: str) -> tuple[dict[int, View], dict[int, tuple[int, View]]] | Support:
    """The piece's views read in place from memory (memory_views: chains from tensors in memory), and the
    tensors it writes through views of values it computes (written_views)."""
    computed = {u for n in piece.nodes if n.kind not in VIEW_KINDS for u in n.output_uids()}
    chained: set[int] = set()
    later: list[Node] = []
    for n in piece.nodes:
        if n.kind in VIEW_KINDS and (n.input_uids()[0] in computed or n.input_uids()[0] in chained):
            chained.add(n.output_uids()[0])
            later.append(n)
    skip = {id(n) for n in later}
    read = memory_views(make_piece(piece.graph, piece.index, [n for n in piece.nodes if id(n) not in skip]))
    if isinstance(read, Support):
        return read
    for u in read:
        if u in piece.outputs:
            return Support.no(
                f"{piece.tensor(u).label()} is a view the piece would write out; the {template} template "
                "reads views of tensors in memory in place but does not copy them",
            )
    written = written_views(piece, later, template) if later else {}
    return (read, written) if not isinstance(written, Support) else written


# -- addressing ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Comp:
    """A group of space axes (outermost first, sizes > 1) addressed by one flat index variable."""

    axes: tuple[int, ...]
    var: str
    tile_axis: int | None  # the tile axis it varies along; None: a scalar of the program/iteration


def memory_order(axes: Sequence[int], stride: Sequence[int]) -> tuple[int, ...]:
    return tuple(sorted(axes, key=lambda a: (-order_value(stride[a]), a)))


def is_run(axes: Sequence[int], dims: Sequence[int], stride: Sequence[int]) -> bool:
    """Whether `axes` (outermost first) are packed one inside the next (mergeable into one index)."""
    return all(stride[axes[i]] == stride[axes[i + 1]] * dims[axes[i + 1]] for i in range(len(axes) - 1))


class RowIndexer:
    """Offsets, loads and stores of tensors over the space, from component indices (the Emitter's
    Indexer). `masks[set of tile axes]` is the mask of a load whose offset varies along those axes
    (None: no mask); `zeros[k]` is an int zero tensor along tile axis k, added to a store whose offset
    does not vary along k (stores cover the whole tile)."""

    def __init__(
        self,
        dims: Sequence[int],
        comps: Sequence[Comp],
        masks: Mapping[frozenset[int], str | None],
        zeros: Mapping[int, str] | None = None,
        text: Callable[[Any], str] = str,
    ) -> None:
        self.dims = tuple(dims)
        self.comps = tuple(comps)
        self.masks = masks
        self.zeros = zeros or {}
        self.tile_axes = frozenset(c.tile_axis for c in comps if c.tile_axis is not None)
        self.text = text  # spells a size (sizes.Sizes.text where sizes are run-time arguments)

    def comp_offset(self, comp: Comp, desc: TensorDesc) -> str | None:
        axes = [a for a in comp.axes if above_one(desc.dim[a]) and desc.stride[a] != 0]
        if not axes:
            return None
        text = self.text
        if len(axes) == len(comp.axes) and is_run(comp.axes, self.dims, desc.stride):
            s = desc.stride[comp.axes[-1]]
            return comp.var if s == 1 else f"{comp.var} * {text(s)}"
        inner, acc = {}, 1
        for a in reversed(comp.axes):
            inner[a] = acc
            acc *= self.dims[a]
        terms = []
        for a in axes:
            e = comp.var if inner[a] == 1 else f"({comp.var} // {text(inner[a])})"
            if a != comp.axes[0]:
                e = f"({e} % {text(self.dims[a])})"
            terms.append(e if desc.stride[a] == 1 else f"{e} * {text(desc.stride[a])}")
        return " + ".join(terms)

    def offset(self, desc: TensorDesc) -> tuple[str, frozenset[int]]:
        terms, axes = [], set()
        for comp in self.comps:
            off = self.comp_offset(comp, desc)
            if off is not None:
                terms.append(off)
                if comp.tile_axis is not None:
                    axes.add(comp.tile_axis)
        return (" + ".join(terms) or "0"), frozenset(axes)

    def load(self, desc: TensorDesc, ptr: str) -> str:
        if desc.numel == 1:
            return f"tl.load({ptr})"
        off, axes = self.offset(desc)
        mask = self.masks.get(axes)
        return f"tl.load({ptr} + {off}" + (f", mask={mask}, other=0)" if mask else ")")

    def store(self, desc: TensorDesc, ptr: str, value: str) -> str:
        off, axes = self.offset(desc)
        for k in sorted(self.tile_axes - axes):
            off += f" + {self.zeros[k]}"
        mask = self.masks.get(self.tile_axes)
        return f"tl.store({ptr} + {off}, {value}" + (f", mask={mask})" if mask else ")")

    def coord(self, axis: int, desc: TensorDesc) -> str:
        for comp in self.comps:
            if axis in comp.axes:
                inner = 1
                for a in comp.axes[comp.axes.index(axis) + 1 :]:
                    inner *= self.dims[a]
                e = comp.var if inner == 1 else f"({comp.var} // {self.text(inner)})"
                return e if axis == comp.axes[0] else f"({e} % {self.text(self.dims[axis])})"
        return "0"  # a size-1 axis


class PrefetchIndexer(RowIndexer):
    """A RowIndexer for the body of a loop over tiles whose loads are issued one iteration ahead
    (register double buffering): a load whose offset involves a component in `walked` (one that
    changes from one iteration to the next) reads `pf_<ptr>`, the raw (storage-type) tile loaded
    for this iteration by the previous one, and `nxt` (the same components and masks named for the
    next tile, its masks false past the loop's end) gives the load of the next tile. The caller
    emits `first()` before the loop (with the next-tile names set to the first tile), `issue()` at
    the top of the body (so the next tile is in flight while the body waits for this one) and
    `rotate()` at its end. Other loads (per-channel parameters, scalars) are left as they are."""

    def __init__(
        self,
        dims: Sequence[int],
        comps: Sequence[Comp],
        masks: Mapping[frozenset[int], str | None],
        zeros: Mapping[int, str] | None,
        walked: set[str],
        nxt: RowIndexer,
        text: Callable[[Any], str] = str,
    ) -> None:
        super().__init__(dims, comps, masks, zeros, text)
        self.walked = walked
        self.nxt = nxt
        self.loads: dict[str, str] = {}  # register name -> load over the next tile's indices

    def load(self, desc: TensorDesc, ptr: str) -> str:
        if desc.numel == 1 or not any(
            c.var in self.walked and self.comp_offset(c, desc) is not None for c in self.comps
        ):
            return super().load(desc, ptr)
        name = f"pf_{ptr}"
        self.loads.setdefault(name, self.nxt.load(desc, ptr))
        return name

    def first(self) -> list[str]:
        return [f"{n} = {e}" for n, e in self.loads.items()]

    def issue(self) -> list[str]:
        return [f"{n}_n = {e}" for n, e in self.loads.items()]

    def rotate(self) -> list[str]:
        return [f"{n} = {n}_n" for n in self.loads]


def prefetched(
    indexers: Sequence[RowIndexer], first: list[str], following: list[str], loop: list[str]
) -> tuple[list[str], list[str]]:
    """(lines before a tile loop, its body) with the loads of the PrefetchIndexers among `indexers`
    issued one iteration ahead: `first` / `following` are the index lines of the first tile (before
    the loop) and of the next one (in the body); `loop` is the body as it is without prefetching."""
    loads = [i for i in indexers if isinstance(i, PrefetchIndexer) and i.loads]
    if not loads:
        return [], loop
    return (
        first + [line for i in loads for line in i.first()],
        following + [line for i in loads for line in i.issue()] + loop + [line for i in loads for line in i.rotate()],
    )


def loop_header(var: str, lo: str, hi: str, step: str | None, stages: int) -> str:
    """`for var in range(lo, hi[, step]):`; with stages > 1, `tl.range(..., num_stages=stages)`, which
    software-pipelines every load of the body (cp.async into shared memory on sm_80+: `stages - 1`
    tiles in flight per program without holding them in registers; the interpreter ignores it)."""
    args = ", ".join([lo, hi] + ([step] if step else []))
    if stages > 1:
        return f"for {var} in tl.range({args}, num_stages={stages}):"
    return f"for {var} in range({args}):"


# -- kernel parameters ------------------------------------------------------------------------------


class NormGen:
    """What the generators of one normalization piece's launches share: the piece, its geometry `g`
    (with the piece as a Fusion, `g.fusion`, and the space's dims, `g.dims`), the knobs `k`, the
    compute and accumulator types, and int64 program ids where offsets need them."""

    def __init__(self, piece: Piece, g: Any, knobs: Any, sizes: Sizes | None = None) -> None:
        """`sizes`: where the kernel takes its sizes at run time (sizes.py), `piece` is the symbolic one
        (`symbolic_piece`) and `g` its geometry."""
        self.piece, self.g, self.k = piece, g, knobs
        self.sizes = sizes
        self.text: Callable[[Any], str] = sizes.text if sizes is not None else str
        self.node = g.fusion.norm
        self.compute = compute_of(piece)
        self.acc_bytes = 8 if self.compute == "tl.float64" else 4
        self.scratch_dtype = "float64" if self.compute == "tl.float64" else "float32"
        self.big = (
            is_big(piece)
            if sizes is None
            else sizes.needs_int64(piece.tensor(u) for u in (*piece.inputs, *piece.outputs))
        )
        self.x_uid = self.node.input("input")

    def at_shape(self, value: Any) -> int:
        """A size at the shape being planned (a host-side count: grids, program counts)."""
        return value if self.sizes is None else evaluate(value, self.sizes.env)

    def add_sizes(self, params: Params) -> None:
        """The size parameters the body used, added last to `params` (before its signature is made)."""
        if self.sizes is not None:
            self.sizes.add_params(params)

    def module(self, *functions: str) -> str:
        """The generated module of `functions` (listing its size parameters where it has some)."""
        if self.sizes is None:
            return module_source(*functions)
        return module_source(self.sizes.declaration(), *functions)

    def pid(self, axis: int = 0) -> str:
        return program_id(axis, self.big)

    def emitter(self, indexer: RowIndexer, params: Params) -> Emitter:
        """An emitter of this piece's values over `indexer`, reading and writing through its views."""
        return make_emitter(self.piece, self.compute, indexer, params, self.g.fusion)

    def stored(self, role: str) -> int | None:
        """The normalization's output of `role` where the piece writes it to memory, else None."""
        u = self.node.output(role) if role in self.node.op.output_roles() else None
        return u if u is not None and u in self.piece.outputs else None

    def store_result(self, em: Emitter, role: str, value: str) -> None:
        """Store `value` as the normalization's output of `role` where the piece writes it."""
        u = self.stored(role)
        if u is not None:
            em.values[u] = operand(value)  # an operand of later expressions: `inv * t_e` in parentheses
            em.store(u)

    def emit_output(self, em: Emitter, value: str) -> None:
        """The normalization's full-size output (y, or dx) = `value`, rounded to its declared type,
        then the epilogue and the stores of the full-size outputs."""
        out = self.node.outputs[0]
        assert out is not None
        em.assign(out, value)
        for n in self.g.fusion.epilogue:
            em.emit(n)
        for u in self.piece.outputs:
            if self.piece.tensor(u).dim == self.g.dims and u in em.values and u not in self.g.fusion.written:
                em.store(u)
        for end, (start, _) in self.g.fusion.written.items():  # (through the view's strides: make_emitter)
            em.operand(start)
            em.values[end] = em.values[start]
            if start in em.native:
                em.native[end] = em.native[start]
            em.store(end)


class NormTemplate(Template):
    """A template of pieces that are one normalization op with its fusion, described by a geometry
    (`_geometry`: the geometry, or Support.no with the reason the piece is not one)."""

    match_class: type[NormMatch]

    @abstractmethod
    def _geometry(self, piece: Piece) -> Any: ...

    def match(self, piece: Piece, device: Device) -> Support | NormMatch:
        g = self._geometry(piece)
        return g if isinstance(g, Support) else self.match_class(self, piece, device, g)


class NormMatch(Match[Any]):
    """A normalization piece matched: its geometry `g`."""

    def __init__(self, template: NormTemplate, piece: Piece, device: Device, g: Any) -> None:
        super().__init__(template, piece, device)
        self.g = g


def scalar_expr(v: Operand, tensors: Mapping[int, TensorDesc], params: Params, compute: str) -> str:
    """A scalar input (epsilon, momentum): baked literal, pass-by-value argument, or a 1-element tensor
    read from device memory at run time."""
    if isinstance(v, Const):
        return literal(v.value)
    assert isinstance(v, int)
    if tensors[v].is_pass_by_value:
        return scalar_value(params.scalar(v), compute)
    return from_storage(f"tl.load({params.buf(v)})", tensors[v].data_type, compute)


def make_emitter(
    piece: Piece, compute: str, indexer: RowIndexer, params: Params, fusion: Fusion | None = None
) -> Emitter:
    """An emitter over `indexer`; with `fusion`, it reads the fusion's views of memory in place (a view's
    loads go through its strides, from its source's buffer) and writes the tensors its written views
    end at through theirs."""
    if fusion is None or not (fusion.views or fusion.written):
        return Emitter(piece.graph.tensors, compute, indexer, ptr=params.buf, scalar=params.scalar)
    views = fusion.views
    tensors = {**piece.graph.tensors, **{u: v.desc for u, v in views.items()}}
    for end, (_, v) in fusion.written.items():
        tensors[end] = replace(v.desc, uid=end, data_type=piece.tensor(end).data_type)

    def ptr(u: int) -> str:
        if u not in views:
            return params.buf(u)
        v = views[u]
        return f"({params.buf(v.base)} + {v.offset})" if v.offset else params.buf(v.base)

    return Emitter(tensors, compute, indexer, ptr=ptr, scalar=params.scalar)


def is_big(piece: Piece) -> bool:
    """Whether some tensor spans more than int32 offsets (program ids are then widened)."""
    for u in (*piece.inputs, *piece.outputs):
        t = piece.tensor(u)
        if 1 + sum((d - 1) * s for d, s in zip(t.dim, t.stride)) > INT32_LIMIT or t.numel > INT32_LIMIT:
            return True
    return False


def compute_of(piece: Piece) -> str:
    return compute_type(piece_types(piece))


def pow2_floor(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def pow2_ceil(n: int) -> int:
    return 1 << max(0, (max(n, 1) - 1).bit_length())


def nest(header: str, lines: Sequence[str]) -> list[str]:
    """A block statement: `header` then `lines` (which may hold nested blocks) indented once."""
    return [header, *("    " + line for text in lines for line in text.split("\n"))]


_VALUE = re.compile(r"\bv(\d+)\b")


def renamed(text: str, prefix: str) -> str:
    """An Emitter region's value names (v{uid}) renamed to {prefix}{uid}. Two regions of one kernel
    that compute the same tensor with different tile shapes (e.g. the shift before a loop and the tile
    inside it) must not share names: Triton would take them for loop-carried variables whose type
    changes."""
    return _VALUE.sub(lambda m: f"{prefix}{m.group(1)}", text)
