"""Elementwise pieces: any DAG of pointwise ops with broadcasting, mixed types and several outputs,
as one kernel over the outputs' iteration space.

The space is walked in the memory order of the first output, one flat index `lin` per element. A
tensor laid out like that output (same dims, packed, same axis order) is addressed by `lin` itself,
which Triton vectorises; any other tensor (broadcast, transposed, gapped) by the coordinates
it needs, each `(lin // inner) % dim` with constants folded in, neighbouring axes along which it is
packed as the space is taken as one (a per-row value over [batch, seq] rows: `lin // cols`). Where a
tensor of the space is contiguous along another axis than the first output (a cast of a transposed
weight), the flat walk would read it with a stride: the template then walks 2-D tiles of the two
contiguous axes instead (TileIndexer, knobs TILE_I / TILE_J), each tensor loaded or stored along its
own contiguous axis.
Where the flat walk would compute coordinates per element (a per-row value broadcast along the
innermost axis, a division by a dimension that is not a power of two, a gen_index), the template
walks ROWS x COLS tiles of the first output's two innermost axes (the row walk, row_axes): columns
are an arange, each row's values are loaded once per row and the outer axes' once per program. A
cross-entropy backward over [8192, 50304] logits (exp(x - m) / s - onehot) * w took ~48 instructions
an element in the flat walk on sm_90 (4 loads of per-row values and a division per element), ~27 in
the row walk: the flat walk was bound by instruction issue, not by memory. A concatenation is a select
over the coordinate along its axis, each operand computed in a frame of its own (_concat.py; the flat
walk only); a slice_backward likewise, its gradient in the slice's frame and zero outside it. Where
every concatenation joins along the first output's innermost axis at bounds that are multiples of a
width W (the rotary embedding's halves), the part walk (knob PARTS) takes the flat walk over the space
with that axis cut to W and emits the body once a part, each part's concatenations resolved when the
code is generated (_concat.part_width).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from functools import cached_property
from typing import Any

from ....core.config import Support
from ....core.device import Device
from ....core.errors import AttributeValueError
from ....core.ir import ShapeOrigin
from ....core.piece import Piece
from ....core.symbolic import Expr, evaluate
from ....core.tensor import TensorDesc, stride_order
from ..casts import from_storage, to_storage
from ..expr import Emitter, compute_type, elementwise, fused_custom, node_compute_type, piece_types
from ..gemm import VIEW_KINDS, memory_views
from ..knobs import PointwiseKnobs
from ..sizes import Sizes, above_one, is_dynamic_desc, symbolic_piece
from ._concat import CONCAT, FRAMED, SLICE_BACKWARD, check_frames, emit_frame, emit_node, part_width
from ._gather import EMBEDDING, check_gathers
from ._pointwise_walks import PART_MIN, FlatIndexer, PartIndexer, TileIndexer
from ._view_copy import chains_of, source_offset, view_chains
from .base import (
    INT32_LIMIT,
    Generated,
    Launch,
    Match,
    Template,
    external_params,
    indent,
    module_source,
    offsets_need_int64,
    pow2_at_least,
    program_id,
    unique,
)


def _with_views(piece: Piece, views: dict[int, Any]) -> dict[int, TensorDesc]:
    """The piece's tensors, its slices/transposes as the views of memory they read."""
    return {**piece.graph.tensors, **{u: v.desc for u, v in views.items()}}


FLAT_ONLY = FRAMED | {EMBEDDING}  # ops emitted for the flat walk only (their masks are its)


def transposed_axes(piece: Piece, views: dict[int, Any]) -> tuple[int, int] | None:
    """(i, j) where a large tensor of the piece's space is contiguous along axis i and the first
    output along axis j != i: the flat walk would read (or write) it with a stride; None otherwise."""
    first = piece.tensor(piece.outputs[0])
    space = first.dim
    if math.prod(space) < 1 << 12 or piece.kind_set & FLAT_ONLY:
        return None

    def innermost(desc: TensorDesc) -> int | None:
        axes = [a for a in stride_order(desc.stride) if desc.dim[a] > 1]
        return axes[-1] if axes and desc.stride[axes[-1]] == 1 else None

    j = innermost(first)
    if j is None:
        return None
    tensors = _with_views(piece, views)
    for u in (*piece.inputs, *views):
        desc = tensors[u]
        if desc.is_pass_by_value or desc.dim != space:
            continue
        i = innermost(desc)
        if i is not None and i != j and desc.stride[j] >= 8:
            return i, j
    return None


def _is_pow2(n: int) -> bool:
    return n & (n - 1) == 0


ROW_MIN = 128  # the shortest innermost axis the row walk takes (a tile's tail is masked off)
ROW_FIRST_TAIL = 1 / 16  # the row walk ranks first where each row's last tile is masked off no more


def row_axes(piece: Piece, views: dict[int, Any]) -> tuple[int, int] | None:
    """(i, j): the first output's innermost axis j (contiguous, at least ROW_MIN elements) and its next
    axis i, where no tensor is transposed (transposed_axes) and the flat walk would compute per element
    a coordinate other than a power-of-two `lin % dims[j]`: for a tensor broadcast along j (a per-row
    value, then also loaded per element), one addressed through a division by a dimension, or a
    gen_index; None otherwise."""
    first = piece.tensor(piece.outputs[0])
    space = first.dim
    if math.prod(space) < 1 << 12 or piece.kind_set & FLAT_ONLY:
        return None
    order = tuple(a for a in stride_order(first.stride) if space[a] > 1)
    if len(order) < 2 or first.stride[order[-1]] != 1 or space[order[-1]] < ROW_MIN:
        return None
    if transposed_axes(piece, views) is not None:
        return None
    flat = FlatIndexer(space, stride_order(first.stride))
    _emit(piece, flat, views)
    needed = {a for a in (*flat.needed, *(a for run in flat.merged.values() for a in run)) if space[a] > 1}
    i, j = order[-2], order[-1]
    if not needed or (needed == {j} and _is_pow2(space[j])):
        return None
    return i, j


def tail_waste(cols: int, tj: int) -> float:
    """The share of a row's tiles of width `tj` that its last tile masks off."""
    return 1 - cols / (-(-cols // tj) * tj)


def row_tiles(rows: int, cols: int) -> list[tuple[int, int, int]]:
    """(ROWS, COLS, num_warps) of the row walk over `rows` x `cols`, the heuristic's first: COLS the
    widest power of two to 2048 whose tail wastes at most ROW_FIRST_TAIL (else the least wasteful),
    tiles of 2048 elements with 4 warps (16 a thread in 16-bit types, two 128-bit vectors), then of
    4096 with 8 and 1024 with 4."""
    widths = [tj for tj in (2048, 1024, 512, 256, 128) if tj <= pow2_at_least(cols)]
    fit = [tj for tj in widths if tail_waste(cols, tj) <= ROW_FIRST_TAIL]
    tj = fit[0] if fit else min(widths, key=lambda t: tail_waste(cols, t))
    tiles = [
        (max(1, min(pow2_at_least(rows), size // tj)), tj, warps) for size, warps in ((2048, 4), (4096, 8), (1024, 4))
    ]
    return list(dict.fromkeys(tiles))


def _first_dims(acc: dict, node: Any, tensors: Any) -> dict:
    """Fold step: {dims: (first node, its output uid)} over the outputs of non-view nodes."""
    if node.kind in VIEW_KINDS:
        return acc
    new = {tensors[u].dim: (node, u) for u in node.output_uids() if tensors[u].dim not in acc}
    return {**acc, **{d: v for d, v in new.items() if d not in acc}} if new else acc


def copies_out(piece: Piece, views: dict[int, Any]) -> bool:
    """Whether the piece is views alone, written out: a copy, such as the flatten of a language model's
    logits, or views whose readers are not next to them (the partitioner keeps views pending for a reader
    that reads them in place, a GEMM's operand, and closes the others as copies). A view that other ops of
    the piece compute from is not copied."""
    return all(n.kind in VIEW_KINDS for n in piece.nodes) and all(u in views for u in piece.outputs)


def _emit(
    piece: Piece,
    indexer: FlatIndexer | PartIndexer | TileIndexer,
    views: dict[int, Any],
    tensors: Mapping[int, TensorDesc] | None = None,
    text: Callable[[Any], str] = str,
) -> Emitter:
    """The piece's loads, math and stores over `indexer` (which notes the coordinates they need); `views`:
    the piece's slices/transposes as views of memory (memory_views); `tensors`: the descs to read
    (default the piece's with its views'); `text` spells a view's offset (sizes.Sizes.text)."""

    def ptr(u: int) -> str:  # a view reads its source's buffer, from its offset
        if u not in views:
            return f"p{u}"
        v = views[u]
        return f"(p{v.base} + {text(v.offset)})" if v.offset != 0 else f"p{v.base}"

    emitter = Emitter(
        tensors if tensors is not None else _with_views(piece, views),
        compute_type(piece_types(piece)),
        indexer,
        ptr=ptr,
        scalar=lambda u: f"s{u}",
    )
    framed = bool(piece.kind_set & FRAMED)
    if framed:  # (on demand, per frame: _concat.py)
        emit_frame(piece, emitter, piece.outputs)
    for node in piece.nodes if not framed else ():
        if node.kind not in VIEW_KINDS:
            emit_node(emitter, node)
    for u in piece.outputs:
        if u in views:  # (copies_out: moved in the storage type, read through the view, written packed)
            emitter.lines.append(indexer.store(piece.tensor(u), f"p{u}", indexer.load(views[u].desc, ptr(u))))
        else:
            emitter.store(u)
    return emitter


class PointwiseTemplate(Template):
    name = "pointwise"
    main_kinds = ("pointwise", "custom", "slice", "transpose", "reshape", CONCAT, EMBEDDING, SLICE_BACKWARD)
    knob_class = PointwiseKnobs

    def match(self, piece: Piece, device: Device) -> Support | PointwiseMatch:
        # linear in a piece grown op by op: kind checks on the piece's kind set, per-op facts folded
        kinds = piece.kind_set
        views = memory_views(piece) if kinds & set(VIEW_KINDS) else {}
        if isinstance(views, Support):
            # views alone that no strides describe (a reshape merging axes that are not one run): no kernel
            # reads them in place, so they are copied, through the coordinates they map each element to
            # (_view_copy.py)
            if not kinds <= set(VIEW_KINDS):
                return views
            chains = view_chains(piece)
            if isinstance(chains, Support):
                return Support.no(f"{views.reason}; {chains.reason}", chains.node or views.node)
            if len({piece.tensor(u).dim for u in piece.outputs}) != 1:
                return Support.no("its outputs have different dims; one kernel walks one space")
            return PointwiseMatch(self, piece, device, {}, chains)
        if not kinds <= {"pointwise", *FRAMED, EMBEDDING, *VIEW_KINDS}:
            for node in piece.nodes:
                if node.kind not in (*FRAMED, EMBEDDING, *VIEW_KINDS) and not elementwise(node):
                    why = fused_custom(node) if node.kind == "custom" else f"not {node.kind}"
                    return Support.no(
                        f"the pointwise template runs pointwise ops (and reads slices/transposes "
                        f"of tensors in memory) only, {why}",
                        node,
                    )
        copied = [u for u in piece.outputs if u in views]
        if copied and not copies_out(piece, views):
            return Support.no(
                f"{piece.tensor(copied[0]).label()} is a slice/transpose the piece would write "
                "out beside computed values; this template reads views in place and copies views alone"
            )
        dims = {piece.tensor(u).dim for u in piece.outputs}
        if len(dims) != 1:
            return Support.no(f"its outputs have different dims {sorted(dims)}; one kernel walks one space")
        (space,) = dims
        seen = _with_views(piece, views) if EMBEDDING in kinds or kinds & FRAMED else {}
        if EMBEDDING in kinds:
            produced = {u for n in piece.nodes if n.kind not in VIEW_KINDS for u in n.output_uids()}
            unfit = check_gathers(piece, produced, seen)
            if unfit is not None:
                return unfit
        if kinds & FRAMED:  # (each value at the dims of its frame: a concatenation's operands at theirs)
            unfit = check_frames(piece, seen, space)
            return unfit if unfit is not None else PointwiseMatch(self, piece, device, views)
        # the first op writing each distinct dims (views are read where a pointwise op reads them,
        # broadcast by that op's rule)
        tensors = piece.graph.tensors
        firsts = piece.fold("pointwise.dims", lambda acc, n: _first_dims(acc, n, tensors), {})
        for d, (node, u) in firsts.items():
            if len(d) != len(space) or any(a != b and a != 1 for a, b in zip(d, space)):
                return Support.no(
                    f"{piece.tensor(u).label()} dims {list(d)} do not broadcast to the piece's space {list(space)}",
                    node,
                )
        return PointwiseMatch(self, piece, device, views)


class PointwiseMatch(Match[PointwiseKnobs]):
    """A pointwise piece: its views of memory, and the walk it takes (flat, transposed tiles or rows), found
    once."""

    def __init__(
        self,
        template: PointwiseTemplate,
        piece: Piece,
        device: Device,
        views: dict[int, Any],
        chains: dict[int, tuple[Any, ...]] | None = None,
    ) -> None:
        super().__init__(template, piece, device)
        self.views = views
        self.chains = chains  # views alone, copied through coordinates (_view_copy.py): the flat walk only

    @cached_property
    def symbolic(self) -> tuple[Piece, dict[int, Any], ShapeOrigin] | None:
        """The symbolic piece (sizes.symbolic_piece), its views of memory and its origin where the
        kernel takes sizes at run time (sizes.py): a piece of a dynamic plan's bucket of pointwise ops,
        slices/transposes/reshapes read in place, concatenations (their offsets run-time sizes where
        an operand's size along the axis is dynamic) and lookups in tables of static size, whose
        symbolic outputs share one space that every op's output broadcasts to, or of views alone
        copied out (`chains`: symbolic_chains gives them over the symbolic piece); else None (its
        kernel is generated at the shape)."""
        piece = symbolic_piece(self.piece)
        if piece is None or not piece.kind_set <= {"pointwise", "custom", CONCAT, EMBEDDING, *VIEW_KINDS}:
            return None
        origin = self.piece.graph.origin
        assert origin is not None
        tensors = piece.graph.tensors
        uids = {u for n in piece.nodes for u in (*n.input_uids(), *n.output_uids())}
        if not any(is_dynamic_desc(tensors[u]) for u in uids):
            return None
        if self.chains is not None:  # (views alone, copied through coordinates: one space over the bucket)
            return (piece, {}, origin) if len({tensors[u].dim for u in piece.outputs}) == 1 else None
        tables = [n.input("weight") for n in piece.nodes if n.kind == EMBEDDING]
        if any(is_dynamic_desc(tensors[u]) for u in tables if isinstance(u, int)):
            return None  # (a lookup table of dynamic size: generated at the shape)
        try:
            views = memory_views(piece) if self.views else {}
        except TypeError:  # a view decided by a dynamic size: generated at the shape
            return None
        if isinstance(views, Support) or set(views) != set(self.views):
            return None
        spaces = {tensors[u].dim for u in piece.outputs}
        if len(spaces) != 1:
            return None
        (space,) = spaces
        if CONCAT in piece.kind_set:  # (each value at the dims of its frame; the joined axis static)
            try:
                unfit = check_frames(piece, _with_views(piece, views), space)
            except TypeError:
                return None
            return (piece, views, origin) if unfit is None else None
        for n in piece.nodes:
            if n.kind in VIEW_KINDS:
                continue
            for u in n.output_uids():
                d = tensors[u].dim
                if len(d) != len(space) or any(a != b and a != 1 for a, b in zip(d, space)):
                    return None
        return piece, views, origin

    @cached_property
    def symbolic_chains(self) -> dict[int, tuple[Any, ...]] | None:
        """The view chains of a view copy over the symbolic piece (the same nodes as `chains`, their
        sizes expressions), where it takes its sizes at run time."""
        if self.chains is None or self.symbolic is None:
            return None
        return chains_of(self.symbolic[0])

    @cached_property
    def transposed(self) -> tuple[int, int] | None:
        return None if self.chains or self.symbolic is not None else transposed_axes(self.piece, self.views)

    @cached_property
    def parts(self) -> tuple[int, int] | None:
        """(axis, W) of the part walk (_concat.part_width): the first output's innermost axis, contiguous, cut
        into parts of W >= PART_MIN elements that every concatenation of a piece at its shape keeps whole;
        None where the piece has no such walk."""
        piece = self.piece
        kinds = piece.kind_set
        if self.chains or self.symbolic is not None or CONCAT not in kinds or kinds & {EMBEDDING, SLICE_BACKWARD}:
            return None
        first = piece.tensor(piece.outputs[0])
        order = [a for a in stride_order(first.stride) if above_one(first.dim[a])]
        if not order or first.stride[order[-1]] != 1:
            return None
        axis = order[-1]
        width = part_width(piece, _with_views(piece, self.views), first.dim, axis)
        return (axis, width) if width is not None and width >= PART_MIN else None

    @cached_property
    def rows(self) -> tuple[int, int] | None:
        """The row walk's axes (row_axes) at the piece's shape; for a bucket's piece, where its symbolic
        first output walks the same two innermost axes, the innermost of static size (the sized row walk:
        a dynamic row count, the columns literal)."""
        if self.chains:
            return None
        found = row_axes(self.piece, self.views)
        if found is None or self.symbolic is None:
            return found
        sym = self.symbolic[0]
        first = sym.tensor(sym.outputs[0])
        i, j = found
        walked = tuple(a for a in stride_order(first.stride) if above_one(first.dim[a]))
        if walked[-2:] != (i, j) or isinstance(first.dim[j], Expr) or first.stride[j] != 1:
            return None
        return found

    def candidates(self) -> list[PointwiseKnobs]:
        piece = self.piece
        dims = piece.tensor(piece.outputs[0]).dim
        numel = math.prod(dims)
        if self.symbolic is not None:  # the bucket's hint: one choice for every shape of it
            sym, _, origin = self.symbolic
            numel = Sizes(origin).hint(math.prod(sym.tensor(piece.outputs[0]).dim))
        if self.transposed is not None:
            # (128 x 32: runs of 512 bytes of the transposed tensor, its tile transposed by ldmatrix)
            return [
                PointwiseKnobs(TILE_I=64, TILE_J=64, num_warps=4),
                PointwiseKnobs(TILE_I=32, TILE_J=128, num_warps=4),
                PointwiseKnobs(TILE_I=128, TILE_J=32, num_warps=4),
                PointwiseKnobs(BLOCK=2048, num_warps=8),
            ]
        if numel >= 1 << 22:
            ranked = [(2048, 8), (4096, 8), (1024, 4), (2048, 4)]
        else:
            b = min(1024, pow2_at_least(numel, 16))
            ranked = [(b, 4), (min(2048, pow2_at_least(numel, 16)), 8)]
        flat = unique([PointwiseKnobs(BLOCK=block, num_warps=warps) for block, warps in ranked])
        if self.parts is not None:  # (first: every address loaded once, no selects)
            axis, width = self.parts
            count = dims[axis] // width
            per_part = numel // count
            # 16 elements a thread a part (two 128-bit vectors of a 16-bit type, as the flat walk's fastest on the
            # rotary embedding: bench/results/constants.md#the-part-walk), then 8, then 16 with 8 warps
            sizes = (
                [(2048, 4), (1024, 4), (4096, 8)]
                if per_part >= 1 << 20
                else [(min(1024, pow2_at_least(per_part, 16)), 4)]
            )
            return [*(PointwiseKnobs(BLOCK=b, PARTS=count, num_warps=w) for b, w in sizes), *flat]
        axes = self.rows
        if axes is None:
            return flat
        if self.symbolic is not None:  # (the bucket's hint: one choice for every shape of it)
            sym, _, origin = self.symbolic
            dims = tuple(Sizes(origin).hint(d) for d in sym.tensor(sym.outputs[0]).dim)
        rows, cols = dims[axes[0]], dims[axes[1]]
        tiles = [PointwiseKnobs(ROWS=ti, COLS=tj, num_warps=w) for ti, tj, w in row_tiles(rows, cols)]
        # first where a row's last tile masks little off, after the flat walk up to a quarter, else not
        assert tiles[0].COLS is not None
        waste = tail_waste(cols, tiles[0].COLS)
        return [*tiles, *flat] if waste <= ROW_FIRST_TAIL else [*flat, *tiles] if waste <= 0.25 else flat

    def accepts(self, knobs: PointwiseKnobs) -> bool:
        """The flat walk runs every piece; the tiled and part walks, those with their axes."""
        if knobs.PARTS is not None:
            return (
                self.parts is not None
                and knobs.PARTS == self.piece.tensor(self.piece.outputs[0]).dim[self.parts[0]] // self.parts[1]
            )
        if knobs.TILE_I is not None:
            return self.transposed is not None
        if knobs.ROWS is not None:
            return self.rows is not None
        return knobs.BLOCK is not None

    def generate(self, knobs: PointwiseKnobs) -> Generated:
        if knobs.PARTS is not None:
            return self._generate_parts(knobs)
        if self.symbolic is not None and (knobs.BLOCK is not None or (knobs.ROWS is not None and self.rows)):
            piece, views, origin = self.symbolic
            return self._generate_sized(knobs, piece, views, Sizes(origin))
        piece = self.piece
        first = piece.tensor(piece.outputs[0])
        dims = first.dim
        numel = math.prod(dims)
        externals = [*piece.inputs, *piece.outputs]
        # (a program's lanes run past the end by less than a block or tile, at most 2**16: they must not
        # wrap in int32)
        big = offsets_need_int64(piece.tensor(u) for u in externals) or numel + 2**16 > INT32_LIMIT
        order = stride_order(first.stride)
        params, args = external_params(piece, externals)
        walks = (
            (knobs.TILE_I, knobs.TILE_J, self.transposed, "TILE_I/TILE_J", "a transposed tensor (transposed_axes)"),
            (knobs.ROWS, knobs.COLS, self.rows, "ROWS/COLS", "per-element coordinates on rows (row_axes)"),
        )
        for ti, tj, axes, names, what in walks:
            if ti is None or tj is None:
                continue
            if axes is None:
                raise AttributeValueError(
                    f"{names} configs are for pieces with {what}",
                    rule="triton.pointwise.knob",
                    hint="take configs from engine_configs()",
                )
            indexer = TileIndexer(dims, *axes, order, big, ti, tj)
            body = [*indexer.coordinate_lines(), *_emit(piece, indexer, self.views).lines]
            source = module_source(f"def kernel({', '.join(params)}):\n{indent(body)}\n")
            launch = Launch("kernel", (indexer.grid(),), tuple(args), (("num_warps", knobs.warps),))
            return Generated(source, (launch,))
        flat = FlatIndexer(dims, order)
        lines = _emit(piece, flat, self.views).lines if self.chains is None else _copies(flat, piece, self.chains)
        body = [
            f"lin = {program_id(0, big)} * BLOCK + tl.arange(0, BLOCK)",
            f"mask = lin < {numel}",
            *flat.coordinate_lines(),
            *lines,
        ]
        source = module_source(f"def kernel({', '.join([*params, 'BLOCK: tl.constexpr'])}):\n{indent(body)}\n")
        block = knobs.BLOCK
        assert block is not None
        launch = Launch("kernel", (-(-numel // block),), tuple(args), (("BLOCK", block), ("num_warps", knobs.warps)))
        return Generated(source, (launch,))

    def _generate_parts(self, knobs: PointwiseKnobs) -> Generated:
        """The part walk: the flat walk over the space with the concatenated axis cut to W (`parts`, `lin` its
        index); the body once a part (PartIndexer: its addresses the first part's plus a
        constant, its coordinate range known to its concatenations), the parts' loads first, each address
        once."""
        if not self.accepts(knobs):
            raise AttributeValueError(
                f"PARTS={knobs.PARTS} does not fit this piece: the part walk is for concatenations along the "
                "first output's innermost axis at bounds that are multiples of a width (its parts: "
                f"{'none' if self.parts is None else self.parts})",
                rule="triton.pointwise.knob",
                hint="take configs from engine_configs()",
            )
        assert self.parts is not None and knobs.BLOCK is not None
        piece = self.piece
        first = piece.tensor(piece.outputs[0])
        dims, order = first.dim, stride_order(first.stride)
        axis, width = self.parts
        size = dims[axis]
        count = size // width
        reduced = math.prod(dims) // count
        externals = [*piece.inputs, *piece.outputs]
        big = offsets_need_int64(piece.tensor(u) for u in externals) or math.prod(dims) + 2**16 > INT32_LIMIT
        # (the flat walk over the reduced space, its own index: the coordinates' divisions of it are what the
        # compiler sees through; re-dividing the first part's index of the whole space, (lin // W) * D + lin % W,
        # it saw no runs and loaded per element: ld.global of one element 64 times a thread, ptxas sm_90a)
        flat = FlatIndexer(tuple(width if a == axis else d for a, d in enumerate(dims)), order)
        loads: dict[tuple[str, str, int], str] = {}
        parts = [PartIndexer(flat, axis, p * width, width, loads) for p in range(count)]
        lines = [line for part in parts for line in _emit(piece, part, self.views).lines]
        body = [
            f"lin = {program_id(0, big)} * BLOCK + tl.arange(0, BLOCK)",
            f"mask = lin < {reduced}",
            *flat.coordinate_lines(),
            *(line for part in parts for line in part.hoisted),
            *lines,
        ]
        params, args = external_params(piece, externals)
        source = module_source(f"def kernel({', '.join([*params, 'BLOCK: tl.constexpr'])}):\n{indent(body)}\n")
        launch = Launch(
            "kernel", (-(-reduced // knobs.BLOCK),), tuple(args), (("BLOCK", knobs.BLOCK), ("num_warps", knobs.warps))
        )
        return Generated(source, (launch,))

    def _generate_sized(self, knobs: PointwiseKnobs, piece: Piece, views: dict[int, Any], sizes: Sizes) -> Generated:
        """The flat walk (or the row walk, knobs ROWS / COLS) over the symbolic space of `piece`
        (symbolic_piece), its sizes run-time arguments (sizes.py): the same source for every shape of the
        bucket; the grid and the size values are the shape's."""
        tensors = piece.graph.tensors
        first = tensors[piece.outputs[0]]
        externals = [*piece.inputs, *piece.outputs]
        big = sizes.needs_int64((tensors[u] for u in externals), lanes=2**16)
        if knobs.ROWS is not None:
            return self._generate_sized_rows(knobs, piece, views, sizes, big)
        flat = FlatIndexer(first.dim, stride_order(first.stride), sizes.text)
        mask = f"mask = lin < {sizes.text(math.prod(first.dim))}"
        chains = self.symbolic_chains
        lines = _emit(piece, flat, views, None, sizes.text).lines if chains is None else _copies(flat, piece, chains)
        body = [f"lin = {program_id(0, big)} * BLOCK + tl.arange(0, BLOCK)", mask, *flat.coordinate_lines(), *lines]
        block = knobs.BLOCK
        assert block is not None
        programs, grid = sizes.grid(math.prod(first.dim), block)
        meta = (("BLOCK", block), ("num_warps", knobs.warps))
        return _sized_kernel(piece, sizes, body, meta, programs, grid, ("BLOCK: tl.constexpr",))

    def _generate_sized_rows(
        self, knobs: PointwiseKnobs, piece: Piece, views: dict[int, Any], sizes: Sizes, big: bool
    ) -> Generated:
        """The row walk over the symbolic space: ROWS x COLS tiles of its two innermost axes (`rows`), the
        row count and the outer axes run-time sizes, the columns literal."""
        assert self.rows is not None and knobs.ROWS is not None and knobs.COLS is not None
        first = piece.tensor(piece.outputs[0])
        order = stride_order(first.stride)
        indexer = TileIndexer(first.dim, *self.rows, order, big, knobs.ROWS, knobs.COLS, sizes.text)
        lines = _emit(piece, indexer, views, None, sizes.text).lines
        body = [*indexer.coordinate_lines(), *lines]
        grid = indexer.grid()
        return _sized_kernel(piece, sizes, body, (("num_warps", knobs.warps),), evaluate(grid, sizes.env), grid)


def _sized_kernel(
    piece: Piece,
    sizes: Sizes,
    body: list[str],
    meta: tuple[tuple[str, Any], ...],
    programs: int,
    grid: Any,
    constexprs: tuple[str, ...] = (),
) -> Generated:
    """A bucket kernel's module and launch: the piece's buffers, then the run-time sizes its body spelled
    (asked after the body is made), then `constexprs`; the grid's value at the bucket's hint and its
    expression of the dims."""
    params, args = external_params(piece, [*piece.inputs, *piece.outputs])
    params = [*params, *sizes.params, *constexprs]
    source = module_source(sizes.declaration(), f"def kernel({', '.join(params)}):\n{indent(body)}\n")
    return Generated(source, (Launch("kernel", (programs,), (*args, *sizes.args()), meta, grid_expr=(grid,)),))


def _copies(flat: FlatIndexer, piece: Piece, chains: Mapping[int, tuple[Any, ...]]) -> list[str]:
    """The stores of each output of a view copy, read from its source at the coordinates its views
    map it to (_view_copy.py; sizes spelled by `flat.text`)."""
    dims = flat.dims
    flat.needed.update(a for a, d in enumerate(dims) if above_one(d))
    coords = [f"c{a}" if above_one(d) else "0" for a, d in enumerate(dims)]
    lines = []
    for u, chain in chains.items():
        steps, offset = source_offset(chain, coords, piece.graph.tensors, f"rank{u}", flat.text)
        lines += steps
        source = chain[0].input_uids()[0]
        # one element (offset 0, or every output axis of size 1: a scalar offset, whatever the slices and
        # strides; fuzz seed 20261211002334): a scalar load, broadcast by the store
        if offset == "0":
            value = f"tl.load(p{source})"
        elif not any(above_one(d) for d in dims):
            value = f"tl.load(p{source} + {offset})"
        else:
            value = f"tl.load(p{source} + {offset}, mask=mask)"
        # a view whose output is declared another type converts, as the reference rounds it (the moved
        # values are storage: a BFLOAT16's bits are an integer, which a store would convert as a number)
        held = piece.tensor(source).data_type
        for node in chain:
            declared = piece.tensor(node.output_uids()[0]).data_type
            if declared != held:
                compute = node_compute_type(node, piece.graph.tensors)
                value = to_storage(from_storage(value, held, compute), declared, compute)
                held = declared
        lines.append(flat.store(piece.tensor(u), f"p{u}", value))
    return lines


TEMPLATE = PointwiseTemplate()
