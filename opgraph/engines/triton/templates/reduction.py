"""Reduction pieces: a pointwise DAG over one iteration space (the prologue) whose values are
reduced by `reduction` / `genstats` nodes that all reduce the same axes, in one kernel, plus a small
combine launch when the reduced axes are split over programs. Prologue values that the graph needs
elsewhere are stored full-size on the way.

The space is viewed as kept (M) x reduced (K): `m` walks the kept axes, `k` the reduced ones, both
in the memory order of the piece's main input. Every tensor's offset is separable, `om(m) + ok(k)`,
each part a sum of `(flat // inner) % size * stride` terms with runs of axes that are packed in
that tensor merged (so a row of a packed tensor is `k` itself, which Triton vectorises). A program
owns BLOCK_M kept positions and loops over K in BLOCK_K steps on a [BLOCK_M, BLOCK_K] tile, or
[BLOCK_K, BLOCK_M] when the contiguous axis is kept (per-channel stats of NHWC): the contiguous axis
is always the tile's fast axis. Accumulators are the tile itself (combined elementwise, reduced
once after the loop), fp32 (fp64 for products, whose partial products would otherwise overflow or
underflow where the float64 reference does not). Tensors that do not depend on `k` (per-channel
parameters) are loaded once before the loop.

The K loop is software-pipelined on the GPU (knob STAGES: `tl.range(num_stages=STAGES)`, cp.async
into shared memory, ~24 KiB of tiles in flight per program) where a program walks several tiles.

With SPLIT > 1 the K range is cut in SPLIT chunks (programs (m block, chunk)); each writes its
partial per kept position to scratch, `[SPLIT, M]` per reduced value, and `kernel_combine` folds
them in a fixed order and applies the final transform (AVG divide, NORM2 sqrt) and the output
rounding: deterministic, no atomics. The combine's programs own 32-256 kept positions (>= 2 programs
per SM where M allows) and load all the chunks' partials of them in one step where they fit.
MIN/MAX/AMAX propagate NaN like np.min/np.max.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from ....core.config import Support
from ....core.device import Device
from ....core.ir import Node, ShapeOrigin
from ....core.piece import Piece
from ....core.symbolic import Expr, evaluate
from ....core.tensor import TensorDesc, stride_order
from ....memory.workspace import align_up
from ....ops.reduction import GenStats, Reduction, ReductionMode, reduced_axes
from ..expr import Emitter, compute_type, elementwise, node_type, piece_types, to_storage
from ..gemm import VIEW_KINDS, View, memory_views
from ..knobs import ReductionKnobs
from ..sizes import Sizes, above_one, bucket_analysis
from ._flat_axes import FlatAxes, ReductionIndexer
from .base import (
    Arg,
    ArgKind,
    Generated,
    Launch,
    Match,
    Template,
    external_params,
    indent,
    module_source,
    pow2_at_least,
    program_id,
    unique,
)

INT32_LIMIT = 2**31 - 1
MAX_TILE = 16384  # elements of one tile: more spills registers on the GPU

R = ReductionMode
_KIND = {
    R.ADD: "sum",
    R.AVG: "sum",
    R.NORM1: "sum",
    R.NORM2: "sum",
    R.MUL: "prod",
    R.MUL_NO_ZEROS: "prod",
    R.MAX: "max",
    R.AMAX: "max",
    R.MIN: "min",
}
_IDENTITY = {"sum": "0.0", "prod": "1.0", "max": "float('-inf')", "min": "float('inf')"}


# -- what a piece reduces ------------------------------------------------------------------------


@dataclass(frozen=True)
class Reducer:
    """One reduced value: `out` = mode-reduce(`source`) (genstats gives two, the second `square`)."""

    out: int | None
    source: int
    mode: ReductionMode
    square: bool = False

    @property
    def kind(self) -> str:
        return _KIND[self.mode]


@dataclass(frozen=True)
class Analysis:
    space: tuple[int, ...]
    kept: tuple[int, ...]  # axes outer -> inner in the main tensor's memory order (dim > 1)
    reduced: tuple[int, ...]
    k_fast: bool  # the contiguous axis is reduced: tile [BLOCK_M, BLOCK_K]
    reducers: tuple[Reducer, ...]
    elt: int  # bytes per element of the main tensor
    views: tuple[tuple[int, View], ...] = ()  # (uid, view): slices/transposes/reshapes read in place

    def tensors(self, piece: Piece) -> dict[int, TensorDesc]:
        """The piece's tensors, its views as the views of memory they read."""
        return {**piece.graph.tensors, **{u: v.desc for u, v in self.views}}

    @property
    def M(self) -> int:
        return math.prod(self.space[a] for a in self.kept)

    @property
    def K(self) -> int:
        return math.prod(self.space[a] for a in self.reduced)


def _reducers(piece: Piece, node: Node) -> tuple[TensorDesc, tuple[int, ...], list[Reducer]] | str:
    """(input, reduced axes, reducers) of a reducing node, or why this template cannot run it."""
    src = node.inputs[0]
    if not isinstance(src, int):
        return f"{node.label()} reduces a literal"
    x = piece.tensor(src)
    if isinstance(node.op, Reduction):
        out = node.outputs[0]
        assert out is not None
        return x, reduced_axes(x.dim, piece.tensor(out).dim), [Reducer(out, src, node.op.mode)]
    assert isinstance(node.op, GenStats)
    s, sq = node.outputs
    axes = tuple(a for a in range(len(x.dim)) if a != 1 and above_one(x.dim[a]))
    return x, axes, [Reducer(s, src, R.ADD), Reducer(sq, src, R.ADD, square=True)]


def analyze(piece: Piece) -> Analysis | Support:
    if not piece.kind_set & {"reduction", "genstats"}:  # (without a pass over a long piece)
        return Support.no("the piece has no reduction or genstats node")
    reducing = [n for n in piece.nodes if isinstance(n.op, (Reduction, GenStats))]
    if not reducing:
        return Support.no("the piece has no reduction or genstats node")
    for n in piece.nodes:
        if not (elementwise(n) or isinstance(n.op, (Reduction, GenStats)) or n.kind in VIEW_KINDS):
            return Support.no(f"the reduction template runs pointwise ops and reductions, not {n.kind}", n)
    views = _views(piece)
    if isinstance(views, Support):
        return views
    reducers: list[Reducer] = []
    space: tuple[int, ...] | None = None
    axes: tuple[int, ...] | None = None
    reduced_out: set[int] = set()
    for n in reducing:
        got = _reducers(piece, n)
        if isinstance(got, str):
            return Support.no(got, n)
        x, ax, rs = got
        if space is None:
            space, axes = x.dim, ax
        elif x.dim != space or ax != axes:
            return Support.no(
                f"{n.label()} reduces axes {list(ax)} of dims {list(x.dim)} but an earlier reduction of the "
                f"piece reduces axes {list(axes or ())} of dims {list(space)}; one kernel reduces one way",
                n,
            )
        reducers += rs
        reduced_out |= set(n.output_uids())
    assert space is not None and axes is not None
    for n in piece.nodes:
        if reduced_out & set(n.input_uids()):
            return Support.no(f"{n.label()} reads a reduction's result; a reduction ends its piece", n)
        if elementwise(n):
            for u in n.output_uids():
                d = piece.tensor(u).dim
                if piece.tensor(u).numel == 1 and u not in piece.outputs:
                    continue
                if len(d) != len(space) or any(a != b and a != 1 for a, b in zip(d, space)):
                    return Support.no(
                        f"{piece.tensor(u).label()} dims {list(d)} do not broadcast to the "
                        f"reduction's space {list(space)}",
                        n,
                    )
    main = _main_tensor(piece, space, views)
    order = stride_order(main.stride) if main is not None else tuple(range(len(space)))
    live = [a for a in order if above_one(space[a])]
    kept = tuple(a for a in live if a not in axes)
    reduced = tuple(a for a in live if a in axes)
    k_fast = bool(live) and live[-1] in axes
    elt = main.data_type.itemsize if main is not None else 4
    return Analysis(space, kept, reduced, k_fast, tuple(reducers), elt, tuple(views.items()))


def _views(piece: Piece) -> dict[int, View] | Support:
    """The piece's slices/transposes/reshapes as views of its inputs in memory (chains compose), read in
    place by its pointwise ops and reductions (the flatten of a language model's logits before the loss's
    reductions); a view of a computed value, or one the piece would store, needs a copy (another piece)."""
    if not any(n.kind in VIEW_KINDS for n in piece.nodes):
        return {}
    views = memory_views(piece)
    if isinstance(views, Support):
        return views
    stored = next((u for u in views if u in piece.outputs), None)
    if stored is not None:
        return Support.no(
            f"{piece.tensor(stored).label()} is a view the piece would store; the reduction template reads "
            "views in place and stores none"
        )
    return views


def _main_tensor(piece: Piece, space: tuple[int, ...], views: dict[int, View]) -> TensorDesc | None:
    """The tensor whose layout orders the walk: the first full-size input (or view of one), else output."""
    for u in (*piece.inputs, *views, *piece.outputs):
        t = views[u].desc if u in views else piece.tensor(u)
        if t.dim == space and not t.is_pass_by_value:
            return t
    return None


# -- code generation -----------------------------------------------------------------------------


def _prep(r: Reducer, v: str) -> str:
    """The per-element contribution of value `v` (compute type) to reducer `r`."""
    if r.square or r.mode is R.NORM2:
        e = f"{v} * {v}"
    elif r.mode in (R.NORM1, R.AMAX):
        e = f"tl.abs({v})"
    elif r.mode is R.MUL_NO_ZEROS:
        e = f"tl.where({v} == 0, 1.0, {v})"
    else:
        e = v
    return f"({e}).to(tl.float64)" if r.kind == "prod" else e


def _combine(kind: str, acc: str, v: str) -> str:
    if kind == "sum":
        return f"{acc} + {v}"
    if kind == "prod":
        return f"{acc} * {v}"
    fn = "tl.maximum" if kind == "max" else "tl.minimum"
    return f"{fn}({acc}, {v}, propagate_nan=tl.PropagateNan.ALL)"


def _reduce_lines(kind: str, acc: str, out: str, axis: int, shape: tuple[int, int]) -> list[str]:
    """Lines reducing 2-D tile `acc` of `shape` along `axis` into vector `out`."""
    if kind == "sum":
        return [f"{out} = tl.sum({acc}, axis={axis})"]
    if kind in ("max", "min"):
        # tl.max/tl.min skip NaN on the GPU (and in the interpreter): put it back
        fn = "tl.max" if kind == "max" else "tl.min"
        return [
            f"{out} = {fn}({acc}, axis={axis})",
            f"{out} = tl.where(tl.max(({acc} != {acc}).to(tl.int32), axis={axis}) > 0, float('nan'), {out})",
        ]
    # products: a pairwise tree (tl.reduce with a custom combine is element by element in the
    # interpreter)
    rows, length = (shape[1], shape[0]) if axis == 0 else shape
    t = f"{out}_t"
    lines = [f"{t} = tl.trans({acc})" if axis == 0 else f"{t} = {acc}"]
    while length > 1:
        length //= 2
        lines += [
            f"{t} = tl.reshape({t}, [{rows}, {length}, 2])",
            f"{t}_a, {t}_b = tl.split({t})",
            f"{t} = {t}_a * {t}_b",
        ]
    lines.append(f"{out} = tl.reshape({t}, [{rows}])")
    return lines


def _acc_type(r: Reducer, compute: str) -> str:
    """Accumulator and partial type: the compute type, fp64 for products."""
    return "tl.float64" if r.kind == "prod" else compute


def _finish(r: Reducer, value: str, K: Any, compute: str, text: Callable[[Any], str] = str) -> str:
    """The reduced value in the compute type after the mode's final transform (a dynamic K divides as
    its run-time argument)."""
    v = f"{value}.to({compute})" if r.kind == "prod" else value
    if r.mode is R.AVG:
        return f"({v} / {float(K)!r})" if isinstance(K, int) else f"({v} / {text(K)})"
    if r.mode is R.NORM2:
        return f"tl.sqrt({v})"
    return v


class ReductionTemplate(Template):
    name = "reduction"
    priority = 10
    main_kinds = ("reduction", "genstats")
    knob_class = ReductionKnobs

    def match(self, piece: Piece, device: Device) -> Support | ReductionMatch:
        a = analyze(piece)
        return a if isinstance(a, Support) else ReductionMatch(self, piece, device, a)


class ReductionMatch(Match[ReductionKnobs]):
    def __init__(self, template: ReductionTemplate, piece: Piece, device: Device, analysis: Analysis) -> None:
        super().__init__(template, piece, device)
        self.a = analysis

    @cached_property
    def symbolic(self) -> tuple[Piece, Analysis, ShapeOrigin] | None:
        """The symbolic piece and analysis where the kernel takes its sizes at run time (sizes.py): a
        piece of a dynamic plan's bucket whose kept or reduced length is dynamic; else None (generated
        at the shape)."""
        found = bucket_analysis(self.piece, analyze)
        return found if found is not None and (isinstance(found[1].M, Expr) or isinstance(found[1].K, Expr)) else None

    def launches(self, knobs: ReductionKnobs) -> int:
        return 2 if knobs.split > 1 else 1

    # -- knobs -----------------------------------------------------------------------------------
    def candidates(self) -> list[ReductionKnobs]:
        if self.symbolic is not None:  # at the bucket's hint, one program per block of kept positions
            piece, a, origin = self.symbolic
            sizes = Sizes(origin)
            found = self._candidates(piece, a, sizes.hint(a.M), sizes.hint(a.K))
            return unique([dataclasses.replace(k, SPLIT=1) for k in found])
        return self._candidates(self.piece, self.a, self.a.M, self.a.K)

    def _candidates(self, piece: Piece, a: Analysis, M: int, K: int) -> list[ReductionKnobs]:
        """Knob sets of `a` at kept and reduced lengths M and K."""
        device = self.device
        pm, pk = pow2_at_least(M), pow2_at_least(K)
        if a.k_fast:  # rows: K contiguous, up to 4096 elements of a row per step
            bk = min(pk, 4096)
            bm = min(pm, max(1, 4096 // bk))
            # few rows: shorter steps, so that more programs can share a row (down to 1 KiB)
            while bk * a.elt > 1024 and _programs(M, K, bm, bk, device) < 3 * device.sm_count:
                bk //= 2
        else:  # columns: M contiguous, 128-256 B per row segment
            bm = min(pm, 64)
            bk = min(pk, max(1, 4096 // bm))
        base = (bm, bk)
        shapes = [base, (bm * 2, bk // 2), (bm // 2, bk * 2), (bm, bk * 2), (bm * 2, bk)]
        out: list[ReductionKnobs] = []
        for i, (m, k) in enumerate(shapes):
            m, k = max(1, min(m, pm)), max(1, min(k, pk))
            if m * k > MAX_TILE:
                continue
            split = _split(M, K, m, k, device)
            warps = _warps(m * k)
            variants = (
                [(split, warps)]
                if i
                else [
                    (split, warps),
                    (split, max(1, warps // 2)),
                    (max(1, split // 2), warps),
                    (split * 2 if split > 1 else 1, warps),
                ]
            )
            for j, (s, w) in enumerate(variants):
                s = min(s, -(-K // k))
                st = _stages(a, piece, M, K, m, k, s, device)
                for st_ in [st, 0] if i == j == 0 and st else [st]:  # the plain loop: an alternative
                    out.append(ReductionKnobs(BLOCK_M=m, BLOCK_K=k, SPLIT=s, num_warps=w, STAGES=st_))
        return unique(out)

    # -- source ----------------------------------------------------------------------------------
    def generate(self, knobs: ReductionKnobs) -> Generated:
        if self.symbolic is not None and knobs.split == 1:
            piece, a, origin = self.symbolic
            return self._generate(knobs, piece, a, Sizes(origin))
        return self._generate(knobs, self.piece, self.a, None)

    def _generate(self, knobs: ReductionKnobs, piece: Piece, a: Analysis, sizes: Sizes | None) -> Generated:
        """The kernels of `piece` analysed as `a`: with `sizes`, the symbolic piece whose sizes are
        run-time arguments (SPLIT 1: no combine launch)."""
        device = self.device
        text: Callable[[Any], str] = sizes.text if sizes is not None else str
        bm, bk = knobs.BLOCK_M, knobs.BLOCK_K
        M, K = a.M, a.K
        g = piece.graph
        externals = [*piece.inputs, *piece.outputs]
        if sizes is None:
            per_chunk = -(-K // knobs.split)
            chunk = -(-per_chunk // bk) * bk  # whole tiles per chunk
            split = -(-K // chunk)  # chunks that hold any of K
            big = M * K > INT32_LIMIT or any(
                1 + sum((d - 1) * s for d, s in zip(g.tensors[u].dim, g.tensors[u].stride)) > INT32_LIMIT
                for u in externals
            )
            m_now = M
        else:
            chunk, split = 0, 1
            big = sizes.needs_int64(g.tensors[u] for u in externals) or sizes.max(M * K) > INT32_LIMIT
            m_now = evaluate(M, sizes.env)
        tile = (bm, bk) if a.k_fast else (bk, bm)
        kaxis = 1 if a.k_fast else 0
        types = piece_types(piece)
        compute = compute_type(types)
        mflat = FlatAxes("m", a.kept, a.space, "mq", text)
        kflat = FlatAxes("k", a.reduced, a.space, "kq", text)
        idx = ReductionIndexer(mflat, kflat, a.k_fast, a.space)
        views = dict(a.views)
        tensors = a.tensors(piece)

        def ptr(u: int) -> str:
            v = views.get(u)
            return f"p{u}" if v is None else f"(p{v.base} + {text(v.offset)})" if v.offset else f"p{v.base}"

        em = Emitter(tensors, compute, idx, ptr=ptr, scalar=lambda u: f"s{u}")

        # k-invariant loads (per-channel parameters, scalars) once per program; a tensor read only
        # through views is loaded as they are
        read = {u for n in piece.nodes if n.kind not in VIEW_KINDS for u in n.input_uids()}
        for u in (*piece.inputs, *views):
            t = tensors[u]
            if u in read and not t.is_pass_by_value and idx.k_invariant(t):
                em.operand(u)
        hoisted, em.lines = em.lines, []
        reduced_uids = {r.out for r in a.reducers}
        rtypes = [_reducer_type(r, piece, compute) for r in a.reducers]
        for n in piece.nodes:
            if elementwise(n):
                em.emit(n)
        for u in piece.outputs:
            if u not in reduced_uids:
                em.store(u)
        loop, em.lines = em.lines, []
        for i, r in enumerate(a.reducers):
            v = em.typed(r.source, rtypes[i])  # a reduced input that no pointwise op reads is loaded here
            loop += em.lines
            em.lines = []
            ident = _IDENTITY[r.kind]
            loop += [
                f"r{i} = tl.where(mask, {_prep(r, v)}, {ident})",
                f"acc{i} = {_combine(r.kind, f'acc{i}', f'r{i}')}",
            ]

        inits = [
            f"acc{i} = tl.full([{tile[0]}, {tile[1]}], {_IDENTITY[r.kind]}, {_acc_type(r, rtypes[i])})"
            for i, r in enumerate(a.reducers)
        ]
        post: list[str] = []
        for i, r in enumerate(a.reducers):
            post += _reduce_lines(r.kind, f"acc{i}", f"red{i}", kaxis, tile)

        params, args = external_params(piece, externals)
        scratch_args: list[Arg] = []
        scratch_params: list[str] = []
        scratch_bytes = 0
        launches: list[Launch] = []
        combine_src = ""
        if split == 1:
            post += _store_reduced(a, piece, mflat, rtypes, {i: f"red{i}" for i in range(len(a.reducers))}, text)
        else:
            for i, r in enumerate(a.reducers):
                dt = _acc_type(r, rtypes[i]).removeprefix("tl.")
                scratch_params.append(f"part{i}")
                scratch_args.append(Arg(ArgKind.SCRATCH, offset=scratch_bytes, dtype=dt))
                post.append(f"tl.store(part{i} + pid_s * {M} + m, red{i}, mask=m_mask)")
                nbytes = split * M * (8 if dt == "float64" else 4)
                scratch_bytes += align_up(nbytes)
            combine_src, combine_launch = _combine_kernel(a, piece, rtypes, split, scratch_params, scratch_args, device)
            launches.append(combine_launch)

        k_vec = f"k0 + tl.arange(0, {bk})"
        bounds = f"0, {text(K)}, {bk}" if split == 1 else f"pid_s * {chunk}, pid_s * {chunk} + {chunk}, {bk}"
        stages = knobs.stages
        # tl.range(num_stages=S) software-pipelines the loop's loads (cp.async into shared memory: S - 1
        # tiles in flight per program); the interpreter ignores it
        loop_head = (
            f"for k0 in tl.range({bounds}, num_stages={stages}):" if stages > 1 else f"for k0 in range({bounds}):"
        )
        mask = "m_mask[:, None] & k_mask[None, :]" if a.k_fast else "k_mask[:, None] & m_mask[None, :]"
        pre = [f"pid_m = {program_id(0, big)}"]
        if split > 1:
            pre.append(f"pid_s = {program_id(1, big)}")
        pre += [f"m = pid_m * {bm} + tl.arange(0, {bm})", f"m_mask = m < {text(M)}"]
        in_loop = [
            f"k = ({k_vec}).to(tl.int64)" if big else f"k = {k_vec}",
            f"k_mask = k < {text(K)}",
            f"mask = {mask}",
            *kflat.lines,
            *loop,
        ]
        body = [*pre, *mflat.lines, *hoisted, *inits, loop_head, *indent(in_loop).split("\n"), *post]
        if sizes is not None:
            params, args = [*params, *sizes.params], [*args, *sizes.args()]
        signature = ", ".join([*params, *scratch_params])
        functions = [f"def kernel({signature}):\n{indent(body)}\n", combine_src]
        source = module_source(*functions) if sizes is None else module_source(sizes.declaration(), *functions)
        main = Launch(
            "kernel",
            (-(-m_now // bm), split),
            tuple([*args, *scratch_args]),
            (("num_warps", knobs.warps),),
            grid_expr=None if sizes is None else (sizes.grid(M, bm)[1], split),
        )
        return Generated(
            source, (main, *launches), scratch_bytes, frozenset({f"split={split}"} if split > 1 else set())
        )


def _reducer_type(r: Reducer, piece: Piece, compute: str) -> str:
    """The type reducer `r` accumulates in (products: fp64, _acc_type) and finishes in: its node's
    (expr.node_type), so that a cross-entropy's FLOAT sums stay fp32 beside its INT64 targets."""
    node = next(
        (
            n
            for n in piece.nodes
            if not elementwise(n) and r.source in n.input_uids() and (r.out is None or r.out in n.output_uids())
        ),
        None,
    )
    return compute if node is None else node_type(node, piece.graph.tensors, compute)


def _store_reduced(
    a: Analysis,
    piece: Piece,
    mflat: FlatAxes,
    types: list[str],
    values: dict[int, str],
    text: Callable[[Any], str] = str,
) -> list[str]:
    lines = []
    for i, r in enumerate(a.reducers):
        if r.out is None or r.out not in piece.outputs:
            continue
        desc = piece.tensor(r.out)
        off = mflat.offset(desc) or "tl.zeros_like(m)"
        val = to_storage(f"fin{i}", desc.data_type, types[i])
        lines += [
            f"fin{i} = {_finish(r, values[i], a.K, types[i], text)}",
            f"tl.store(p{r.out} + {off}, {val}, mask=m_mask)",
        ]
    return lines


def _combine_kernel(
    a: Analysis,
    piece: Piece,
    types: list[str],
    split: int,
    part_params: list[str],
    part_args: list[Arg],
    device: Device,
) -> tuple[str, Launch]:
    """Second launch: fold the [split, M] partials of every reducer, finish and store. Programs own
    BC kept positions (32 to 256: at least 2 programs per SM where M allows, each partial row segment
    >= 128 B) and load BS partial rows of them a step, BS covering every chunk where the tile
    (<= 8192 fp32 accumulators, fewer for several or fp64 reducers) allows: one round trip, not a
    loop of small loads."""
    M = a.M
    sms = max(1, device.sm_count)
    bc = min(pow2_at_least(M), 256)
    while bc > 32 and -(-M // bc) < 2 * sms:
        bc //= 2
    words = sum(2 if _acc_type(r, t) == "tl.float64" else 1 for r, t in zip(a.reducers, types))
    cap = max(bc, 1 << ((16384 // max(1, words)).bit_length() - 1))
    bs = min(pow2_at_least(split), max(1, cap // bc))
    outs = [r.out for r in a.reducers if r.out is not None and r.out in piece.outputs]
    params, args = external_params(piece, outs)
    mflat = FlatAxes("m", a.kept, a.space, "mq")
    body = [f"m = tl.program_id(0) * {bc} + tl.arange(0, {bc})", f"m_mask = m < {M}", f"s = tl.arange(0, {bs})"]
    loop = ["rows = s0 + s", "pmask = (rows < " + str(split) + ")[:, None] & m_mask[None, :]"]
    post: list[str] = []
    for i, r in enumerate(a.reducers):
        ident = _IDENTITY[r.kind]
        body.append(f"acc{i} = tl.full([{bs}, {bc}], {ident}, {_acc_type(r, types[i])})")
        loop += [
            f"q{i} = tl.load(part{i} + rows[:, None] * {M} + m[None, :], mask=pmask, other=0)",
            f"q{i} = tl.where(pmask, q{i}, {ident})",
            f"acc{i} = {_combine(r.kind, f'acc{i}', f'q{i}')}",
        ]
        post += _reduce_lines(r.kind, f"acc{i}", f"red{i}", 0, (bs, bc))
    post += _store_reduced(a, piece, mflat, types, {i: f"red{i}" for i in range(len(a.reducers))})
    body += [*mflat.lines, f"for s0 in range(0, {split}, {bs}):", *indent(loop).split("\n"), *post]
    src = f"def kernel_combine({', '.join([*params, *part_params])}):\n{indent(body)}\n"
    launch = Launch("kernel_combine", (-(-M // bc),), tuple([*args, *part_args]), (("num_warps", _warps(bs * bc)),))
    return src, launch


def _split(M: int, K: int, bm: int, bk: int, device: Device) -> int:
    """Programs along K: enough (m block, chunk) programs to fill the GPU (about 4 per SM) when the
    kept positions alone give fewer than 3 per SM, each chunk at least 2 tiles."""
    m_blocks = -(-M // bm)
    k_tiles = -(-K // bk)
    sms = max(1, device.sm_count)
    if m_blocks >= 3 * sms or k_tiles < 4:
        return 1
    return max(1, min(-(-4 * sms // m_blocks), k_tiles // 2))


def _stages(a: Analysis, piece: Piece, M: int, K: int, bm: int, bk: int, split: int, device: Device) -> int:
    """Pipeline depth of the main loop on the GPU (0: a plain loop): about 24 KiB of tiles in flight
    per program (2-5 tiles), where a program walks >= 2 tiles."""
    if not device.is_cuda:
        return 0
    per_chunk = -(-K // max(1, split))
    if -(-per_chunk // bk) < 2:  # tiles a program walks
        return 0
    tensors = a.tensors(piece)
    elt = (
        sum(
            tensors[u].data_type.itemsize
            for u in (*piece.inputs, *dict(a.views))
            if tensors[u].dim == a.space and not tensors[u].is_pass_by_value
        )
        or a.elt
    )
    return 1 + max(1, min(5, round(24576 / (bm * bk * elt))))


def _programs(M: int, K: int, bm: int, bk: int, device: Device) -> int:
    return -(-M // bm) * _split(M, K, bm, bk, device)


def _warps(tile: int) -> int:
    """About 16 elements per thread, 1 to 8 warps."""
    return max(1, min(8, pow2_at_least(max(1, tile // 512))))


TEMPLATE = ReductionTemplate()
