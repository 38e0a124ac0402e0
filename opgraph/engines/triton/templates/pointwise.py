"""Elementwise pieces: any DAG of pointwise ops with broadcasting, mixed types and several outputs,
as one kernel over the outputs' iteration space.

The space is walked in the memory order of the first output, one flat index `lin` per element. A
tensor laid out like that output (same dims, packed, same axis order) is addressed by `lin` itself,
which Triton vectorises; any other tensor (broadcast, transposed, gapped) by the coordinates
it needs, each `(lin // inner) % dim` with constants folded in. Where a tensor of the space is
contiguous along another axis than the first output (a cast of a transposed weight), the flat walk
would read it with a stride: the template then walks 2-D tiles of the two contiguous axes instead
(TileIndexer, knobs TILE_I / TILE_J), each tensor loaded or stored along its own contiguous axis.
"""

from __future__ import annotations

import math
from typing import Any

from ....core.config import Support
from ....core.device import Device
from ....core.piece import Piece
from ....core.tensor import TensorDesc, packed_strides, stride_order
from ..expr import Emitter, compute_type, elementwise, fused_custom, piece_types
from ..gemm import VIEW_KINDS, memory_views
from .base import Generated, Launch, Template, external_params, indent, module_source, pow2_at_least, program_id, unique

INT32_LIMIT = 2**31 - 1


def _coordinate_offset(desc: TensorDesc, needed: set[int]) -> str:
    """Element offset of `desc` from the coordinates c<axis> of its non-broadcast axes (noted in
    `needed`, for the lines that compute them)."""
    terms = []
    for axis, (d, s) in enumerate(zip(desc.dim, desc.stride)):
        if d > 1 and s != 0:
            needed.add(axis)
            terms.append(f"c{axis}" if s == 1 else f"c{axis} * {s}")
    return " + ".join(terms) or "0"


def _with_views(piece: Piece, views: dict[int, Any]) -> dict[int, TensorDesc]:
    """The piece's tensors, its slices/transposes as the views of memory they read."""
    return {**piece.graph.tensors, **{u: v.desc for u, v in views.items()}}


class FlatIndexer:
    """Loads and stores at flat index `lin` of an iteration space, in a given axis order."""

    def __init__(self, dims: tuple[int, ...], order: tuple[int, ...]) -> None:
        self.dims = dims
        self.order = order
        self.packed = packed_strides(dims, order)
        self.needed: set[int] = set()

    def offset(self, desc: TensorDesc) -> str:
        if desc.dim == self.dims and all(
            d == 1 or s == p for d, s, p in zip(desc.dim, desc.stride, self.packed)
        ):
            return "lin"
        return _coordinate_offset(desc, self.needed)

    def load(self, desc: TensorDesc, ptr: str) -> str:
        offset = "0" if desc.numel == 1 else self.offset(desc)
        if offset == "0":  # one element, or every axis broadcast in memory (stride 0): a scalar load
            return f"tl.load({ptr})"
        return f"tl.load({ptr} + {offset}, mask=mask, other=0)"

    def store(self, desc: TensorDesc, ptr: str, value: str) -> str:
        return f"tl.store({ptr} + {self.offset(desc)}, {value}, mask=mask)"

    def coord(self, axis: int, desc: TensorDesc) -> str:
        if desc.dim[axis] == 1:
            return "tl.zeros_like(lin)"
        self.needed.add(axis)
        return f"c{axis}"

    def coordinate_lines(self) -> list[str]:
        lines = []
        for axis in sorted(self.needed):
            inner = self.packed[axis]
            outermost = axis == self.order[0]
            expr = "lin" if inner == 1 else f"(lin // {inner})"
            if not outermost:
                expr = f"{expr} % {self.dims[axis]}"
            lines.append(f"c{axis} = {expr}")
        return lines


class TileIndexer:
    """Loads and stores over [TILE_I, TILE_J] tiles of two axes: j the first output's innermost, i
    the innermost of a transposed tensor (a cast of a weight's transpose), so that both tensors are
    read or written along their contiguous axis (Triton converts the tile's layout between the two
    through shared memory); one program per tile and coordinate of the other axes."""

    def __init__(self, dims: tuple[int, ...], i: int, j: int, order: tuple[int, ...], big: bool) -> None:
        self.dims, self.i, self.j, self.big = dims, i, j, big
        self.outer = tuple(a for a in order if a not in (i, j) and dims[a] > 1)
        self.needed: set[int] = set()

    def offset(self, desc: TensorDesc) -> str:
        return _coordinate_offset(desc, self.needed)

    def load(self, desc: TensorDesc, ptr: str) -> str:
        offset = "0" if desc.numel == 1 else self.offset(desc)
        if offset == "0":
            return f"tl.load({ptr})"
        if not any(desc.dim[a] > 1 and desc.stride[a] != 0 for a in (self.i, self.j)):
            return f"tl.load({ptr} + {offset})"  # per program: the other axes are in range
        return f"tl.load({ptr} + {offset}, mask=mask, other=0)"

    def store(self, desc: TensorDesc, ptr: str, value: str) -> str:
        return f"tl.store({ptr} + {self.offset(desc)}, {value}, mask=mask)"

    def coord(self, axis: int, desc: TensorDesc) -> str:
        if desc.dim[axis] == 1:
            return "0"
        self.needed.add(axis)
        return f"c{axis}"

    def grid(self, ti: int, tj: int) -> int:
        return -(-self.dims[self.i] // ti) * -(-self.dims[self.j] // tj) * math.prod(self.dims[a] for a in self.outer)

    def coordinate_lines(self, ti: int, tj: int) -> list[str]:
        i, j, dims = self.i, self.j, self.dims
        nj = -(-dims[j] // tj)
        ni = -(-dims[i] // ti)
        lines = [f"pid = {program_id(0, self.big)}", f"pid_j = pid % {nj}", f"pid_i = (pid // {nj}) % {ni}",
                 f"pid_o = pid // {nj * ni}",
                 f"c{i} = pid_i * {ti} + tl.arange(0, {ti})[:, None]",
                 f"c{j} = pid_j * {tj} + tl.arange(0, {tj})[None, :]",
                 f"mask = (c{i} < {dims[i]}) & (c{j} < {dims[j]})"]
        inner = 1
        for axis in reversed(self.outer):
            expr = "pid_o" if inner == 1 else f"(pid_o // {inner})"
            lines.append(f"c{axis} = {expr} % {dims[axis]}")
            inner *= dims[axis]
        return lines


def transposed_axes(piece: Piece) -> tuple[int, int] | None:
    """(i, j) where a large tensor of the piece's space is contiguous along axis i and the first
    output along axis j != i: the flat walk would read (or write) it with a stride; None otherwise."""
    first = piece.tensor(piece.outputs[0])
    space = first.dim
    if math.prod(space) < 1 << 12:
        return None

    def innermost(desc: TensorDesc) -> int | None:
        axes = [a for a in stride_order(desc.stride) if desc.dim[a] > 1]
        return axes[-1] if axes and desc.stride[axes[-1]] == 1 else None

    j = innermost(first)
    if j is None:
        return None
    found = memory_views(piece)
    views = found if isinstance(found, dict) else {}
    tensors = _with_views(piece, views)
    for u in (*piece.inputs, *views):
        desc = tensors[u]
        if desc.is_pass_by_value or desc.dim != space:
            continue
        i = innermost(desc)
        if i is not None and i != j and desc.stride[j] >= 8:
            return i, j
    return None


def _extent(desc: TensorDesc) -> int:
    return 1 + sum((d - 1) * s for d, s in zip(desc.dim, desc.stride))


def _first_dims(acc: dict, node: Any, tensors: Any) -> dict:
    """Fold step: {dims: (first node, its output uid)} over the outputs of non-view nodes."""
    if node.kind in VIEW_KINDS:
        return acc
    new = {tensors[u].dim: (node, u) for u in node.output_uids() if tensors[u].dim not in acc}
    return {**acc, **{d: v for d, v in new.items() if d not in acc}} if new else acc


class PointwiseTemplate(Template):
    name = "pointwise"
    main_kinds = ("pointwise", "custom", "slice", "transpose")

    def match(self, piece: Piece, device: Device) -> Support:
        # linear in a piece grown op by op: kind checks on the piece's kind set, per-op facts folded
        kinds = piece.kind_set
        views = memory_views(piece) if kinds & set(VIEW_KINDS) else {}
        if isinstance(views, Support):
            return views
        if not kinds <= {"pointwise", *VIEW_KINDS}:
            for node in piece.nodes:
                if node.kind not in VIEW_KINDS and not elementwise(node):
                    why = fused_custom(node) if node.kind == "custom" else f"not {node.kind}"
                    return Support.no(f"the pointwise template runs pointwise ops (and reads slices/transposes "
                                      f"of tensors in memory) only, {why}", node)
        copied = [u for u in piece.outputs if u in views]
        if copied:
            # (a copy step here would be the partitioner's to take: it then cuts GEMM operands'
            # reshapes into copies of their own where the GEMM reads them in place)
            return Support.no(f"{piece.tensor(copied[0]).label()} is a slice/transpose the piece would write "
                              "out; this template reads views in place but does not copy them")
        dims = {piece.tensor(u).dim for u in piece.outputs}
        if len(dims) != 1:
            return Support.no(f"its outputs have different dims {sorted(dims)}; one kernel walks one space")
        (space,) = dims
        # the first op writing each distinct dims (views are read where a pointwise op reads them,
        # broadcast by that op's rule)
        tensors = piece.graph.tensors
        firsts = piece.fold("pointwise.dims", lambda acc, n: _first_dims(acc, n, tensors), {})
        for d, (node, u) in firsts.items():
            if len(d) != len(space) or any(a != b and a != 1 for a, b in zip(d, space)):
                return Support.no(f"{piece.tensor(u).label()} dims {list(d)} do not broadcast to the "
                                  f"piece's space {list(space)}", node)
        return Support.yes()

    def candidates(self, piece: Piece, device: Device) -> list[dict[str, Any]]:
        numel = math.prod(piece.tensor(piece.outputs[0]).dim)
        if transposed_axes(piece) is not None:
            return [{"TILE_I": 64, "TILE_J": 64, "num_warps": 4}, {"TILE_I": 32, "TILE_J": 128, "num_warps": 4},
                    {"BLOCK": 2048, "num_warps": 8}]
        if numel >= 1 << 22:
            ranked = [(2048, 8), (4096, 8), (1024, 4), (2048, 4)]
        else:
            b = min(1024, pow2_at_least(numel, 16))
            ranked = [(b, 4), (min(2048, pow2_at_least(numel, 16)), 8)]
        return unique([{"BLOCK": block, "num_warps": warps} for block, warps in ranked])

    def generate(self, piece: Piece, knobs: dict[str, Any], device: Device) -> Generated:
        first = piece.tensor(piece.outputs[0])
        dims = first.dim
        numel = math.prod(dims)
        externals = [*piece.inputs, *piece.outputs]
        big = any(_extent(piece.tensor(u)) > INT32_LIMIT for u in externals) or numel > INT32_LIMIT
        axes = transposed_axes(piece) if "TILE_I" in knobs else None
        if "TILE_I" in knobs and axes is None:
            raise ValueError("TILE_I/TILE_J configs are for pieces with a transposed tensor (transposed_axes)")
        indexer: FlatIndexer | TileIndexer = (FlatIndexer(dims, stride_order(first.stride)) if axes is None else
                                              TileIndexer(dims, *axes, stride_order(first.stride), big))
        types = piece_types(piece)
        views = memory_views(piece)
        assert not isinstance(views, Support), views.reason

        def ptr(u: int) -> str:  # a view reads its source's buffer, from its offset
            if u not in views:
                return f"p{u}"
            v = views[u]
            return f"(p{v.base} + {v.offset})" if v.offset else f"p{v.base}"

        tensors = _with_views(piece, views)
        emitter = Emitter(tensors, compute_type(types), indexer, ptr=ptr, scalar=lambda u: f"s{u}")
        for node in piece.nodes:
            if node.kind not in VIEW_KINDS:
                emitter.emit(node)
        for u in piece.outputs:
            emitter.store(u)
        params, args = external_params(piece, externals)
        if isinstance(indexer, TileIndexer):
            ti, tj = int(knobs["TILE_I"]), int(knobs["TILE_J"])
            body = [*indexer.coordinate_lines(ti, tj), *emitter.lines]
            source = module_source(f"def kernel({', '.join(params)}):\n{indent(body)}\n")
            launch = Launch("kernel", (indexer.grid(ti, tj),), tuple(args), (("num_warps", int(knobs["num_warps"])),))
            return Generated(source, (launch,))
        body = [
            f"lin = {program_id(0, big)} * BLOCK + tl.arange(0, BLOCK)",
            f"mask = lin < {numel}",
            *indexer.coordinate_lines(),
            *emitter.lines,
        ]
        source = module_source(
            f"def kernel({', '.join([*params, 'BLOCK: tl.constexpr'])}):\n{indent(body)}\n"
        )
        block = int(knobs["BLOCK"])
        launch = Launch("kernel", (-(-numel // block),), tuple(args),
                        (("BLOCK", block), ("num_warps", int(knobs["num_warps"]))))
        return Generated(source, (launch,))


TEMPLATE = PointwiseTemplate()
