"""Generating a piece's code around its main loop: context, operand tiles with their prologues, the epilogue,
and the reductions at the end of the epilogue (per-program partials in scratch, deterministic combine launches)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ....core.dtypes import DataType
from ....core.ir import Node
from ....core.symbolic import Expr, SymInt, evaluate
from ....core.tensor import TensorDesc
from ....ops.reduction import GenStats, Reduction, ReductionMode
from ..casts import cast_to
from ..expr import TL_DTYPE, Emitter, compute_type, from_storage, round_in_compute, to_storage
from ..gluon_prelude import triton_kernel
from ..sizes import Sizes, above_one
from ..templates.base import Launch, pow2_at_least
from .analysis import GemmPiece, Reduce
from .constants import INT32_LIMIT
from .dots import DotKind
from .indexing import TileIndexer
from .scratch import Scratch, Signature
from .space import OutputSpace
from .tiling import Tiling, decompose, static


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
    reductions: list[ReductionPlan] = field(default_factory=list)
    sm_count: int = 132  # the device's SMs (sizes the combine launches)
    tma_stores: dict[int, str] = field(default_factory=dict)  # stored uid -> its tensor descriptor (TMA stores)
    # read uid -> the expression of its whole output-shaped tile, loaded before the epilogue by the kernel itself
    # (a WS=1 kernel's loader partition copies it into shared memory by TMA)
    tile_loads: dict[int, str] = field(default_factory=dict)
    sizes: Sizes | None = None  # a bucket kernel's size parameters (sizes.py); None at a shape
    # kernels that run before the main one (their source and launch): a depthwise filter's copy
    before: list[tuple[str, Launch]] = field(default_factory=list)
    # a Gluon kernel's (WS=1: templates/_matmul_ws.py): its module is Gluon's, its TMA stores go through the
    # shared-memory tile `smem_<descriptor>`, and `functions` holds its partitions (module-level, before it)
    gluon: bool = False
    functions: list[str] = field(default_factory=list)

    def largest(self, value: SymInt) -> int:
        """A size at its largest: its value, or a bucket kernel's dynamic one over the bucket (scratch laid
        out for the bucket's largest shape, a block chosen for every shape of it)."""
        if isinstance(value, Expr) and self.sizes is not None:
            return self.sizes.max(value)
        return static(value)

    def ptr_of(self, sig: Signature) -> Callable[[int], str]:
        def ptr(uid: int) -> str:
            view = self.gp.views.get(uid)
            if view is None:
                return sig.buf(uid)
            base = sig.buf(view.base)
            return f"({base} + {view.offset})" if view.offset else base

        return ptr


def make_context(
    gp: GemmPiece, tiling: Tiling, dot: DotKind | None, interpret: bool, sizes: Sizes | None = None
) -> Context:
    piece = gp.piece
    types = [piece.tensor(u).data_type for n in piece.nodes for u in (*n.input_uids(), *n.output_uids())]
    types += [n.compute_data_type for n in piece.nodes if n is not gp.main]
    tensors = dict(piece.graph.tensors)
    for uid, view in gp.views.items():
        tensors[uid] = view.desc
    ctx = Context(gp, tiling, compute_type(types), dot, interpret, tensors=tensors, sizes=sizes)
    ctx.reductions = [ReductionPlan.make(r, ctx) for r in gp.reductions]
    return ctx


def needs_int64(gp: GemmPiece, extra: int = 0) -> bool:
    piece = gp.piece
    extents = [extra]
    for u in (*piece.inputs, *piece.outputs):
        t = piece.tensor(u)
        extents.append(1 + sum((d - 1) * s for d, s in zip(t.dim, t.stride)))
    return max(extents) > INT32_LIMIT


def operand_tile(
    ctx: Context,
    sig: Signature,
    role: str,
    indexer: TileIndexer,
    name: str,
    preset: Mapping[int, str] | None = None,
    node: Node | None = None,
) -> list[str]:
    """Lines that leave operand `role` of the main op (or of `node`, a sibling of it) as tile `name`, in
    the dot's operand type: loaded directly, or computed by its prologue and then zeroed where out of
    bounds (padding).

    `preset` maps tensor uids to names of values already computed before the tile (per-channel
    vectors a loop reads once, outside it). When the prologue's result is declared in the dot's
    16-bit operand type (an fp16 scale+bias+relu feeding an fp16 conv), its rounding is the one cast
    to that type and the padding is zeroed on the 16-bit values: no fp32 round trip."""
    gp = ctx.gp
    uid = (node or gp.main).input(role)
    assert isinstance(uid, int)
    desc = gp.tensor(uid)
    target = ctx.dot.target(desc.data_type) if ctx.dot is not None else ctx.compute
    nodes = gp.prologue.get(uid, ())
    if not nodes:
        load = indexer.load_tile(desc, ctx.ptr_of(sig)(uid))
        lines = [
            f"{name} = {load}"
            if TL_DTYPE[desc.data_type] == target
            else f"{name} = {from_storage(load, desc.data_type, target)}"
        ]
        selected = indexer.selected()
        if selected is not None:
            lines.append(f"{name} = tl.where({selected}, {name}, 0)")
        return lines
    em = Emitter(ctx.tensors, ctx.compute, indexer, ptr=ctx.ptr_of(sig), scalar=sig.scalar)
    if preset:
        em.values.update(preset)
    for node in nodes:
        em.emit(node)
    value = em.values[uid]
    lines = list(em.lines)
    rounded = round_in_compute(value, desc.data_type, ctx.compute)
    if (
        desc.data_type in (DataType.HALF, DataType.BFLOAT16)
        and TL_DTYPE[desc.data_type] == target
        and rounded is not None
        and lines
        and lines[-1] == f"{value} = {rounded}"
    ):
        lines.pop()  # rounded once, by the cast to the operand type below
    mask = indexer.mask()
    rows, cols = indexer.shape
    if mask is None:
        lines.append(f"{name} = tl.broadcast_to({value}, ({rows}, {cols}))")
    else:
        lines.append(f"{name} = tl.where({mask}, {value}, 0.0)")
    return lines + [f"{name} = {cast_to(name, target)}"]


def epilogue(
    ctx: Context,
    sig: Signature,
    acc: str,
    subtile: int = 1,
    preset: Mapping[int, str] | None = None,
    accumulate: str | None = None,
) -> list[str]:
    """The accumulator -> the main output's value (rounded to its declared type) -> the epilogue's
    pointwise ops -> stores -> reduction partials (or results, when one program covers them).

    subtile=2 runs it on the two column halves of the tile one after the other (EPILOGUE_SUBTILE):
    a heavy epilogue (erf-based GELU) then holds half as many temporaries next to the accumulator, and a
    row reduction (RMSNorm's mean of squares) exchanges a half tile through shared memory, not the whole
    (its two halves' partials are added in registers before the one store).
    `preset` (whole tiles only) maps tensor uids to values loaded before (`preload_lines`);
    `accumulate` (whole tiles only): the reductions fold their partials into running vectors named
    {accumulate}{uid} instead of storing them (`ReductionPlan.init_lines` / `store_lines`)."""
    siblings = [sibling_acc(acc, i) for i in range(len(ctx.gp.siblings))]
    if subtile <= 1 or not can_subtile(ctx) or accumulate:
        return _epilogue_tile(
            ctx,
            sig,
            acc,
            ctx.tiling.output_indexer(ctx.ptr_of(sig)),
            preset,
            accumulate,
            "pid_n * BLOCK_N",
            siblings=siblings,
        )
    t, sp = ctx.tiling, ctx.tiling.space
    half = t.block_n // 2
    lines = [
        f"{a}_h0, {a}_h1 = tl.split(tl.permute(tl.reshape({a}, (BLOCK_M, 2, {half})), (0, 2, 1)))"
        for a in (acc, *siblings)
    ]
    across = [p for p in ctx.reductions if p.red.along != "rows"]  # (partials of the halves add up)
    for p in across:
        lines += p.init_lines(_HALVES, "BLOCK_M")
    for h in range(2):
        lines.append(f"rn = pid_n * BLOCK_N + {h * half} + tl.arange(0, {half})")
        if t.cmask:
            lines.append(f"cmask = rn < {t.text(sp.n)}")
        lines.append(f"col = g * {t.text(sp.n)} + rn" if sp.groups > 1 else "col = rn")
        lines += t.col_coordinate_lines()
        indexer = t.output_indexer(ctx.ptr_of(sig), cols=str(half))
        lines += _epilogue_tile(
            ctx,
            sig,
            f"{acc}_h{h}",
            indexer,
            col0=f"pid_n * BLOCK_N + {h * half}",
            halves=True,
            siblings=[f"{a}_h{h}" for a in siblings],
        )
    for p in across:
        lines += p.store_lines(ctx, sig, {uid: f"{_HALVES}{uid}" for uid, *_ in p.arrays}, indexer)
    return lines


def preload_lines(
    ctx: Context, sig: Signature, nodes: Sequence[Node], indexer: TileIndexer, skip: Sequence[int] = ()
) -> tuple[list[str], dict[int, str]]:
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
            if any(
                d > 1 and s != 0 and indexer.axes[a][0] != "c" for a, (d, s) in enumerate(zip(desc.dim, desc.stride))
            ):
                continue
            names[u] = f"pre{u}"
            lines.append(
                f"pre{u} = {from_storage(indexer.load(desc, ctx.ptr_of(sig)(u)), desc.data_type, ctx.compute)}"
            )
    return lines, names


_HALVES = "rhalf"  # the running partials of a row reduction over the tile's column halves


def sibling_acc(acc: str, i: int) -> str:
    """The accumulator of the main op's i-th sibling (GemmPiece.siblings) beside accumulator `acc`."""
    return f"{acc}_s{i}"


def can_subtile(ctx: Context) -> bool:
    """Halves work when each is a power of two >= 16."""
    return ctx.tiling.block_n >= 32


class DescriptorStore:
    """Stores of a tile through a tensor descriptor (TMA; Context.tma_stores): the tile's rows from
    pid_m * BLOCK_M, its columns from `col0`; out-of-bounds rows and columns are not written."""

    def __init__(self, name: str, col0: str, shape: tuple[str, str]) -> None:
        self.name, self.col0, self.shape = name, col0, shape

    def store(self, desc: TensorDesc, ptr: str, value: str) -> str:
        rows, cols = self.shape
        return f"{self.name}.store([pid_m * BLOCK_M, {self.col0}], tl.broadcast_to({value}, ({rows}, {cols})))"


class GluonDescriptorStore(DescriptorStore):
    """DescriptorStore in a Gluon kernel: the tile through its shared-memory buffer (`_og_gl_tma_store`)."""

    def store(self, desc: TensorDesc, ptr: str, value: str) -> str:
        rows, cols = self.shape
        return (
            f"_og_gl_tma_store({self.name}, smem_{self.name}, pid_m * BLOCK_M, {self.col0}, "
            f"tl.broadcast_to({value}, ({rows}, {cols})))"
        )


def _epilogue_tile(
    ctx: Context,
    sig: Signature,
    acc: str,
    indexer: TileIndexer,
    preset: Mapping[int, str] | None = None,
    accumulate: str | None = None,
    col0: str = "pid_n * BLOCK_N",
    halves: bool = False,
    siblings: Sequence[str] = (),
) -> list[str]:
    """One (sub)tile's epilogue; with `halves` (a column half of the tile) its row reductions' partials are
    folded into the running vectors `_HALVES` (`epilogue` stores them after both halves). `siblings`: the
    accumulators of the main op's siblings (GemmPiece.siblings), in order."""
    gp = ctx.gp
    em = Emitter(ctx.tensors, ctx.compute, indexer, ptr=ctx.ptr_of(sig), scalar=sig.scalar)
    if preset:
        em.values.update(preset)
    assert not (halves and ctx.tile_loads), "a tile load is of the whole tile"
    em.loaders = {uid: _loaded(expr) for uid, expr in ctx.tile_loads.items()}
    accs = dict(zip((n.output_uids()[0] for n in gp.mains), (acc, *siblings), strict=True))
    for uid, name in accs.items():
        em.assign(uid, f"{name}.to({ctx.compute})")
    for node in gp.epilogue:
        if node.kind in ("slice", "concatenate"):
            emit_half(em, node, gp.space, indexer.shape[1])
        else:
            em.emit(node)
    int_acc = ctx.dot is not None and ctx.dot.is_int
    for uid in gp.stores:
        out_desc = gp.tensor(uid)
        if uid in accs and int_acc and out_desc.data_type is DataType.INT32:
            em.lines.append(indexer.store(out_desc, ctx.ptr_of(sig)(uid), accs[uid]))  # exact, not via fp32
        elif uid in ctx.tma_stores:
            store = GluonDescriptorStore if ctx.gluon else DescriptorStore
            em.store(uid, store(ctx.tma_stores[uid], col0, indexer.shape))
        else:
            em.store(uid)
    lines = em.lines
    for plan in ctx.reductions:
        into = _HALVES if halves and plan.red.along != "rows" else accumulate
        if into:
            lines += plan.partial_lines(em.values[plan.red.source], indexer) + plan.accumulate_lines(into)
        else:
            lines += plan.tile_lines(ctx, sig, em.values[plan.red.source], indexer)
    return lines


def emit_half(em: Emitter, node: Node, space: OutputSpace, width: str) -> None:
    """A half of the split product's head dims (a slice: analysis.half_swap), or two halves joined (a
    concatenation), in registers: the (sub)tile's `width` columns are whole heads, each reshaped to
    (2, D / 2), its halves split off as [BLOCK_M, heads, D / 2] values and joined back the same way
    (bench/results/constants.md#rotate-half-in-a-gemm-epilogue: register renaming on sm_90a)."""
    head = space.dims[space.cols[-1]]
    ins, out = node.input_uids(), node.output_uids()[0]
    if node.kind == "slice":
        name = f"hv{ins[0]}"
        split = f"{name}_lo, {name}_hi = "
        if not any(line.startswith(split) for line in em.lines):  # (each value split once)
            em.lines.append(
                f"{split}tl.split(tl.permute(tl.reshape({em.values[ins[0]]}, "
                f"(BLOCK_M, {width} // {head}, 2, {head // 2})), (0, 1, 3, 2)))"
            )
        start = node.op.slices[space.cols[-1]][0]  # type: ignore[attr-defined]
        em.moved(out, f"{name}_hi" if start else f"{name}_lo", ins)
        return
    a, b = (em.values[u] for u in ins)
    em.moved(out, f"tl.reshape(tl.permute(tl.join({a}, {b}), (0, 1, 3, 2)), (BLOCK_M, {width}))", ins)


def _loaded(expr: str) -> Callable[[TensorDesc], str]:
    """A tensor's load as the expression `expr` of its tile (Context.tile_loads)."""
    return lambda _desc: expr


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
    ReductionMode.ADD: "sum",
    ReductionMode.AVG: "sum",
    ReductionMode.NORM1: "abssum",
    ReductionMode.NORM2: "sumsq",
    ReductionMode.MAX: "max",
    ReductionMode.MIN: "min",
    ReductionMode.AMAX: "amax",
}


def _wide(ctx: Context, uid: int) -> bool:
    """A DOUBLE result: its partials are kept and combined in float64 (fp32 partials of a float64
    sum of squares lost 4e-8 relative: fuzz seed 20261129010404)."""
    return ctx.tensors[uid].data_type is DataType.DOUBLE


def _partial_type(ctx: Context, uid: int) -> str:
    return "float64" if _wide(ctx, uid) else "float32"


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
        # (slots an int; the kept length a bucket kernel's dynamic M: its partials laid out for the bucket's
        # largest shape, indexed by the run-time length)
        if red.along == "rows":
            slots, length = static(nb_red * t.npm), nb_keep * sp.dims[sp.col]
        elif red.along == "cols":
            slots, length = static(nb_red * sp.groups * t.npn), nb_keep * sp.m
        else:  # (one partial a tile)
            slots, length = static(nb_red * sp.groups * t.npm * t.npn), nb_keep
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
            size = 8 if _wide(ctx, uid) else 4
            offset = ctx.scratch.alloc(slots * ctx.largest(length) * size) if slots > 1 else -1
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
        cols = f"(g * {t.npn} + pid_n)" if sp.groups > 1 else "pid_n"
        if self.red.along == "rows":
            base, extent, mask = "col", sp.dims[sp.col], t.cmask
            slot = "pid_m"
            slot_extent = t.npm
        elif self.red.along == "cols":
            base, extent, mask = "rm", sp.m, t.rmask
            slot = cols
            slot_extent = sp.groups * t.npn
        else:
            base, extent, mask = "0", 1, None
            slot = f"pid_m * {t.text(sp.groups * t.npn)} + {cols}"
            slot_extent = sp.groups * t.npm * t.npn
        if above_one(sp.nbatch) and not self.red.batch_reduced:
            base = "bb" if self.red.along == "all" else f"bb * {t.text(extent)} + {base}"
        if above_one(sp.nbatch) and self.red.batch_reduced:
            slot = f"bb * {t.text(slot_extent)} + {slot}"
        return base, slot, mask

    def tile_lines(self, ctx: Context, sig: Signature, value: str, indexer: TileIndexer) -> list[str]:
        lines = self.partial_lines(value, indexer)
        return lines + self.store_lines(ctx, sig, {uid: f"red_{uid}" for uid, *_ in self.arrays}, indexer)

    def partial_lines(self, value: str, indexer: TileIndexer) -> list[str]:
        """Lines leaving this tile's partial of each array in red_{uid} (masked rows/columns read
        the identity)."""
        axes = {"rows": (0,), "cols": (1,), "all": (1, 0)}[self.red.along]
        full = indexer.mask()
        lines = [f"red_v = tl.broadcast_to({value}, ({indexer.shape[0]}, {indexer.shape[1]}))"]

        def over(fn: str, x: str) -> str:
            for axis in axes:
                x = f"tl.{fn}({x}, axis={axis})"
            return x

        for uid, kind, _fin, _offset in self.arrays:
            expr, identity, combine = _PARTIAL[kind]
            term = expr.format(v="red_v")
            if full is not None:
                term = f"tl.where({full}, {term}, {identity})"
            lines.append(f"red_{uid} = {over(combine, term)}")
            if combine != "sum":  # max/min drop NaN; the reference's propagate it
                nans = over("max", f"({term} != {term}).to(tl.int32)")
                lines.append(f"red_{uid} = tl.where({nans} > 0, float('nan'), red_{uid})")
        return lines

    def accumulate_lines(self, into: str) -> list[str]:
        """Lines folding the partials red_{uid} into running partials {into}{uid} (a program that
        visits several tiles of rows, e.g. the depthwise row strips); `init_lines` starts them."""
        out = []
        for uid, kind, _fin, _offset in self.arrays:
            combine = _PARTIAL[kind][2]
            a, b = f"{into}{uid}", f"red_{uid}"
            out.append(
                f"{a} = {a} + {b}"
                if combine == "sum"
                else f"{a} = tl.{combine}imum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)"
            )
        return out

    def init_lines(self, into: str, extent: str) -> list[str]:
        """Running partials of `extent` positions (one, a scalar, for a reduction over the whole tile)."""
        shape = "()" if self.red.along == "all" else f"({extent},)"
        return [
            f"{into}{uid} = tl.full({shape}, {_PARTIAL[kind][1]}, tl.float32)"
            for uid, kind, _fin, _offset in self.arrays
        ]

    def store_lines(self, ctx: Context, sig: Signature, names: Mapping[int, str], indexer: TileIndexer) -> list[str]:
        """Stores of the partial vectors `names` ({uid: name}): this program's slot in scratch, or
        the finalized results when one program covers all partials (one slot)."""
        vector = {"rows": "col", "cols": "row", "all": None}[self.red.along]
        kept, slot, mask = self._kept(ctx)
        lines = []
        for uid, _kind, fin, offset in self.arrays:
            part = names[uid]
            if self.slots == 1:
                desc = ctx.tensors[uid]
                address = self._result_address(ctx, desc, ctx.ptr_of(sig)(uid), vector)
                value_out = to_storage(self.finalize(part, fin), desc.data_type, ctx.compute)
                lines.append(f"tl.store({address}, {value_out}{f', mask={mask}' if mask else ''})")
            else:
                ws = sig.scratch(f"ws{uid}", offset, _partial_type(ctx, uid))
                lines.append(
                    f"tl.store({ws} + ({slot}) * {ctx.tiling.text(self.length)} + {kept}, "
                    f"{part}{f', mask={mask}' if mask else ''})"
                )
        return lines

    def _result_address(self, ctx: Context, desc: TensorDesc, ptr: str, vector: str | None) -> str:
        """Address of the results of this program's partial vector in output `desc`: a vector along
        the tile's columns (vector="col") or rows ("row"), or one value (None), in tile coordinates y{axis}."""
        sp, text = ctx.tiling.space, ctx.tiling.text
        terms = []
        for axis, (d, s) in enumerate(zip(desc.dim, desc.stride)):
            if d == 1 or s == 0:
                continue
            terms.append(f"y{axis}" if s == 1 else f"y{axis} * {text(s)}")
        if vector == "col" and not any(sp.where(a) == "c" for a, d in enumerate(desc.dim) if above_one(d)):
            terms.append("col * 0")
        if vector == "row" and not any(sp.where(a) == "r" for a, d in enumerate(desc.dim) if above_one(d)):
            terms.append("rm * 0")
        return f"{ptr} + {' + '.join(terms) or '0'}"

    def combine_source(self, ctx: Context, index: int) -> tuple[str, Launch]:
        """A kernel reducing the partials of each kept position in fixed order and writing the
        results (deterministic). Its grid is (position blocks x arrays): each program takes BLOCK_L
        positions of one output array (a sum and a sum of squares run side by side) and all of their
        slots, BLOCK_S slots per (pipelined) load. On the GPU the blocks are sized for about two
        programs per SM and <= 8K elements per load; rows of >= 8 floats keep the loads sector-wide."""
        sp, text = ctx.tiling.space, ctx.tiling.text
        sig = Signature()
        block_s, block_l, warps = self.combine_blocks(ctx)
        narr = len(self.arrays)
        nl = -(-self.length // block_l)
        body = [
            f"arr = tl.program_id(0) // {text(nl)}" if narr > 1 else "arr = 0",
            f"l = (tl.program_id(0) % {text(nl)}) * BLOCK_L + tl.arange(0, BLOCK_L)"
            if narr > 1
            else "l = tl.program_id(0) * BLOCK_L + tl.arange(0, BLOCK_L)",
            f"lmask = l < {text(self.length)}",
        ]
        # decode the kept index into output coordinates
        if self.red.along == "rows":
            extent: SymInt = sp.dims[sp.col]
            inner = [(sp.col, extent)]
        elif self.red.along == "cols":
            extent = sp.m
            inner = [(a, sp.dims[a]) for a in sp.rows]
        else:
            extent, inner = 1, []
        if above_one(sp.nbatch) and not self.red.batch_reduced:
            body += [f"kb = l // {text(extent)}", f"ki = l % {text(extent)}"]
            body += decompose("kb", [(a, sp.dims[a]) for a in sp.batch], "y", text)
        else:
            body.append("ki = l")
        body += decompose("ki", inner, "y", text)
        for i, (uid, kind, fin, offset) in enumerate(self.arrays):
            _, identity, combine = _PARTIAL[kind]
            acc = _partial_type(ctx, uid)
            ws = sig.scratch(f"ws{uid}", offset, acc)
            desc = ctx.tensors[uid]
            op = {
                "sum": "{a} + {b}",
                "max": "tl.maximum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)",
                "min": "tl.minimum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)",
            }[combine]
            smask = "" if self.slots % block_s == 0 else f"(s < {self.slots})[:, None] & "
            terms = []
            for axis, (d, st) in enumerate(zip(desc.dim, desc.stride)):
                if above_one(d) and st != 0:
                    terms.append(f"y{axis}" if st == 1 else f"y{axis} * {text(st)}")
            terms.append("l * 0")
            value = to_storage(self.finalize(f"r_{uid}", fin), desc.data_type, f"tl.{acc}")
            block = [
                f"acc_{uid} = tl.full((BLOCK_S, BLOCK_L), {identity}, tl.{acc})",
                f"for s0 in tl.range(0, {self.slots}, BLOCK_S, num_stages=2):",
                "    s = s0 + tl.arange(0, BLOCK_S)",
                f"    part = tl.load({ws} + s[:, None] * {text(self.length)} + l[None, :], "
                f"mask={smask}lmask[None, :], other={identity})",
                f"    acc_{uid} = {op.format(a=f'acc_{uid}', b='part')}",
                f"r_{uid} = tl.{combine}(acc_{uid}, axis=0)",
                *(
                    []
                    if combine == "sum"
                    else [
                        f"r_{uid} = tl.where(tl.max((acc_{uid} != acc_{uid}).to(tl.int32), axis=0) > 0, float('nan'), r_{uid})"
                    ]
                ),
                f"tl.store({sig.buf(uid)} + {' + '.join(terms)}, {value}, mask=lmask)",
            ]
            if narr > 1:
                body.append(f"if arr == {i}:")
                body += ["    " + line for line in block]
            else:
                body += block
        name = f"kernel_combine{index}"
        programs: SymInt = nl * narr
        sizes, grid_expr = ctx.sizes, None
        if sizes is not None:  # a bucket kernel's: the size parameters after the others, the grid per shape
            sizes.add_params(sig)
            programs, grid_expr = evaluate(programs, sizes.env), (programs,)
        source = sig.source(name, ["BLOCK_S", "BLOCK_L"], body)
        meta = (("BLOCK_S", block_s), ("BLOCK_L", block_l), ("num_warps", warps))
        return source, Launch(name, (static(programs),), tuple(sig.args), meta, grid_expr=grid_expr)

    def combine_blocks(self, ctx: Context) -> tuple[int, int, int]:
        """(BLOCK_S, BLOCK_L, num_warps) of the combine launch. Under the interpreter: small blocks
        that still loop over slots and positions in the tests."""
        length = ctx.largest(self.length)  # (a bucket kernel's: the same blocks at every shape)
        if ctx.interpret:
            return min(pow2_at_least(self.slots, 2), 16), min(pow2_at_least(length, 16), 32), 4
        sms = max(ctx.sm_count, 1)
        narr = len(self.arrays)
        block_l = pow2_at_least(length, 8)
        while block_l > 8 and -(-length // block_l) * narr < 2 * sms:
            block_l //= 2
        block_s = min(pow2_at_least(self.slots, 2), max(2, 8192 // block_l))
        block_l = min(block_l, max(8, 8192 // block_s))
        warps = 8 if block_s * block_l >= 4096 else 4
        return block_s, block_l, warps


def add_combines(plans: Sequence[ReductionPlan], ctx: Context, functions: list[str], launches: list[Launch]) -> None:
    """The combine launches (and their kernels) of the reductions whose partials span several slots (in a
    Gluon module, Triton kernels: gluon_prelude.triton_kernel)."""
    for i, plan in enumerate(plans):
        if plan.slots > 1:
            source, launch = plan.combine_source(ctx, i)
            functions.append(triton_kernel(source, launch.kernel) if ctx.gluon else source)
            launches.append(launch)
