"""Shared machinery of the GEMM-class templates: conv_fprop (implicit GEMM), depthwise conv and
matmul use it; conv_dgrad / conv_wgrad are meant to build on the same pieces.

What a GEMM-class piece is (`analyze`): one *main op* plus

* a **prologue** per operand: pointwise ops, and slice/transpose views of tensors in memory, that
  compute the operand. They run on every tile as it is loaded, and a padded (out-of-image) position
  is zeroed *after* them, as the unfused graph would have it;
* an **epilogue**: pointwise ops on the main op's result and on tensors broadcast to it (bias,
  residual in any layout, activations, casts, masks), any number of them stored;
* optionally **reductions** at the very end: genstats, or `reduction` along the tile's rows or
  columns (the per-channel statistics of a conv, the channel reduction of a conv, a row reduction of
  a matmul).

Generated kernels give each program one output tile, BLOCK_M rows x BLOCK_N columns of the
*output space* (`OutputSpace`): the main op's output with some logical axes flattened into the
rows, one axis along the columns (optionally split into independent groups: grouped conv) and some
fixed per program (matmul batch). Everything after the main loop (epilogue, stores, reductions,
split-K, the combine launches) is derived from the space alone, so a new main op brings only its
main loop: a function that leaves the accumulator `acc` of the tile.

Names in generated code (a template's main loop may rely on them):
    pid_m, pid_n   the tile's position (group-M swizzled); pb the per-program batch/group index,
                   g its group part and bb its batch part; ks the split-K slice
    rm, rn         row and column indices of the tile ([BLOCK_M], [BLOCK_N]); rmask / cmask their
                   bounds (absent when the sizes divide the blocks); col = the global column
                   (g * N + rn)
    y{axis}        the coordinate of output axis `axis` (a row vector, `col`, or a scalar)
    acc            the accumulator; v{uid} the value of tensor uid (expr.py's convention)
A tile's tensors are addressed by a `TileIndexer`: each logical axis of a tensor is a row, a column
or a per-program coordinate, so broadcast operands (per-channel bias: a [1, BLOCK_N] load), any
layout (NCHW or NHWC residuals, column-major or gapped matmul operands) and views come out of the
strides alone.

Operand tiles are pointer loads with masks, written in one place (`TileIndexer.load_tile`); the
matmul template swaps in device-side tensor descriptors (TMA) there when the operand allows.

Knobs every tile template understands: BLOCK_M, BLOCK_N (BLOCK_K for the GEMMs), GROUP_M (group-M
swizzle of the tile order, for L2 reuse), SPLIT_K (the main loop split over programs; fp32/int32
partial accumulators in scratch, summed in fixed order by a second kernel that runs the epilogue on
its own finer tiles, ~2 programs per SM (`epilogue_tiling`; EPI_M / EPI_N set them): deterministic), PERSISTENT (0: one tile per program; P: P programs loop over the tiles),
EPILOGUE_SUBTILE (2: the epilogue runs on column halves, for heavy epilogues on 128x256 tiles),
num_warps, num_stages, fp32_precision ("tf32" | "ieee", fp32 operands only).

Reductions write one fp32 partial per program and kept position to scratch; a combine launch
(`ReductionPlan.combine_source`: a program per block of positions and output array, all slots each)
reduces them in fixed order: deterministic, no atomics. When one program covers all partials of a
position (e.g. N <= BLOCK_N for a row sum) it writes the result. A program that visits several row
tiles (the depthwise row strips) folds its partials in registers and stores once
(`epilogue(..., accumulate=)`, `ReductionPlan.init_lines` / `store_lines`).

Adding a main op (conv_dgrad, conv_wgrad): subclass `TileTemplate`, give `main_kinds`, `space`
(how its output maps onto tiles), `check`, `dot`, `iterations`, `candidates` (`gemm_candidates`
ranks tile shapes with the `estimate_us` cost model) and `mainloop` (build `TileIndexer`s for the
operand tiles, get them from `operand_tile`, which also runs their prologues, and accumulate into
`acc`); `setup`/`prelude` add per-program and module-level code (tensor descriptors). `notes()`
and `estimate()` give a config's numerical notes and estimated time for the engine to report.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from ....device import Device
from ....dtypes import DataType
from ....errors import AttributeValueError
from ....ir import Node
from ....ops.layout import Slice, Transpose
from ....ops.reduction import GenStats, Reduction, ReductionMode, reduced_axes
from ....partition import Piece
from ....tensor import TensorDesc
from ...base import NumericalNote, Support
from ..casts import cast_to
from ..expr import TL_DTYPE, Emitter, compute_type, elementwise, from_storage, literal, round_in_compute, to_storage
from .base import Generated, Launch, Params, Template, module_source, pow2_at_least, unique

INT32_LIMIT = 2**31 - 1
SCRATCH_ALIGN = 256
VIEW_KINDS = ("slice", "transpose")
REDUCE_KINDS = ("genstats", "reduction")


# -- the output space ------------------------------------------------------------------------------


@dataclass(frozen=True)
class OutputSpace:
    """How the main op's output maps onto tiles. `rows`: axes flattened into the row index
    (outermost first); `col`: the axis along the columns, split into `groups` independent ranges of
    `n` columns each; `batch`: axes fixed per program (outermost first)."""

    dims: tuple[int, ...]
    rows: tuple[int, ...]
    col: int
    batch: tuple[int, ...] = ()
    groups: int = 1

    @property
    def m(self) -> int:
        return math.prod(self.dims[a] for a in self.rows)

    @property
    def n(self) -> int:
        return self.dims[self.col] // self.groups

    @property
    def nbatch(self) -> int:
        return math.prod(self.dims[a] for a in self.batch)

    def where(self, axis: int) -> str:
        if axis in self.rows:
            return "r"
        if axis == self.col:
            return "c"
        return "s"


# -- recognising a piece ---------------------------------------------------------------------------


@dataclass(frozen=True)
class View:
    """A slice/transpose of a tensor in memory, read in place: `desc` describes the view (its dims,
    and strides into the buffer of `base`) from element `offset` of that buffer."""

    base: int
    offset: int
    desc: TensorDesc


@dataclass(frozen=True)
class Reduce:
    """A reduction at the end of the epilogue. `along` is "rows" when it sums the tile's rows (one
    result per column: genstats of a conv) or "cols" (one result per row: a row reduction);
    `batch_reduced` says whether the per-program axes are reduced too."""

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

    @property
    def out(self) -> int:
        uid = self.main.output_uids()[0]
        return uid

    def tensor(self, uid: int) -> TensorDesc:
        view = self.views.get(uid)
        return view.desc if view is not None else self.piece.tensor(uid)

    def operand(self, role: str) -> TensorDesc:
        uid = self.main.input(role)
        assert isinstance(uid, int)
        return self.tensor(uid)

    def moved_bytes(self) -> int:
        """Bytes the piece reads and writes at least once (its inputs and outputs)."""
        p = self.piece
        return sum(p.tensor(u).nbytes for u in (*p.inputs, *p.outputs) if not p.tensor(u).is_pass_by_value)


def _broadcasts_to(dim: tuple[int, ...], space: tuple[int, ...]) -> bool:
    if math.prod(dim) == 1:
        return True
    return len(dim) == len(space) and all(a == b or a == 1 for a, b in zip(dim, space))


def _view(node: Node, src: TensorDesc, base: int, offset: int, uid: int) -> View | str:
    """The view `node` makes of `src` (itself read from buffer `base` at `offset`), or why not."""
    op = node.op
    if isinstance(op, Slice):
        bounds = op.bounds(None, src.dim)
        offset += sum(start * s for (start, _, _), s in zip(bounds, src.stride))
        dims = tuple(len(range(*b)) for b in bounds)
        strides = tuple(s * step for (_, _, step), s in zip(bounds, src.stride))
    elif isinstance(op, Transpose):
        perm = tuple(op.permutation)
        dims = tuple(src.dim[p] for p in perm)
        strides = tuple(src.stride[p] for p in perm)
    else:
        return f"{node.label()} is not a view"
    return View(base, offset, TensorDesc(uid, "", dims, strides, src.data_type))


def memory_views(piece: Piece) -> dict[int, View] | Support:
    """The piece's slice/transpose nodes as views of tensors in memory (a chain of them composes),
    by output UID; Support.no where one reads a value the piece computes (that needs a copy)."""
    produced = {u for n in piece.nodes for u in n.output_uids()}
    views: dict[int, View] = {}
    for node in piece.nodes:
        if node.kind not in VIEW_KINDS:
            continue
        src, out = node.input_uids()[0], node.output_uids()[0]
        if src in views:
            v = _view(node, views[src].desc, views[src].base, views[src].offset, out)
        elif src in produced:
            return Support.no(f"{node.label()} takes a computed value; a slice/transpose is read in place "
                              "from a tensor in memory only", node)
        else:
            v = _view(node, piece.tensor(src), src, 0, out)
        if isinstance(v, str):
            return Support.no(v, node)
        if piece.tensor(out).data_type is not v.desc.data_type:
            return Support.no(f"{node.label()} changes the data type; a view keeps its source's", node)
        views[out] = v
    return views


def analyze(piece: Piece, main_kinds: Sequence[str], space_of: Callable[[Node], OutputSpace],
            main_label: str) -> tuple[GemmPiece | None, Support]:
    """Split `piece` into prologue / main op / epilogue / reductions, or say why it is not one
    GEMM-class kernel."""
    mains = [n for n in piece.nodes if n.kind in main_kinds]
    if not mains:
        return None, Support.no(f"the piece has no {main_label}")
    if len(mains) > 1:
        return None, Support.no(f"one {main_label} per kernel; this piece has {len(mains)}", mains[1])
    main = mains[0]
    at = piece.nodes.index(main)
    before, after = piece.nodes[:at], piece.nodes[at + 1:]
    producer = {u: n for n in piece.nodes for u in n.output_uids()}
    outputs = set(piece.outputs)
    graph = piece.graph
    members = {id(n) for n in piece.nodes}

    # -- prologue: what each operand is computed from --
    views: dict[int, View] = {}
    prologue: dict[int, tuple[Node, ...]] = {}
    used: set[int] = set()
    for role in main.op.input_roles():
        operand = main.input(role)
        if not isinstance(operand, int):
            continue
        space = piece.tensor(operand).dim
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
                        "a slice/transpose in a GEMM prologue", node)
                chain.append(node)
                stack.append(src)
                continue
            if not elementwise(node):
                return None, Support.no(f"{node.label()} cannot run in the prologue of a {main.kind} "
                                        "(only pointwise ops and slice/transpose views can)", node)
            dim = piece.tensor(node.outputs[0]).dim
            if not _broadcasts_to(dim, space):
                return None, Support.no(f"{node.label()} computes dims {list(dim)}, which do not broadcast "
                                        f"to the {main.kind} operand's {list(space)}", node)
            chain.append(node)
            stack.extend(node.input_uids())
        order = sorted(chain, key=lambda n: piece.nodes.index(n))
        prologue[operand] = tuple(n for n in order if n.kind not in VIEW_KINDS)
        for n in order:
            used.add(id(n))
            if n.kind in VIEW_KINDS:
                src = n.input_uids()[0]
                if src in views:
                    base, off, src_desc = views[src].base, views[src].offset, views[src].desc
                else:
                    base, off, src_desc = src, 0, piece.tensor(src)
                out_uid = n.output_uids()[0]
                view = _view(n, src_desc, base, off, out_uid)
                if isinstance(view, str):
                    return None, Support.no(view, n)
                if piece.tensor(out_uid).data_type is not src_desc.data_type:
                    return None, Support.no(f"{n.label()} changes the data type; a view in a GEMM "
                                            "prologue only moves data", n)
                views[out_uid] = view
    for node in before:
        if id(node) not in used:
            return None, Support.no(f"{node.label()} comes before the {main.kind} but does not compute "
                                    "its operands", node)
        for u in node.output_uids():
            if u in outputs:
                return None, Support.no(
                    f"{node.label()} is in the {main.kind}'s prologue but its result is needed outside "
                    "the kernel; prologue values are recomputed per tile and never stored", node)
            for c in graph.consumers(u):
                if id(c) in members and c is not main and c not in before:
                    return None, Support.no(f"{c.label()} reads a prologue value of the {main.kind}", c)

    # -- epilogue and reductions --
    space = space_of(main)
    epilogue_uids = {main.output_uids()[0]}
    epilogue: list[Node] = []
    reductions: list[Reduce] = []
    stores = [main.output_uids()[0]] if main.output_uids()[0] in outputs else []
    for node in after:
        for u in node.input_uids():
            p = producer.get(u)
            if p is not None and u not in epilogue_uids:
                return None, Support.no(f"{node.label()} reads a value that is not on the {main.kind}'s "
                                        "epilogue path", node)
        if elementwise(node):
            out = node.outputs[0]
            assert out is not None
            dim = piece.tensor(out).dim
            if not _broadcasts_to(dim, space.dims):
                return None, Support.no(f"{node.label()} computes dims {list(dim)}, which do not broadcast to "
                                        f"the {main.kind} output's {list(space.dims)}", node)
            if out in outputs:
                if dim != space.dims:
                    return None, Support.no(f"{node.label()} stores dims {list(dim)}; the epilogue stores "
                                            f"only results of the output's dims {list(space.dims)}", node)
                stores.append(out)
            epilogue.append(node)
            epilogue_uids.add(out)
            continue
        if node.kind in REDUCE_KINDS:
            if node.input_uids()[0] not in epilogue_uids:
                return None, Support.no(f"{node.label()} does not reduce a value of the {main.kind}'s "
                                        "epilogue", node)
            red = _reduction(node, piece, space)
            if isinstance(red, str):
                return None, Support.no(red, node)
            for u in node.output_uids():
                if any(id(c) in members for c in graph.consumers(u)):
                    return None, Support.no(f"an op of the piece reads the result of {node.label()}, which "
                                            "is complete only after the kernel", node)
            reductions.append(red)
            continue
        return None, Support.no(f"{node.label()} cannot follow a {main.kind} in one kernel (the epilogue "
                                "runs pointwise ops, then genstats or a reduction)", node)
    gp = GemmPiece(piece, main, space, prologue, views, tuple(epilogue), tuple(reductions), tuple(stores))
    return gp, Support.yes()


def _reduction(node: Node, piece: Piece, space: OutputSpace) -> Reduce | str:
    src = node.input_uids()[0]
    x = piece.tensor(src)
    if x.dim != space.dims:
        return f"{node.label()} reduces dims {list(x.dim)}, not the output's {list(space.dims)}"
    if isinstance(node.op, GenStats):
        axes = {a for a in range(len(x.dim)) if a != 1 and x.dim[a] > 1}
    else:
        assert isinstance(node.op, Reduction)
        if node.op.mode in (ReductionMode.MUL, ReductionMode.MUL_NO_ZEROS):
            return f"{node.label()}: product reductions are not fused into GEMM epilogues"
        out = piece.tensor(node.outputs[0])  # type: ignore[arg-type]
        axes = set(reduced_axes(x.dim, out.dim))
    rows = {a for a in space.rows if space.dims[a] > 1}
    cols = {space.col} if space.dims[space.col] > 1 else set()
    batch = {a for a in space.batch if space.dims[a] > 1}
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
    return (f"{node.label()} reduces axes {sorted(axes)}; a GEMM epilogue reduces all of the tile's row "
            f"axes {sorted(rows)} or its column axis {sorted(cols)} (plus, optionally, the batch axes)")


# -- data types of the product ---------------------------------------------------------------------


@dataclass(frozen=True)
class DotKind:
    """How tl.dot multiplies: the operand type tiles are converted to, the accumulator type and
    the input precision of fp32 operands."""

    operand: str  # a tl dtype
    acc: str
    precision: str | None = None
    notes: frozenset[NumericalNote] = frozenset()

    @property
    def is_int(self) -> bool:
        return self.acc == "tl.int32"

    def call(self, a: str, b: str, acc: str) -> str:
        if self.is_int:
            return f"tl.dot({a}, {b}, {acc}, out_dtype=tl.int32)"
        if self.precision is not None:
            return f"tl.dot({a}, {b}, {acc}, input_precision=\"{self.precision}\")"
        return f"tl.dot({a}, {b}, {acc})"


_FP8 = (DataType.FP8_E4M3, DataType.FP8_E5M2)


def dot_kind(a: DataType, b: DataType, *, interpret: bool, fp32_precision: str = "tf32") -> DotKind | str:
    """The product of operand types `a` and `b`, or why the template cannot multiply them.

    fp16 x fp16 and bf16 x bf16 run on tensor cores as they are (bf16 upcast to fp32 under the
    interpreter, whose bf16 arithmetic is wrong); fp8 is widened to fp16 exactly; mixed 16-bit
    types run as tf32, which holds fp16 and bf16 values exactly; any fp32 operand runs as tf32
    (a numerical note) unless fp32_precision="ieee"; int8 x int8 accumulates in int32."""
    ints = (a.is_integer, b.is_integer)
    if any(ints):
        if a is DataType.INT8 and b is DataType.INT8:
            return DotKind("tl.int8", "tl.int32")
        return f"integer GEMM operands must both be INT8 (got {a.name} x {b.name})"
    if DataType.DOUBLE in (a, b):
        return "DOUBLE GEMM operands are not supported by the Triton templates"
    narrow = {a if a not in _FP8 else DataType.HALF, b if b not in _FP8 else DataType.HALF}
    if narrow == {DataType.HALF}:
        return DotKind("tl.float16", "tl.float32")
    if DataType.FLOAT not in narrow:
        if narrow == {DataType.BFLOAT16} and not interpret:
            return DotKind("tl.bfloat16", "tl.float32")
        # fp16/bf16 mixes (and bf16 in the interpreter): exact in tf32 on the GPU
        return DotKind("tl.float32", "tl.float32", "ieee" if interpret else "tf32")
    if fp32_precision not in ("tf32", "ieee"):
        raise AttributeValueError(
            f"fp32_precision={fp32_precision!r} is not 'tf32' or 'ieee'", rule="triton.gemm.fp32_precision",
            hint="use 'tf32' (tensor cores, 10-bit mantissa inputs) or 'ieee' (full fp32)",
        )
    if fp32_precision == "ieee" or interpret:
        return DotKind("tl.float32", "tl.float32", "ieee")
    return DotKind("tl.float32", "tl.float32", "tf32", frozenset({NumericalNote.DOWN_CONVERT_INPUTS}))


def uses_fp32(a: DataType, b: DataType) -> bool:
    return DataType.FLOAT in (a, b)


def fp32_knobs(a: DataType, b: DataType) -> dict[str, Any]:
    """What every config of operand types `a` x `b` carries: fp32 operands multiply as tf32 unless
    fp32_precision="ieee" (`finish_candidates` adds that alternative)."""
    return {"fp32_precision": "tf32"} if uses_fp32(a, b) else {}


def stencil_support(gp: GemmPiece, roles: tuple[str, str], ints: str, doubles: str) -> Support:
    """Whether a stencil main loop (products without tl.dot, accumulated in fp32, or int32 for int8)
    multiplies the operands of `roles`: integers only as INT8 x INT8 (else Support.no(`ints`)), and
    no DOUBLE (else Support.no(`doubles`))."""
    a, b = (gp.operand(role).data_type for role in roles)
    if (a.is_integer or b.is_integer) and (a is not DataType.INT8 or b is not DataType.INT8):
        return Support.no(ints, gp.main)
    if DataType.DOUBLE in (a, b):
        return Support.no(doubles, gp.main)
    return Support.yes()


def stencil_dot(a: DataType) -> DotKind:
    """A stencil's products (no tl.dot) of operands of type `a` (see `stencil_support`)."""
    return DotKind("tl.int32", "tl.int32") if a.is_integer else DotKind("tl.float32", "tl.float32")


def operand_bytes(a: DataType, b: DataType) -> int:
    """Bytes per element of the tiles tl.dot multiplies (fp8 is widened to fp16, mixed 16-bit types
    and fp32 run as 32-bit): what shared memory holds per stage."""
    if a is DataType.INT8 and b is DataType.INT8:
        return 1
    narrow = {DataType.HALF if t in _FP8 else t for t in (a, b)}
    return 2 if narrow in ({DataType.HALF}, {DataType.BFLOAT16}) else 4


# -- kernel signatures and scratch -----------------------------------------------------------------


# a kernel's parameters and the launch arguments that fill them (templates/base.py)
Signature = Params


class Scratch:
    """Offsets of a step's private scratch buffers (partials), each aligned for vector loads."""

    def __init__(self) -> None:
        self.size = 0

    def alloc(self, nbytes: int) -> int:
        offset = self.size
        self.size += -(-max(nbytes, 4) // SCRATCH_ALIGN) * SCRATCH_ALIGN
        return offset


# -- addressing tiles --------------------------------------------------------------------------------


class TileIndexer:
    """Addresses tensors over a 2-D tile (expr.py's Indexer protocol).

    `axes[a]` says what logical axis `a` is in the tile: ("r", expr) a row coordinate (a
    [rows] vector), ("c", expr) a column coordinate, ("s", expr) a per-program scalar. `rmask` /
    `cmask` bound the rows / columns (None: all in bounds). `flat_rows` = (expr, ((axis, size), ...)):
    the row axes flattened, outermost first; a tensor packed over them is addressed by the flat index
    (cheaper, and contiguity stays visible to the compiler).

    `select`: a mask (`rmask` or `cmask`) that loads leave out, operand_tile applying it by a select
    on the loaded tile; its axis' coordinates must then stay in bounds (the caller wraps them). A
    conv's ragged channel tail goes this way: Triton 3.6 on Hopper computed wrong sums for the ResNet
    stem (3 channels in a BLOCK_K of 16, split-K) with the channel mask in the loads, and with a tail
    clamped by tl.minimum gave sums that changed from run to run (MobileNetV2's 96-channel 1x1 conv,
    128 x 128 tiles), as reads past the tensor would; wrapped by `%`, both match (tests/engines)."""

    def __init__(self, axes: Sequence[tuple[str, str]], rmask: str | None, cmask: str | None,
                 ptr: Callable[[int], str], shape: tuple[str, str],
                 flat_rows: tuple[str, tuple[tuple[int, int], ...]] | None = None,
                 zero: tuple[str, str] = ("rm", "rn"), select: str | None = None) -> None:
        self.axes = tuple(axes)
        self.zero = zero  # a row and a column vector of the tile (for full-shape pointer blocks)
        self.rmask = rmask
        self.cmask = cmask
        assert select is None or select in (rmask, cmask)
        self.select = select
        self.ptr = ptr
        self.shape = shape
        self.flat_rows = flat_rows

    def _flat(self, desc: TensorDesc) -> str | None:
        if self.flat_rows is None or len(desc.dim) != len(self.axes):
            return None
        expr, axes = self.flat_rows
        step = inner = None
        for axis, size in reversed(axes):
            if desc.dim[axis] != size:
                return None
            if size == 1:
                continue
            if inner is None:
                step, inner = desc.stride[axis], desc.stride[axis] * size
            elif desc.stride[axis] != inner:
                return None
            else:
                inner *= size
        if step is None:
            return None
        return expr if step == 1 else f"{expr} * {step}"

    def parts(self, desc: TensorDesc, full: bool = False) -> tuple[list[str], list[str], list[str]]:
        """Offset terms of `desc` at the tile's coordinates: (row terms, column terms, scalars).
        Broadcast axes (dim 1) drop out; `full` keeps both tile axes (a store's pointer block)."""
        rows: list[str] = []
        cols: list[str] = []
        scal: list[str] = []
        flat = self._flat(desc)
        if flat is not None:
            rows.append(flat)
        for axis, (d, s) in enumerate(zip(desc.dim, desc.stride)):
            where, expr = self.axes[axis]
            if (flat is not None and where == "r") or s == 0 or d == 1:
                continue
            term = expr if s == 1 else f"{expr} * {s}"
            {"r": rows, "c": cols, "s": scal}[where].append(term)
        if full:  # a tile axis of extent "1" (a weight row of the depthwise kernel) stays broadcast
            if self.shape[0] != "1":
                rows = rows or [f"{self.zero[0]} * 0"]
            if self.shape[1] != "1":
                cols = cols or [f"{self.zero[1]} * 0"]
        return rows, cols, scal

    def address(self, desc: TensorDesc, ptr: str, full: bool = False) -> tuple[str, str | None]:
        rows, cols, scal = self.parts(desc, full)
        terms = []
        if rows:
            terms.append(f"({' + '.join(rows)})[:, None]")
        if cols:
            terms.append(f"({' + '.join(cols)})[None, :]")
        terms += scal
        masks = []
        if rows and self.rmask is not None and self.rmask != self.select:
            masks.append(f"{self.rmask}[:, None]")
        if cols and self.cmask is not None and self.cmask != self.select:
            masks.append(f"{self.cmask}[None, :]")
        return f"{ptr} + {' + '.join(terms)}" if terms else ptr, " & ".join(masks) or None

    def selected(self) -> str | None:
        """The `select` mask broadcast over the tile."""
        if self.select is None:
            return None
        return f"{self.select}[:, None]" if self.select == self.rmask else f"{self.select}[None, :]"

    def mask(self) -> str | None:
        masks = []
        if self.rmask is not None:
            masks.append(f"{self.rmask}[:, None]")
        if self.cmask is not None:
            masks.append(f"{self.cmask}[None, :]")
        return " & ".join(masks) or None

    # -- expr.py's Indexer protocol --
    def load(self, desc: TensorDesc, ptr: str) -> str:
        if desc.numel == 1 or not any(d > 1 and s != 0 for d, s in zip(desc.dim, desc.stride)):
            return f"tl.load({ptr})"  # one element, or one broadcast in memory (stride 0): before any loop too
        address, mask = self.address(desc, ptr)
        if mask is None:
            return f"tl.load({address})"
        return f"tl.load({address}, mask={mask}, other=0)"

    def load_tile(self, desc: TensorDesc, ptr: str) -> str:
        """A load of the whole tile (both tile axes, both masks), whatever axes `desc` broadcasts:
        what a GEMM operand needs (a size-1 K axis still gives a [rows, BLOCK_K] block, zero past K)."""
        address, mask = self.address(desc, ptr, full=True)
        if mask is None:
            return f"tl.load({address})"
        return f"tl.load({address}, mask={mask}, other=0)"

    def store(self, desc: TensorDesc, ptr: str, value: str) -> str:
        address, mask = self.address(desc, ptr, full=True)
        if mask is None:
            return f"tl.store({address}, {value})"
        return f"tl.store({address}, {value}, mask={mask})"

    def coord(self, axis: int, desc: TensorDesc) -> str:
        where, expr = self.axes[axis]
        if desc.dim[axis] == 1:
            return "tl.zeros((1, 1), tl.int32)"
        if where == "r":
            return f"({expr})[:, None]"
        if where == "c":
            return f"({expr})[None, :]"
        return f"({expr} + tl.zeros((1, 1), tl.int32))"


# -- the tile grid -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tiling:
    """A grid of output tiles: BLOCK_M x BLOCK_N tiles of `space`, group-M swizzled, times the
    per-program batch/groups, times `split` slices of the reduction (split-K)."""

    space: OutputSpace
    block_m: int
    block_n: int
    group_m: int = 8
    split: int = 1
    big: bool = False  # int64 offsets

    @property
    def npm(self) -> int:
        return -(-self.space.m // self.block_m)

    @property
    def npn(self) -> int:
        return -(-self.space.n // self.block_n)

    @property
    def tiles(self) -> int:
        return self.npm * self.npn

    @property
    def per_split(self) -> int:
        return self.tiles * self.space.nbatch * self.space.groups

    @property
    def rmask(self) -> str | None:
        return None if self.space.m % self.block_m == 0 else "rmask"

    @property
    def cmask(self) -> str | None:
        return None if self.space.n % self.block_n == 0 else "cmask"

    def header(self, *, with_split: bool, pid: str = "tl.program_id(0)") -> list[str]:
        """pid -> ks, pb (g, bb), pid_m, pid_n, rm, rn, masks, col, and the output coordinates y{axis}.
        `pid` is the program's work item (a persistent kernel's loop variable)."""
        sp = self.space
        lines = [f"pid = {pid}"]
        if self.big:
            lines.append("pid = pid.to(tl.int64)")
        if with_split and self.split > 1:
            lines += [f"ks = pid // {self.per_split}", f"pid = pid % {self.per_split}"]
        nprog = sp.nbatch * sp.groups
        if nprog > 1:
            lines += [f"pb = pid // {self.tiles}", f"t = pid % {self.tiles}"]
        else:
            lines += ["pb = 0", "t = pid"]
        lines.append(f"g = pb % {sp.groups}" if sp.groups > 1 else "g = 0")
        lines.append(f"bb = pb // {sp.groups}" if sp.nbatch > 1 else "bb = 0")
        width = min(self.group_m, self.npm)
        if width > 1 and self.npn > 1:
            lines += [
                f"first_m = (t // {width * self.npn}) * {width}",
                f"gsz = tl.minimum({self.npm} - first_m, {width})",
                "pid_m = first_m + (t % gsz)",
                f"pid_n = (t % {width * self.npn}) // gsz",
            ]
        else:
            lines += [f"pid_m = t // {self.npn}", f"pid_n = t % {self.npn}"]
        lines += [
            "rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
            "rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)",
        ]
        if self.rmask:
            lines.append(f"rmask = rm < {sp.m}")
        if self.cmask:
            lines.append(f"cmask = rn < {sp.n}")
        lines.append(f"col = g * {sp.n} + rn" if sp.groups > 1 else "col = rn")
        lines += decompose("rm", [(a, sp.dims[a]) for a in sp.rows], "y")
        lines += decompose("bb", [(a, sp.dims[a]) for a in sp.batch], "y")
        lines.append(f"y{sp.col} = col")
        return lines

    def output_indexer(self, ptr: Callable[[int], str], cols: str = "BLOCK_N") -> TileIndexer:
        sp = self.space
        axes = [(sp.where(a), f"y{a}") for a in range(len(sp.dims))]
        flat = ("rm", tuple((a, sp.dims[a]) for a in sp.rows))
        return TileIndexer(axes, self.rmask, self.cmask, ptr, ("BLOCK_M", cols), flat)


def input_taps(geo: Any, taps: Sequence[int], out_dims: Sequence[int], in_dims: Sequence[int], flip: bool,
               checks: list[str]) -> list[str]:
    """A forward conv's taps t{i} (from `decompose`) at output positions o{i}: lines giving the input
    coordinate xi{i} and the filter tap wt{i} (flipped in CONVOLUTION mode), appending to `checks` the
    bounds tests that padding needs (none where no tap can leave the image)."""
    lines = []
    for i, r in enumerate(taps):
        d = geo.dilation[i]
        lines.append(f"xi{i} = o{i} + t{i} * {d}" if r > 1 and d != 1 else
                     f"xi{i} = o{i} + t{i}" if r > 1 else f"xi{i} = o{i}")
        if geo.pre[i] > 0:
            checks.append(f"(xi{i} >= 0)")
        top = (out_dims[2 + i] - 1) * geo.stride[i] - geo.pre[i] + (r - 1) * d
        if top > in_dims[2 + i] - 1:
            checks.append(f"(xi{i} < {in_dims[2 + i]})")
        lines.append(f"wt{i} = {r - 1} - t{i}" if flip and r > 1 else f"wt{i} = t{i}" if r > 1 else f"wt{i} = 0")
    return lines


def decompose(index: str, axes: Sequence[tuple[int, int]], prefix: str) -> list[str]:
    """Lines giving {prefix}{axis} for a flat `index` over `axes` (outermost first, row-major)."""
    axes = list(axes)
    if not axes:
        return []
    if len(axes) == 1:
        return [f"{prefix}{axes[0][0]} = {index}"]
    lines = []
    rest = index
    for i, (axis, size) in enumerate(reversed(axes)):
        if i == len(axes) - 1:
            lines.append(f"{prefix}{axis} = {rest}")
            break
        lines.append(f"{prefix}{axis} = {rest} % {size}")
        nxt = f"q_{prefix}{axis}"
        lines.append(f"{nxt} = {rest} // {size}")
        rest = nxt
    return lines


# -- generating the whole piece ------------------------------------------------------------------------


@dataclass
class Context:
    """What the code of one generated piece shares: its analysis, tensors (views resolved),
    compute type, tiling, scratch and the reduction plans."""

    gp: GemmPiece
    tiling: Tiling
    compute: str
    dot: DotKind | None
    interpret: bool
    scratch: Scratch = field(default_factory=Scratch)
    tensors: dict[int, TensorDesc] = field(default_factory=dict)
    reductions: list["ReductionPlan"] = field(default_factory=list)
    sm_count: int = 132  # the device's SMs (sizes the combine launches)

    def ptr_of(self, sig: Signature) -> Callable[[int], str]:
        def ptr(uid: int) -> str:
            view = self.gp.views.get(uid)
            if view is None:
                return sig.buf(uid)
            base = sig.buf(view.base)
            return f"({base} + {view.offset})" if view.offset else base
        return ptr


def make_context(gp: GemmPiece, tiling: Tiling, dot: DotKind | None, interpret: bool) -> Context:
    piece = gp.piece
    types = [piece.tensor(u).data_type for n in piece.nodes for u in (*n.input_uids(), *n.output_uids())]
    types += [n.compute_data_type for n in piece.nodes if n is not gp.main]
    tensors = dict(piece.graph.tensors)
    for uid, view in gp.views.items():
        tensors[uid] = view.desc
    ctx = Context(gp, tiling, compute_type(types), dot, interpret, tensors=tensors)
    ctx.reductions = [ReductionPlan.make(r, ctx) for r in gp.reductions]
    return ctx


def needs_int64(gp: GemmPiece, extra: int = 0) -> bool:
    piece = gp.piece
    extents = [extra]
    for u in (*piece.inputs, *piece.outputs):
        t = piece.tensor(u)
        extents.append(1 + sum((d - 1) * s for d, s in zip(t.dim, t.stride)))
    return max(extents) > INT32_LIMIT


def operand_tile(ctx: Context, sig: Signature, role: str, indexer: TileIndexer, name: str,
                 preset: Mapping[int, str] | None = None) -> list[str]:
    """Lines that leave operand `role` of the main op as tile `name`, in the dot's operand type:
    loaded directly, or computed by its prologue and then zeroed where out of bounds (padding).

    `preset` maps tensor uids to names of values already computed before the tile (per-channel
    vectors a loop reads once, outside it). When the prologue's result is declared in the dot's
    16-bit operand type (an fp16 scale+bias+relu feeding an fp16 conv), its rounding is the one cast
    to that type and the padding is zeroed on the 16-bit values: no fp32 round trip."""
    gp = ctx.gp
    uid = gp.main.input(role)
    assert isinstance(uid, int)
    desc = gp.tensor(uid)
    target = ctx.dot.operand if ctx.dot is not None else ctx.compute
    nodes = gp.prologue.get(uid, ())
    if not nodes:
        load = indexer.load_tile(desc, ctx.ptr_of(sig)(uid))
        lines = [f"{name} = {load}" if TL_DTYPE[desc.data_type] == target else
                 f"{name} = {from_storage(load, desc.data_type, target)}"]
        if indexer.select is not None:
            lines.append(f"{name} = tl.where({indexer.selected()}, {name}, 0)")
        return lines
    em = Emitter(ctx.tensors, ctx.compute, indexer, ptr=ctx.ptr_of(sig), scalar=sig.scalar)
    if preset:
        em.values.update(preset)
    for node in nodes:
        em.emit(node)
    value = em.values[uid]
    lines = list(em.lines)
    rounded = round_in_compute(value, desc.data_type, ctx.compute)
    if (desc.data_type in (DataType.HALF, DataType.BFLOAT16) and TL_DTYPE[desc.data_type] == target
            and rounded is not None and lines and lines[-1] == f"{value} = {rounded}"):
        lines.pop()  # rounded once, by the cast to the operand type below
    mask = indexer.mask()
    rows, cols = indexer.shape
    if mask is None:
        lines.append(f"{name} = tl.broadcast_to({value}, ({rows}, {cols}))")
    else:
        lines.append(f"{name} = tl.where({mask}, {value}, 0.0)")
    return lines + [f"{name} = {cast_to(name, target)}"]


def epilogue(ctx: Context, sig: Signature, acc: str, subtile: int = 1,
             preset: Mapping[int, str] | None = None, accumulate: str | None = None) -> list[str]:
    """The accumulator -> the main output's value (rounded to its declared type) -> the epilogue's
    pointwise ops -> stores -> reduction partials (or results, when one program covers them).

    subtile=2 runs it on the two column halves of the tile one after the other (EPILOGUE_SUBTILE):
    a heavy epilogue (erf-based GELU) then holds half as many temporaries next to the accumulator.
    `preset` (whole tiles only) maps tensor uids to values loaded before (`preload_lines`);
    `accumulate` (whole tiles only): the reductions fold their partials into running vectors named
    {accumulate}{uid} instead of storing them (`ReductionPlan.init_lines` / `store_lines`)."""
    if subtile <= 1 or not can_subtile(ctx) or accumulate:
        return _epilogue_tile(ctx, sig, acc, ctx.tiling.output_indexer(ctx.ptr_of(sig)), preset, accumulate)
    t, sp = ctx.tiling, ctx.tiling.space
    half = t.block_n // 2
    lines = [f"{acc}_h0, {acc}_h1 = tl.split(tl.permute(tl.reshape({acc}, (BLOCK_M, 2, {half})), (0, 2, 1)))"]
    for h in range(2):
        lines.append(f"rn = pid_n * BLOCK_N + {h * half} + tl.arange(0, {half})")
        if t.cmask:
            lines.append(f"cmask = rn < {sp.n}")
        lines.append(f"col = g * {sp.n} + rn" if sp.groups > 1 else "col = rn")
        lines.append(f"y{sp.col} = col")
        indexer = t.output_indexer(ctx.ptr_of(sig), cols=str(half))
        lines += _epilogue_tile(ctx, sig, f"{acc}_h{h}", indexer)
    return lines


def preload_lines(ctx: Context, sig: Signature, nodes: Sequence[Node], indexer: TileIndexer,
                  skip: Sequence[int] = ()) -> tuple[list[str], dict[int, str]]:
    """Loads, before a loop, of the tensors that `nodes` read and that are constant along the tile's
    rows (per-channel bias, scale, shift): lines and {uid: value name} for `preset`. A tensor
    qualifies when every axis it does not broadcast is a column axis of `indexer`."""
    lines: list[str] = []
    names: dict[int, str] = {}
    produced = {u for n in nodes for u in n.output_uids()}
    for node in nodes:
        for u in node.input_uids():
            if u in names or u in produced or u in skip:
                continue
            desc = ctx.tensors[u]
            if desc.is_pass_by_value or desc.numel == 1:
                continue
            if any(d > 1 and s != 0 and indexer.axes[a][0] != "c" for a, (d, s) in enumerate(zip(desc.dim, desc.stride))):
                continue
            names[u] = f"pre{u}"
            lines.append(f"pre{u} = {from_storage(indexer.load(desc, ctx.ptr_of(sig)(u)), desc.data_type, ctx.compute)}")
    return lines, names


def can_subtile(ctx: Context) -> bool:
    """Halves work when each is a power of two >= 16 and no reduction runs along the tile's columns
    (its two halves would need adding)."""
    return ctx.tiling.block_n >= 32 and not any(p.red.along == "cols" for p in ctx.reductions)


def _epilogue_tile(ctx: Context, sig: Signature, acc: str, indexer: TileIndexer,
                   preset: Mapping[int, str] | None = None, accumulate: str | None = None) -> list[str]:
    gp = ctx.gp
    em = Emitter(ctx.tensors, ctx.compute, indexer, ptr=ctx.ptr_of(sig), scalar=sig.scalar)
    if preset:
        em.values.update(preset)
    out = gp.out
    out_desc = gp.tensor(out)
    em.assign(out, f"{acc}.to({ctx.compute})")
    for node in gp.epilogue:
        em.emit(node)
    int_acc = ctx.dot is not None and ctx.dot.is_int
    for uid in gp.stores:
        if uid == out and int_acc and out_desc.data_type is DataType.INT32:
            em.lines.append(indexer.store(out_desc, ctx.ptr_of(sig)(uid), acc))  # exact, not via fp32
        else:
            em.store(uid)
    lines = em.lines
    for plan in ctx.reductions:
        if accumulate:
            lines += plan.partial_lines(em.values[plan.red.source], indexer) + plan.accumulate_lines(accumulate)
        else:
            lines += plan.tile_lines(ctx, sig, em.values[plan.red.source], indexer)
    return lines


# -- reductions at the end of the epilogue ---------------------------------------------------------------

# per partial array: (in-tile transform of v, identity, combine)
_PARTIAL = {
    "sum": ("{v}", "0.0", "sum"),
    "sumsq": ("{v} * {v}", "0.0", "sum"),
    "abssum": ("tl.abs({v})", "0.0", "sum"),
    "max": ("{v}", "float('-inf')", "max"),
    "min": ("{v}", "float('inf')", "min"),
    "amax": ("tl.abs({v})", "0.0", "max"),
}
_MODE_PARTIAL = {
    ReductionMode.ADD: "sum", ReductionMode.AVG: "sum", ReductionMode.NORM1: "abssum",
    ReductionMode.NORM2: "sumsq", ReductionMode.MAX: "max", ReductionMode.MIN: "min",
    ReductionMode.AMAX: "amax",
}


@dataclass
class ReductionPlan:
    """One reduction's partials: `slots` partial results per kept position, `length` kept
    positions, one fp32 array per output. With one slot the main kernel writes the results."""

    red: Reduce
    slots: int
    length: int
    arrays: list[tuple[int, str, str, int]]  # (output uid, partial kind, finalize, scratch offset)

    @staticmethod
    def make(red: Reduce, ctx: Context) -> ReductionPlan:
        sp, t = ctx.tiling.space, ctx.tiling
        nb_red = sp.nbatch if red.batch_reduced else 1
        nb_keep = 1 if red.batch_reduced else sp.nbatch
        if red.along == "rows":
            slots, length = nb_red * t.npm, nb_keep * sp.dims[sp.col]
        else:
            slots, length = nb_red * sp.groups * t.npn, nb_keep * sp.m
        node = red.node
        outs: list[tuple[int, str, str]] = []
        if isinstance(node.op, GenStats):
            for uid, kind in zip(node.outputs, ("sum", "sumsq")):
                if uid is not None:
                    outs.append((uid, kind, ""))
        else:
            assert isinstance(node.op, Reduction)
            mode = node.op.mode
            fin = {ReductionMode.AVG: "avg", ReductionMode.NORM2: "sqrt"}.get(mode, "")
            outs.append((node.outputs[0], _MODE_PARTIAL[mode], fin))  # type: ignore[arg-type]
        arrays = []
        for uid, kind, fin in outs:
            offset = ctx.scratch.alloc(slots * length * 4) if slots > 1 else -1
            arrays.append((uid, kind, fin, offset))
        return ReductionPlan(red, slots, length, arrays)

    def finalize(self, value: str, fin: str) -> str:
        if fin == "avg":
            return f"({value} / {float(self.red.count)!r})"
        if fin == "sqrt":
            return f"tl.sqrt({value})"
        return value

    def _kept(self, ctx: Context) -> tuple[str, str, str | None]:
        """(kept index, slot index, mask) of this program's partial vector."""
        sp, t = ctx.tiling.space, ctx.tiling
        if self.red.along == "rows":
            base, extent, mask = "col", sp.dims[sp.col], t.cmask
            slot = "pid_m"
            slot_extent = t.npm
        else:
            base, extent, mask = "rm", sp.m, t.rmask
            slot = f"(g * {t.npn} + pid_n)" if sp.groups > 1 else "pid_n"
            slot_extent = sp.groups * t.npn
        if sp.nbatch > 1 and not self.red.batch_reduced:
            base = f"bb * {extent} + {base}"
        if sp.nbatch > 1 and self.red.batch_reduced:
            slot = f"bb * {slot_extent} + {slot}"
        return base, slot, mask

    def tile_lines(self, ctx: Context, sig: Signature, value: str, indexer: TileIndexer) -> list[str]:
        lines = self.partial_lines(value, indexer)
        return lines + self.store_lines(ctx, sig, {uid: f"red_{uid}" for uid, *_ in self.arrays}, indexer)

    def partial_lines(self, value: str, indexer: TileIndexer) -> list[str]:
        """Lines leaving this tile's partial of each array in red_{uid} (masked rows/columns read
        the identity)."""
        axis = 0 if self.red.along == "rows" else 1
        full = indexer.mask()
        lines = [f"red_v = tl.broadcast_to({value}, ({indexer.shape[0]}, {indexer.shape[1]}))"]
        for uid, kind, _fin, _offset in self.arrays:
            expr, identity, combine = _PARTIAL[kind]
            term = expr.format(v="red_v")
            if full is not None:
                term = f"tl.where({full}, {term}, {identity})"
            lines.append(f"red_{uid} = tl.{combine}({term}, axis={axis})")
            if combine != "sum":  # max/min drop NaN; the reference's propagate it
                lines.append(f"red_{uid} = tl.where(tl.max(({term} != {term}).to(tl.int32), axis={axis}) > 0, "
                             f"float('nan'), red_{uid})")
        return lines

    def accumulate_lines(self, into: str) -> list[str]:
        """Lines folding the partials red_{uid} into running partials {into}{uid} (a program that
        visits several tiles of rows, e.g. the depthwise row strips); `init_lines` starts them."""
        out = []
        for uid, kind, _fin, _offset in self.arrays:
            combine = _PARTIAL[kind][2]
            a, b = f"{into}{uid}", f"red_{uid}"
            out.append(f"{a} = {a} + {b}" if combine == "sum" else
                       f"{a} = tl.{combine}imum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)")
        return out

    def init_lines(self, into: str, extent: str) -> list[str]:
        return [f"{into}{uid} = tl.full(({extent},), {_PARTIAL[kind][1]}, tl.float32)"
                for uid, kind, _fin, _offset in self.arrays]

    def store_lines(self, ctx: Context, sig: Signature, names: Mapping[int, str], indexer: TileIndexer) -> list[str]:
        """Stores of the partial vectors `names` ({uid: name}): this program's slot in scratch, or
        the finalized results when one program covers all partials (one slot)."""
        axis = 0 if self.red.along == "rows" else 1
        kept, slot, mask = self._kept(ctx)
        lines = []
        for uid, kind, fin, offset in self.arrays:
            part = names[uid]
            if self.slots == 1:
                desc = ctx.tensors[uid]
                address = self._result_address(ctx, desc, ctx.ptr_of(sig)(uid), "row" if axis == 1 else "col")
                value_out = to_storage(self.finalize(part, fin), desc.data_type, ctx.compute)
                lines.append(f"tl.store({address}, {value_out}{f', mask={mask}' if mask else ''})")
            else:
                ws = sig.scratch(f"ws{uid}", offset)
                lines.append(f"tl.store({ws} + ({slot}) * {self.length} + {kept}, {part}"
                             f"{f', mask={mask}' if mask else ''})")
        return lines

    def _result_address(self, ctx: Context, desc: TensorDesc, ptr: str, vector: str) -> str:
        """Address of the results of this program's partial vector in output `desc`: a vector along
        the tile's columns (vector="col") or rows ("row"), in tile coordinates y{axis}."""
        sp = ctx.tiling.space
        terms = []
        for axis, (d, s) in enumerate(zip(desc.dim, desc.stride)):
            if d == 1 or s == 0:
                continue
            terms.append(f"y{axis}" if s == 1 else f"y{axis} * {s}")
        if vector == "col" and not any(sp.where(a) == "c" for a, d in enumerate(desc.dim) if d > 1):
            terms.append("col * 0")
        if vector == "row" and not any(sp.where(a) == "r" for a, d in enumerate(desc.dim) if d > 1):
            terms.append("rm * 0")
        return f"{ptr} + {' + '.join(terms)}"

    def combine_source(self, ctx: Context, index: int) -> tuple[str, Launch]:
        """A kernel reducing the partials of each kept position in fixed order and writing the
        results (deterministic). Its grid is (position blocks x arrays): each program takes BLOCK_L
        positions of one output array (a sum and a sum of squares run side by side) and all of their
        slots, BLOCK_S slots per (pipelined) load. On the GPU the blocks are sized for about two
        programs per SM and <= 8K elements per load; rows of >= 8 floats keep the loads sector-wide."""
        sp = ctx.tiling.space
        sig = Signature()
        block_s, block_l, warps = self.combine_blocks(ctx)
        narr = len(self.arrays)
        nl = -(-self.length // block_l)
        body = [
            f"arr = tl.program_id(0) // {nl}" if narr > 1 else "arr = 0",
            f"l = (tl.program_id(0) % {nl}) * BLOCK_L + tl.arange(0, BLOCK_L)" if narr > 1
            else "l = tl.program_id(0) * BLOCK_L + tl.arange(0, BLOCK_L)",
            f"lmask = l < {self.length}",
        ]
        # decode the kept index into output coordinates
        if self.red.along == "rows":
            extent = sp.dims[sp.col]
            inner = [(sp.col, extent)]
        else:
            extent = sp.m
            inner = [(a, sp.dims[a]) for a in sp.rows]
        if sp.nbatch > 1 and not self.red.batch_reduced:
            body += [f"kb = l // {extent}", f"ki = l % {extent}"]
            body += decompose("kb", [(a, sp.dims[a]) for a in sp.batch], "y")
        else:
            body.append("ki = l")
        body += decompose("ki", inner, "y")
        for i, (uid, kind, fin, offset) in enumerate(self.arrays):
            _, identity, combine = _PARTIAL[kind]
            ws = sig.scratch(f"ws{uid}", offset)
            desc = ctx.tensors[uid]
            op = {"sum": "{a} + {b}", "max": "tl.maximum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)",
                  "min": "tl.minimum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)"}[combine]
            smask = "" if self.slots % block_s == 0 else f"(s < {self.slots})[:, None] & "
            terms = []
            for axis, (d, st) in enumerate(zip(desc.dim, desc.stride)):
                if d > 1 and st != 0:
                    terms.append(f"y{axis}" if st == 1 else f"y{axis} * {st}")
            terms.append("l * 0")
            value = to_storage(self.finalize(f"r_{uid}", fin), desc.data_type, "tl.float32")
            block = [
                f"acc_{uid} = tl.full((BLOCK_S, BLOCK_L), {identity}, tl.float32)",
                f"for s0 in tl.range(0, {self.slots}, BLOCK_S, num_stages=2):",
                "    s = s0 + tl.arange(0, BLOCK_S)",
                f"    part = tl.load({ws} + s[:, None] * {self.length} + l[None, :], "
                f"mask={smask}lmask[None, :], other={identity})",
                f"    acc_{uid} = {op.format(a=f'acc_{uid}', b='part')}",
                f"r_{uid} = tl.{combine}(acc_{uid}, axis=0)",
                *([] if combine == "sum" else
                  [f"r_{uid} = tl.where(tl.max((acc_{uid} != acc_{uid}).to(tl.int32), axis=0) > 0, float('nan'), r_{uid})"]),
                f"tl.store({sig.buf(uid)} + {' + '.join(terms)}, {value}, mask=lmask)",
            ]
            if narr > 1:
                body.append(f"if arr == {i}:")
                body += ["    " + line for line in block]
            else:
                body += block
        name = f"kernel_combine{index}"
        source = sig.source(name, ["BLOCK_S", "BLOCK_L"], body)
        grid = (nl * narr,)
        launch = Launch(name, grid, tuple(sig.args),
                        (("BLOCK_S", block_s), ("BLOCK_L", block_l), ("num_warps", warps)))
        return source, launch

    def combine_blocks(self, ctx: Context) -> tuple[int, int, int]:
        """(BLOCK_S, BLOCK_L, num_warps) of the combine launch. Under the interpreter: small blocks
        that still loop over slots and positions in the tests."""
        if ctx.interpret:
            return min(pow2_at_least(self.slots, 2), 16), min(pow2_at_least(self.length, 16), 32), 4
        sms = max(ctx.sm_count, 1)
        narr = len(self.arrays)
        block_l = pow2_at_least(self.length, 8)
        while block_l > 8 and -(-self.length // block_l) * narr < 2 * sms:
            block_l //= 2
        block_s = min(pow2_at_least(self.slots, 2), max(2, 8192 // block_l))
        block_l = min(block_l, max(8, 8192 // block_s))
        warps = 8 if block_s * block_l >= 4096 else 4
        return block_s, block_l, warps


def add_combines(plans: Sequence[ReductionPlan], ctx: Context, functions: list[str], launches: list[Launch]) -> None:
    """The combine launches (and their kernels) of the reductions whose partials span several slots."""
    for i, plan in enumerate(plans):
        if plan.slots > 1:
            source, launch = plan.combine_source(ctx, i)
            functions.append(source)
            launches.append(launch)


# -- split-K -------------------------------------------------------------------------------------------


def split_range(iters: int, split: int) -> tuple[list[str], str, str]:
    """Lines and (lo, hi) bounds of this program's share of `iters` main-loop iterations."""
    if split <= 1:
        return [], "0", str(iters)
    per = -(-iters // split)
    return [f"it_lo = ks * {per}", f"it_hi = tl.minimum(it_lo + {per}, {iters})"], "it_lo", "it_hi"


def split_store(ctx: Context, sig: Signature, offset: int) -> list[str]:
    """The main kernel's end under split-K: store this slice's accumulator."""
    t = ctx.tiling
    sp = t.space
    dtype = "int32" if ctx.dot is not None and ctx.dot.is_int else "float32"
    ws = sig.scratch("ws_acc", offset, dtype)
    mask = t.output_indexer(ctx.ptr_of(sig)).mask()
    nprog = sp.nbatch * sp.groups
    row = f"(ks * {nprog} + pb) * {sp.m} + rm" if nprog > 1 else f"ks * {sp.m} + rm"
    return [f"tl.store({ws} + ({row})[:, None] * {sp.n} + rn[None, :], acc"
            f"{f', mask={mask}' if mask else ''})"]


def split_sum(ctx: Context, sig: Signature, offset: int) -> list[str]:
    """The epilogue kernel's start under split-K: the accumulator as the sum of the slices."""
    t = ctx.tiling
    sp = t.space
    is_int = ctx.dot is not None and ctx.dot.is_int
    dtype = "int32" if is_int else "float32"
    ws = sig.scratch("ws_acc", offset, dtype)
    mask = t.output_indexer(ctx.ptr_of(sig)).mask()
    nprog = sp.nbatch * sp.groups
    lines = [f"acc = tl.zeros((BLOCK_M, BLOCK_N), tl.{dtype})"]
    lines.append(f"for kss in tl.static_range({t.split}):")
    row = f"(kss * {nprog} + pb) * {sp.m} + rm" if nprog > 1 else f"kss * {sp.m} + rm"
    masked = f", mask={mask}, other=0" if mask else ""
    lines.append(f"    acc += tl.load({ws} + ({row})[:, None] * {sp.n} + rn[None, :]{masked})")
    return lines


# -- tensor descriptors (TMA) ------------------------------------------------------------------------

# Device-side tensor descriptors need a global scratch allocation at launch, which Triton asks of
# the allocator set with triton.set_allocator (a ContextVar: per thread). The engine should set one
# before launching a kernel that needs it; until then, the module installs a torch allocator at
# import when the importing thread has none (tests and benchmarks build and run in one thread).
TMA_PRELUDE = """
def _tma_scratch(size, alignment, stream):
    import torch
    return torch.empty(size, device="cuda", dtype=torch.int8)


def _install_tma_scratch():
    from triton.runtime import _allocation
    if isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        triton.set_allocator(_tma_scratch)


_install_tma_scratch()
"""


def tma_prelude(interpret: bool) -> list[str]:
    """Module-level source for kernels that build tensor descriptors (none under the interpreter)."""
    return [] if interpret else [TMA_PRELUDE]


def tma_ok(desc: TensorDesc, offset: int, inner: int) -> bool:
    """Whether a 2-D or 3-D descriptor can address `desc` (read from element `offset` of its buffer)
    with axis `inner` contiguous: unit inner stride, 16-byte aligned base and other strides."""
    size = desc.data_type.itemsize
    if desc.stride[inner] != 1 or (offset * size) % 16:
        return False
    return all((s * size) % 16 == 0 for a, (d, s) in enumerate(zip(desc.dim, desc.stride)) if a != inner and d > 1)


def epilogue_tiling(tiling: Tiling, knobs: Mapping[str, Any], device: Device) -> Tiling:
    """The tiles of the split-K epilogue launch. Each program sums SPLIT_K partial tiles (all
    loads issued at once) and runs the epilogue, so a tile of the main kernel's size would give few
    programs, each with SPLIT_K x (BM x BN / threads) loads in flight (a 128 x 128 tile split 2: 52
    programs for a 1568 x 512 conv). Finer tiles, down to 32 x 32, until there are about two programs
    per SM (knobs EPI_M / EPI_N set them)."""
    bm, bn = tiling.block_m, tiling.block_n
    if "EPI_M" in knobs or "EPI_N" in knobs:
        bm, bn = int(knobs.get("EPI_M", bm)), int(knobs.get("EPI_N", bn))
    else:
        bm, bn = min(bm, 64), min(bn, 128)
        want = 2 * max(device.sm_count, 1)
        while bm * bn > 1024 and Tiling(tiling.space, bm, bn).per_split < want:
            if bm >= bn and bm > 32 or bn <= 32:
                bm //= 2
            else:
                bn //= 2
    return Tiling(tiling.space, bm, bn, 1, tiling.split, tiling.big)


# -- the template base -------------------------------------------------------------------------------


class TileTemplate(Template):
    """A template whose kernels compute one output tile per program with a main loop and then run
    the shared epilogue. Subclasses give the main op kinds, the output space, extra checks, knob
    candidates and the main loop."""

    main_kinds: tuple[str, ...] = ()
    main_label = ""
    splits_k = True  # whether SPLIT_K > 1 is meaningful (the main loop reduces)
    dot_roles: tuple[str, ...] = ()  # the main op's inputs that tl.dot multiplies (A, B), if it does

    # -- subclass hooks --
    def space(self, main: Node, piece: Piece) -> OutputSpace:
        raise NotImplementedError

    def check(self, gp: GemmPiece, device: Device) -> Support:
        """By default, whether tl.dot multiplies the types of the `dot_roles` operands."""
        if self.dot_roles:
            a, b = (gp.operand(role).data_type for role in self.dot_roles)
            kind = dot_kind(a, b, interpret=not device.is_cuda)
            if isinstance(kind, str):
                return Support.no(kind, gp.main)
        return Support.yes()

    def dot(self, gp: GemmPiece, knobs: Mapping[str, Any], device: Device) -> DotKind | None:
        """By default, how tl.dot multiplies the `dot_roles` operands (None: no tl.dot)."""
        if not self.dot_roles:
            return None
        a, b = (gp.operand(role).data_type for role in self.dot_roles)
        kind = dot_kind(a, b, interpret=not device.is_cuda, fp32_precision=knobs.get("fp32_precision", "tf32"))
        assert not isinstance(kind, str)
        return kind

    def iterations(self, gp: GemmPiece, knobs: Mapping[str, Any]) -> int:
        """Main-loop trip count (split-K divides it)."""
        return 1

    def mainloop(self, ctx: Context, sig: Signature, knobs: Mapping[str, Any], lo: str, hi: str) -> list[str]:
        """Lines after the tile header that leave `acc` ([BLOCK_M, BLOCK_N])."""
        raise NotImplementedError

    def constexprs(self, knobs: Mapping[str, Any]) -> dict[str, int]:
        """The tile's blocks: BLOCK_M, BLOCK_N, and BLOCK_K where a product over K runs in its steps."""
        out = {"BLOCK_M": int(knobs["BLOCK_M"]), "BLOCK_N": int(knobs["BLOCK_N"])}
        if self.dot_roles and "BLOCK_K" in knobs:
            out["BLOCK_K"] = int(knobs["BLOCK_K"])
        return out

    # -- Template --
    def analyze(self, piece: Piece) -> tuple[GemmPiece | None, Support]:
        return analyze(piece, self.main_kinds, lambda n: self.space(n, piece), self.main_label)

    def analyzed(self, piece: Piece) -> GemmPiece:
        """The analysis of a piece to generate; an error where the template does not match it."""
        gp, verdict = self.analyze(piece)
        if gp is None:
            raise AttributeValueError(f"the {self.name} template cannot run this piece: {verdict.reason}",
                                      op=verdict.node.label() if verdict.node else None,
                                      rule="triton.gemm.match", hint="ask the engine which template matches")
        return gp

    def match(self, piece: Piece, device: Device) -> Support:
        if not piece.kind_set & set(self.main_kinds):
            return Support.no(f"the piece has no {self.main_label}")
        gp, verdict = self.analyze(piece)
        if gp is None:
            return verdict
        if DataType.DOUBLE in (gp.main.compute_data_type, gp.tensor(gp.out).data_type):
            return Support.no(f"{gp.main.label()} computes or returns DOUBLE: the templates accumulate in fp32, "
                              "not float64", gp.main)
        return self.check(gp, device)

    def estimate(self, piece: Piece, knobs: Mapping[str, Any], device: Device) -> float | None:
        """Estimated time of a config in microseconds on `device` (None: no model)."""
        return None

    def notes(self, piece: Piece, knobs: Mapping[str, Any], device: Device) -> frozenset[NumericalNote]:
        """Numerical notes of a config (tf32 products), for the engine's EngineConfig."""
        gp, _ = self.analyze(piece)
        if gp is None:
            return frozenset()
        kind = self.dot(gp, knobs, device)
        return kind.notes if kind is not None else frozenset()

    def tiling(self, gp: GemmPiece, knobs: Mapping[str, Any]) -> Tiling:
        split = int(knobs.get("SPLIT_K", 1)) if self.splits_k else 1
        sp = gp.space
        scratch_extent = split * sp.nbatch * sp.groups * sp.m * sp.n if split > 1 else 0
        return Tiling(sp, int(knobs["BLOCK_M"]), int(knobs["BLOCK_N"]), int(knobs.get("GROUP_M", 8)),
                      split, needs_int64(gp, scratch_extent))

    def setup(self, ctx: Context, sig: Signature, knobs: Mapping[str, Any]) -> list[str]:
        """Lines run once per program before any tile (tensor descriptors); empty by default."""
        return []

    def prelude(self, ctx: Context, knobs: Mapping[str, Any]) -> list[str]:
        """Module-level source the kernels need (e.g. the TMA scratch allocator); empty by default."""
        return []

    def generate(self, piece: Piece, knobs: dict[str, Any], device: Device) -> Generated:
        gp = self.analyzed(piece)
        _check_knobs(knobs)
        tiling = self.tiling(gp, knobs)
        ctx = make_context(gp, tiling, self.dot(gp, knobs, device), not device.is_cuda)
        ctx.sm_count = device.sm_count
        if tiling.split > 1:  # the epilogue launch owns the reductions (their partials follow its tiles)
            ctx.scratch, ctx.reductions = Scratch(), []
        constexprs = self.constexprs(knobs)
        warps = int(knobs.get("num_warps", 4))
        meta = (*constexprs.items(), ("num_warps", warps), ("num_stages", int(knobs.get("num_stages", 2))))
        functions: list[str] = list(self.prelude(ctx, knobs))
        launches: list[Launch] = []
        sig = Signature()
        work = tiling.split * tiling.per_split
        persistent = int(knobs.get("PERSISTENT", 0))
        programs = min(work, persistent) if persistent else work
        # one tile per program, or (persistent) a grid-stride loop over tiles
        tile = tiling.header(with_split=True, pid="work" if persistent else "tl.program_id(0)")
        split_lines, lo, hi = split_range(self.iterations(gp, knobs), tiling.split)
        tile += split_lines
        tile += self.mainloop(ctx, sig, knobs, lo, hi)
        acc_off = -1
        plans, plan_ctx = ctx.reductions, ctx
        ectx = ctx
        if tiling.split > 1:
            # the main kernel stores partial tiles; the epilogue launch sums them on its own, finer
            # tiles (enough programs to stream the partials) and owns the reductions' partials
            acc_bytes = tiling.split * gp.space.nbatch * gp.space.groups * gp.space.m * gp.space.n * 4
            acc_off = ctx.scratch.alloc(acc_bytes)
            tile += split_store(ctx, sig, acc_off)
            ectx = dataclasses.replace(ctx, tiling=epilogue_tiling(tiling, knobs, device))
            ectx.reductions = [ReductionPlan.make(r, ectx) for r in gp.reductions]
            plans, plan_ctx = ectx.reductions, ectx
        else:
            tile += epilogue(ctx, sig, "acc", int(knobs.get("EPILOGUE_SUBTILE", 1)))
        body = self.setup(ctx, sig, knobs)
        if persistent:
            body.append(f"for work in tl.range(tl.program_id(0), {work}, {programs}, flatten=False):")
            body += ["    " + line for line in tile]
        else:
            body += tile
        functions.append(sig.source("kernel", list(constexprs), body))
        launches.append(Launch("kernel", (programs,), tuple(sig.args), meta))
        if tiling.split > 1:
            et = ectx.tiling
            esig = Signature()
            subtile = int(knobs.get("EPILOGUE_SUBTILE", 1)) if et.block_n == tiling.block_n else 1
            ebody = et.header(with_split=False) + split_sum(ectx, esig, acc_off) + \
                epilogue(ectx, esig, "acc", subtile)
            ewarps = warps if et.block_m * et.block_n >= 16384 else 4
            emeta = (("BLOCK_M", et.block_m), ("BLOCK_N", et.block_n), ("num_warps", ewarps))
            functions.append(esig.source("kernel_epilogue", ["BLOCK_M", "BLOCK_N"], ebody))
            launches.append(Launch("kernel_epilogue", (et.per_split,), tuple(esig.args), emeta))
        add_combines(plans, plan_ctx, functions, launches)
        source = module_source(*functions)
        # "needs_allocator": device-side tensor descriptors take global scratch at launch
        notes = frozenset({"needs_allocator"}) if "tl.make_tensor_descriptor" in source else frozenset()
        return Generated(source, tuple(launches), ctx.scratch.size, notes)


def _check_knobs(knobs: Mapping[str, Any]) -> None:
    for key in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "EPI_M", "EPI_N"):
        value = knobs.get(key)
        if value is not None and (int(value) < 16 or int(value) & (int(value) - 1)):
            raise AttributeValueError(
                f"{key}={value} must be a power of two >= 16 (tl.dot and tl.arange need it)",
                rule="triton.gemm.knob", hint=f"pick {key} from 16, 32, 64, 128, 256",
            )
    if int(knobs.get("PERSISTENT", 0)) < 0:
        raise AttributeValueError(f"PERSISTENT={knobs['PERSISTENT']} must be 0 (one tile per program) or the "
                                  "number of programs", rule="triton.gemm.knob",
                                  hint="use 0, or about the number of SMs (times the programs per SM)")
    if int(knobs.get("EPILOGUE_SUBTILE", 1)) not in (1, 2):
        raise AttributeValueError(f"EPILOGUE_SUBTILE={knobs['EPILOGUE_SUBTILE']} must be 1 or 2",
                                  rule="triton.gemm.knob", hint="use 2 to run the epilogue on column halves")
    split = int(knobs.get("SPLIT_K", 1))
    if split < 1:
        raise AttributeValueError(f"SPLIT_K={split} must be >= 1", rule="triton.gemm.knob",
                                  hint="use 1 (no split) or a small factor such as 2-8")


# -- knob heuristics ---------------------------------------------------------------------------------

# Fraction of a Hopper SM's tensor-core rate a Triton tile of BM x BN reaches (pointer-load GEMMs
# reach ~530-550 TFLOP/s at 128x256 on an H200; smaller tiles move more operand bytes per flop).
_TILE_EFF = {(128, 256): 1.0, (256, 128): 0.95, (128, 128): 0.85, (256, 64): 0.8, (128, 64): 0.7,
             (64, 128): 0.65, (64, 64): 0.5, (128, 32): 0.4, (64, 32): 0.3}
_PEAK = {1: 1.5e15, 2: 0.75e15, 4: 0.37e15}  # realistic dense rates by operand bytes (int8, 16-bit, tf32)
_BANDWIDTH = 3.0e12  # bytes/s an H100 streams (an H200 does ~4.2e12)


def _iters(k: int, k_step: int, bk: int) -> int:
    chunk = k_step or k
    return -(-chunk // bk) * max(1, k // chunk)


def estimate_us(m: int, n: int, k: int, knobs: Mapping[str, Any], *, nprog: int, device: Device,
                elem_bytes: int = 2, k_step: int = 0, moved_bytes: int = 0) -> float:
    """A rough time model of one config on a Hopper GPU: waves of programs x one tile's math at the
    tile's efficiency, bounded below by the bytes the piece moves (`moved_bytes`: its inputs and
    outputs), plus split-K's partials and its extra launch."""
    bm, bn, bk = int(knobs["BLOCK_M"]), int(knobs["BLOCK_N"]), int(knobs["BLOCK_K"])
    split, stages = int(knobs.get("SPLIT_K", 1)), int(knobs.get("num_stages", 3))
    sms = max(device.sm_count, 1)
    iters = _iters(k, k_step, bk)
    programs = -(-m // bm) * -(-n // bn) * nprog * split
    smem = stages * (bm + bn) * bk * elem_bytes
    ctas = max(1, min(2, 220_000 // max(smem, 1)))
    eff = _TILE_EFF.get((bm, bn), 0.25)
    if bm * bn < 16384:
        eff = min(0.65, eff * (1 + 0.25 * (ctas - 1)))  # a second resident program hides some latency
    chunk = k_step or k
    eff *= chunk / (-(-chunk // bk) * bk)  # lanes wasted on a ragged channel chunk
    peak = _PEAK.get(elem_bytes, _PEAK[2]) / sms
    if int(knobs.get("TMA", 0)):
        eff *= 1.2  # TMA copies: no address math or masks in the loop (measured 590-643 vs 531 TFLOP/s)
    waves: float = -(-programs // (sms * ctas)) * ctas
    if int(knobs.get("PERSISTENT", 0)):
        eff *= 1.08  # epilogue of one tile overlaps the next tile's loads (663-694 TFLOP/s)
        waves = programs / sms
    t_math = waves * 2.0 * bm * bn * bk * -(-iters // split) / (peak * eff)
    moved = moved_bytes or ((m + n) * k * elem_bytes + m * n * 2) * nprog
    t = max(t_math, moved / _BANDWIDTH)
    if split > 1:
        t += split * m * n * nprog * 8 / _BANDWIDTH + 2e-6
    if int(knobs.get("TMA", 0)):
        t += 7e-6  # the descriptors' scratch allocation at launch (CPU side; hidden by CUDA graphs)
    return t * 1e6 + 3.0


def gemm_candidates(m: int, n: int, k: int, *, nprog: int, device: Device, elem_bytes: int = 2,
                    k_step: int = 0, moved_bytes: int = 0,
                    extra: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Tile configs for an M x N x K product repeated `nprog` times, the heuristic's choice first.

    On the GPU (Hopper) a grid of tile shapes (128x256 down to 64x32, only as wide as N needs),
    BLOCK_K 64 (32 for fp32, 128 for int8), 3-4 stages, 4-8 warps, group-M 8 and split-K factors is
    ranked by `estimate_us`: big tiles when they fill the SMs, smaller tiles or a split of K when
    they do not (small images, deep channels). Under the interpreter: 16..32-wide tiles (few, small
    programs); a split of K when the tiles are fewer than the "SMs" and the loop is long, so the
    tests exercise it. The last candidate is the plain, smallest config (HeurMode.FALLBACK).
    `k_step` is the natural K chunk (channels per filter tap of a conv) when smaller than K."""
    extra = dict(extra or {})
    chunk = k_step or k
    if not device.is_cuda:
        bm = min(32, pow2_at_least(m, 16))
        bn = min(32, pow2_at_least(n, 16))
        bk = min(32, pow2_at_least(chunk, 16))
        tiles = -(-m // bm) * -(-n // bn) * nprog
        iters = _iters(k, k_step, bk)
        split = min(4, iters // 4) if tiles < device.sm_count and iters >= 16 else 1
        first = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 2, "SPLIT_K": split,
                 "num_warps": 4, "num_stages": 1}
        last = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 1, "SPLIT_K": 1,
                "num_warps": 4, "num_stages": 1}
        return unique([{**first, **extra}, {**last, **extra}])
    bk = {1: 128, 2: 64}.get(elem_bytes, 32)
    bk = min(bk, pow2_at_least(chunk, 16))
    if elem_bytes == 1:
        bk = max(bk, 32)  # 8-bit tl.dot needs K >= 32 on the GPU
    shapes = [(128, 256), (128, 128), (256, 128), (128, 64), (256, 64), (64, 128), (64, 64), (128, 32), (64, 32)]
    widest = max(32, pow2_at_least(n, 32))
    out = []
    for bm, bn in shapes:
        if bn > widest or (elem_bytes >= 4 and bm * bn > 16384):
            continue
        stages = 3 if bm * bn >= 32768 or elem_bytes >= 4 else 4
        warps = 8 if bm * bn >= 16384 or (elem_bytes >= 4 and bm >= 128) else 4  # fp32 128-row tiles spill at 4
        iters = _iters(k, k_step, bk)
        for split in (1, 2, 4, 8):
            if split > 1 and iters // split < 4:
                break
            out.append({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8, "SPLIT_K": split,
                        "num_warps": warps, "num_stages": stages, **extra})
    out.sort(key=lambda c: estimate_us(m, n, k, c, nprog=nprog, device=device, elem_bytes=elem_bytes,
                                       k_step=k_step, moved_bytes=moved_bytes))
    out = out[:6]
    out.append({"BLOCK_M": 64, "BLOCK_N": min(64, widest), "BLOCK_K": bk if elem_bytes == 1 else min(bk, 32),
                "GROUP_M": 8, "SPLIT_K": 1,
                "num_warps": 4, "num_stages": 2, **extra})
    return unique(out)


def finish_candidates(configs: list[dict[str, Any]], gp: GemmPiece, device: Device,
                      extra: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A GEMM template's ranked configs, finished: epilogue subtiles for large tiles (`with_subtile`)
    and, for fp32 operands (`extra` from `fp32_knobs`), the first config in full fp32 as the second."""
    configs = with_subtile(configs, gp, device)
    if "fp32_precision" in extra:
        configs.insert(1, {**configs[0], "fp32_precision": "ieee"})
    return configs


def with_subtile(configs: list[dict[str, Any]], gp: GemmPiece, device: Device) -> list[dict[str, Any]]:
    """EPILOGUE_SUBTILE=2 for large tiles with an epilogue beyond a store: on an H200-class GPU a
    128x256 fp32 accumulator already takes 128 registers per thread, and e.g. an erf-based GELU on
    the whole tile spills (seen in ptxas: 255 registers + spills; halves: none)."""
    if not device.is_cuda or not gp.epilogue:
        return configs
    return [{**c, "EPILOGUE_SUBTILE": 2} if c["BLOCK_M"] * c["BLOCK_N"] >= 32768 else c for c in configs]


__all__ = [
    "OutputSpace", "View", "Reduce", "GemmPiece", "analyze", "DotKind", "dot_kind", "Signature", "Scratch",
    "TileIndexer", "Tiling", "decompose", "Context", "make_context", "operand_tile", "epilogue",
    "ReductionPlan", "TileTemplate", "gemm_candidates", "estimate_us", "with_subtile", "literal", "preload_lines",
    "epilogue_tiling", "input_taps", "memory_views", "VIEW_KINDS", "fp32_knobs", "finish_candidates", "stencil_support", "stencil_dot", "add_combines",
]
