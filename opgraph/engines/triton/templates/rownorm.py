"""Layernorm and rmsnorm, forward and backward, as fused pieces, where the normalized axes fit a
program (hidden <= 16384 elements), with a pointwise prologue on the full-size inputs (a residual add
before the norm) and a pointwise epilogue on the full-size output. Tensors in memory may be read
through slices, transposes and reshapes (a layernorm of a reshaped residual stream, of a permuted
NCHW activation), and full-size values written through transposes and reshapes (permuted back).

  forward:  one launch: x is read once, mean / inv_variance and y (and the epilogue's outputs)
            written once. Either a [ROWS, BLOCK] tile per program (BLOCK = next power of 2 of hidden;
            the GPU default), or (knob FP) FP programs (2 per SM) each walking a contiguous range of
            row tiles in a software-pipelined loop (knob ST: `tl.range(num_stages=ST)`, so the next
            tiles' loads are in flight while this tile's row reductions run), scale and bias loaded
            once per program.
  backward: launch 1, a grid of about 2 programs per SM, each walking a contiguous range of rows
            (software-pipelined, ST; or register double buffering, PF): dx per row (its two row
            sums in one reduction), and fp32 partial dscale / dbias rows kept in registers and
            stored once per program to scratch (deterministic, no atomics); launch 2 sums the
            partial rows, BH columns a program, all the rows of a column block loaded at once.

Rows are the kept axes, columns the normalized axes (any strides: an offset is computed per tensor
from its coordinates, or from the flat row / column index where the tensor packs those axes in one
run). Where the columns are one contiguous run of the input (the usual case), a row is read with
vector loads; where they are not (channels of an NCHW tensor: RowGeometry.strided), each column is
read with a stride, along the rows of the tile (the backward then takes tiles of rows too).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from ....core.config import Support
from ....core.device import Device
from ....core.ir import ShapeOrigin
from ....core.piece import Piece
from ....core.symbolic import Expr
from ....memory.workspace import align_up
from ..knobs import RownormKnobs
from ..sizes import Sizes, bucket_analysis
from ._norm_common import (
    Comp,
    Fusion,
    NormGen,
    NormMatch,
    NormTemplate,
    Params,
    PrefetchIndexer,
    RowIndexer,
    above_one,
    analyze,
    is_run,
    loop_header,
    memory_order,
    nest,
    pow2_ceil,
    prefetched,
    scalar_expr,
)
from .base import Generated, Launch, indent, module_source, unique

SHORT = {"dscale": "ds", "dbias": "db"}
KINDS = ("layernorm", "layernorm_backward", "rmsnorm", "rmsnorm_backward")
MAX_HIDDEN = 16384  # elements of a row held in registers


@dataclass(frozen=True)
class RowGeometry:
    fusion: Fusion
    dims: tuple[int, ...]
    row_axes: tuple[int, ...]  # kept axes, memory order
    col_axes: tuple[int, ...]  # normalized axes, memory order (packed, innermost stride 1)

    @property
    def R(self) -> int:
        return math.prod(self.dims[a] for a in self.row_axes)

    @property
    def H(self) -> int:
        return math.prod(self.dims[a] for a in self.col_axes)

    @property
    def kind(self) -> str:
        return self.fusion.norm.kind

    @property
    def strided(self) -> bool:
        """Whether a row of the input is not one contiguous run of memory (a layernorm over the channels
        of an NCHW tensor, or over the last axis of a transposed one): each column is then read with a
        stride, and tiles of many rows keep the loads coalesced along the rows."""
        x = self.fusion.x
        return bool(self.col_axes) and not (
            is_run(self.col_axes, self.dims, x.stride) and x.stride[self.col_axes[-1]] == 1
        )


def geometry(fusion: Fusion, piece: Piece) -> RowGeometry | Support:
    node, x = fusion.norm, fusion.x
    dims = x.dim
    ref = next(
        (v for r in ("scale", "bias") if r in node.op.input_roles() for v in [node.input(r)] if isinstance(v, int)),
        None,
    )
    if ref is None:
        normalized = [a for a in range(1, len(dims))]
    else:
        rd = piece.tensor(ref).dim
        normalized = [a for a in range(len(dims)) if rd[a] == dims[a]]
    cols = memory_order([a for a in normalized if above_one(dims[a])], x.stride)
    rows = memory_order([a for a in range(len(dims)) if a not in normalized and above_one(dims[a])], x.stride)
    g = RowGeometry(fusion, dims, rows, cols)
    if g.H > MAX_HIDDEN:
        return Support.no(
            f"{node.label()} normalizes {g.H} elements per row, more than the {MAX_HIDDEN} a "
            "program holds in registers; the torch or reference engine runs it",
            node,
        )
    return g


def _knobs(
    g: RowGeometry,
    device: Device,
    backward: bool = False,
    *,
    tile: int | None = None,
    warps: int | None = None,
    per_sm: int | None = None,
    stages: int | None = None,
    prefetch: int = 0,
    persist: int | None = None,
) -> RownormKnobs:
    block = pow2_ceil(g.H)
    if not device.is_cuda:  # interpreter: 2 rows a tile, a few programs, so the loops and masks all run
        return RownormKnobs(
            BLOCK=block,
            ROWS=min(2, pow2_ceil(g.R)),
            W=4,
            PROGRAMS=min(3, g.R),
            RB=2 if g.R > 2 else 1,
            BW=4,
            ST=stages or 0,
            PF=prefetch,
            FP=min(2, g.R) if persist else 0,
            BH=min(block, 8),
            BG=2,
            SW=4,
        )
    # programs per SM: 2 where a program holds <= 16 elements of a row (tile) a thread in <= 16 warps
    # (~64 registers at 16 warps, ~110 at 8: two fit an SM at once), else 1 (two would not be resident
    # together: a second wave of equally long programs)
    if backward:
        persist, stages = 0, 3 if stages is None else stages
        per_sm = per_sm or (2 if block <= 4096 else 1)
    else:
        persist = (2 if block <= 8192 else 1) if persist is None else persist
        stages = 4 if stages is None else stages
        per_sm = per_sm or 2
    tile = tile or (8192 if persist else 16384)
    rows = max(1, min(pow2_ceil(g.R), tile // block))
    # a strided row (g.strided): the backward's row loop takes tiles of rows too (2048 elements, 8 a
    # thread: x, dy and the two partial sums in registers, pipelined without spilling), each column's
    # elements of consecutive rows read together
    row_block = max(1, min(pow2_ceil(g.R), 2048 // block)) if backward and g.strided else 1
    programs = per_sm * device.sm_count
    # launch 2 sums the launch-1 programs' partial rows: 32 columns (128 B of fp32) a program, every
    # partial row of them loaded at once (<= 8192 elements a tile, 8 warps)
    rpp = -(-g.R // max(1, min(programs, g.R)))
    partial_rows = -(-g.R // rpp)
    bh = min(block, 32)
    bg = max(2, min(pow2_ceil(partial_rows), 8192 // bh))
    return RownormKnobs(
        BLOCK=block,
        ROWS=rows,
        W=warps or min(16, max(4, rows * block // 512)),
        PROGRAMS=programs,
        RB=row_block,
        BW=warps or min(16, max(4, row_block * block // 256 if row_block > 1 else block // 512)),
        ST=0 if prefetch else stages,
        PF=prefetch,
        FP=persist * device.sm_count,
        BH=bh,
        BG=bg,
        SW=max(1, min(8, bh * bg // 1024)),
    )


def candidate_knobs(g: RowGeometry, device: Device, backward: bool) -> list[RownormKnobs]:
    """Forward: one tile of rows per program (8192 elements: 2 rows of 4096), 8 warps (32 elements a
    thread), both row reductions and the stores in registers: the autotuner's choice for layernorm
    [8192, 4096] bf16 on an H100, about 15% faster than the persistent form below
    (bench/results/triton-preferences.md#rownorm-forward). The persistent form: 2 programs per SM, each walking a contiguous range of row tiles (2 rows of 4096,
    16 warps) in a software-pipelined loop (ST 4: the next 3 tiles in flight while this tile's
    reductions and stores run), scale and bias loaded once per program. Backward: 2 programs per SM
    each walking a contiguous range of rows one at a time, 8 elements a thread, the row loop
    software-pipelined (ST 3: the next 2 rows of x and dy, 32 KiB, in flight while this row's
    reductions and dx store run; the plain loop waited for every row), c1 and c2 reduced together (one
    cross-warp exchange); then 32 columns a program (128 programs for 4096) sum the partial rows in one
    step. The alternatives: forward the persistent form and its shapes, one tile of 4096 or 16384
    elements; backward 1 or 4 programs per SM, 16 warps, other pipeline depths, the plain loop,
    register double buffering (PF)."""
    variants: list[dict[str, Any]] = (
        [{}] if backward or not device.is_cuda else [{"persist": 0, "tile": 8192, "warps": 8}, {}]
    )
    if device.is_cuda:
        variants += (
            [
                {"per_sm": 1},
                {"per_sm": 4},
                {"warps": 16},
                {"stages": 2},
                {"stages": 4},
                {"per_sm": 1, "stages": 4},
                {"stages": 0},
                {"prefetch": 1},
                {"prefetch": 1, "warps": 16},
            ]
            if backward
            else [
                {"persist": 0},
                {"persist": 0, "tile": 4096, "warps": 8},
                {"persist": 0, "tile": 8192, "warps": 8},
                {"persist": 0, "tile": 16384, "warps": 8},
                {"stages": 3},
                {"tile": 8192, "warps": 8, "stages": 3},
                {"persist": 4, "tile": 4096, "warps": 8},
                {"stages": 0},
            ]
        )
    else:
        variants += [{"prefetch": 1}] if backward else [{"persist": 1}, {"persist": 1, "stages": 2}]
    return unique([_knobs(g, device, backward, **v) for v in variants])


class _Gen(NormGen):
    g: RowGeometry

    def __init__(self, piece: Piece, g: RowGeometry, knobs: RownormKnobs, sizes: Sizes | None = None) -> None:
        super().__init__(piece, g, knobs, sizes)
        self.rms = g.kind.startswith("rmsnorm")
        self.backward = g.kind.endswith("_backward")
        self.grad_uid = self.node.input("grad") if self.backward else None

    def indexers(self, params: Params, prefetch: bool = False):
        """The tile's emitter ([rows, BLOCK], rows rr, columns jj) and a per-row emitter (stats). With
        `prefetch` (the backward's row loop), their loads of row data read registers loaded one
        iteration ahead, over the next rows rn (see PrefetchIndexer); the indexers are returned too."""
        g = self.g
        row, col = Comp(g.row_axes, "rr", 0), Comp(g.col_axes, "jj", 1)
        tile_masks = {frozenset(): None, frozenset({0}): "rmask", frozenset({1}): "jmask", frozenset({0, 1}): "mask"}
        row_masks = {frozenset(): None, frozenset({0}): "rmask"}
        tile: RowIndexer
        per_row: RowIndexer
        if prefetch:
            nrow = Comp(g.row_axes, "rn", 0)
            tile = PrefetchIndexer(
                g.dims,
                [row, col],
                tile_masks,
                {0: "z0", 1: "z1"},
                {"rr"},
                RowIndexer(
                    g.dims,
                    [nrow, col],
                    {frozenset(): None, frozenset({0}): "rnmask", frozenset({1}): "jmask", frozenset({0, 1}): "nmask"},
                    text=self.text,
                ),
                self.text,
            )
            per_row = PrefetchIndexer(
                g.dims,
                [row],
                row_masks,
                {0: "z0"},
                {"rr"},
                RowIndexer(g.dims, [nrow], {frozenset(): None, frozenset({0}): "rnmask"}, text=self.text),
                self.text,
            )
        else:
            tile = RowIndexer(g.dims, [row, col], tile_masks, {0: "z0", 1: "z1"}, self.text)
            per_row = RowIndexer(g.dims, [row], row_masks, {0: "z0"}, self.text)
        return (
            self.emitter(tile, params),
            self.emitter(per_row, params),
            [tile, per_row],
        )

    def param(self, em, role: str) -> str | None:
        v = self.node.input(role) if role in self.node.op.input_roles() else None
        return em.operand(v) if isinstance(v, int) else None

    # forward ----------------------------------------------------------------------------------------
    def forward(self) -> Generated:
        """One [ROWS, BLOCK] tile per program; or, with FP (a program count), FP programs each walking
        a contiguous range of row tiles in a software-pipelined loop (ST stages), scale and bias
        loaded once per program."""
        g, k = self.g, self.k
        params = Params()
        acc = self.compute
        block, rows = k.BLOCK, k.ROWS
        persistent = (k.FP or 0) > 0
        em, em_row, _ = self.indexers(params)
        em_par = em
        if persistent:
            em_par = self.emitter(
                RowIndexer(
                    g.dims, [Comp(g.col_axes, "jj", 1)], {frozenset(): None, frozenset({1}): "jmask"}, text=self.text
                ),
                params,
            )
        # scale and bias first: their loads are in flight with x's (after the row reductions, whose
        # barriers the compiler does not move loads across, they would add an L2 round trip)
        sc, bi = self.param(em_par, "scale"), self.param(em_par, "bias")
        for n in g.fusion.prologue:
            em.emit(n)
        xv = em.operand(self.x_uid)
        eps = scalar_expr(self.node.input("epsilon"), self.piece.graph.tensors, params, acc)
        h = float(g.H)
        lines = [f"xm = tl.where(mask, {xv}, 0.0)"]
        if self.rms:
            lines += [
                f"inv = 1.0 / tl.sqrt(tl.sum(xm * xm, axis=1, keep_dims=True) / {h!r} + {eps})",
                "xhat = xm * inv",
            ]
        else:
            lines += [
                f"mean = tl.sum(xm, axis=1, keep_dims=True) / {h!r}",
                "xc = tl.where(mask, xm - mean, 0.0)",
                f"inv = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=1, keep_dims=True) / {h!r} + {eps})",
                "xhat = xc * inv",
            ]
        em.lines += lines
        value = "xhat"
        if sc is not None:
            value = f"{value} * {sc}"
        if bi is not None:
            value = f"{value} + {bi}"
        self.emit_output(em, value)
        for role, name in (("mean", "mean"), ("inv_variance", "inv")):
            self.store_result(em_row, role, name)
        tiles = -(-self.at_shape(g.R) // rows)
        if persistent:
            programs = max(1, min(k.FP, tiles))
            rpp = -(-tiles // programs) * rows
            programs = -(-g.R // rpp)
            loop = [
                "rr = r0 + tl.arange(0, ROWS)[:, None]",
                "rmask = rr < r_hi",
                "mask = rmask & jmask",
                "z0 = rr * 0",
                *em.lines,
                *em_row.lines,
            ]
            body = [
                f"r_lo = {self.pid()} * {rpp}",
                f"r_hi = tl.minimum(r_lo + {rpp}, {g.R})",
                "jj = tl.arange(0, BLOCK)[None, :]",
                f"jmask = jj < {g.H}",
                "z1 = jj * 0",
                *em_par.lines,
                *nest(loop_header("r0", "r_lo", "r_hi", "ROWS", (k.ST or 0)), loop),
            ]
        else:
            programs = tiles
            body = [
                f"rr = {self.pid()} * ROWS + tl.arange(0, ROWS)[:, None]",
                f"rmask = rr < {self.text(g.R)}",
                "jj = tl.arange(0, BLOCK)[None, :]",
                f"jmask = jj < {g.H}",
                "mask = rmask & jmask",
                "z0 = rr * 0",
                "z1 = jj * 0",
                *em.lines,
                *em_row.lines,
            ]
        self.add_sizes(params)
        src = params.signature("kernel_rownorm", ["ROWS", "BLOCK"]) + "\n" + indent(body)
        launch = Launch(
            "kernel_rownorm",
            (programs,),
            tuple(params.args),
            (("ROWS", rows), ("BLOCK", block), ("num_warps", k.W)),
            # (a bucket's kernel walks one tile a program: not persistent)
            grid_expr=None if self.sizes is None or persistent else (self.sizes.grid(g.R, rows)[1],),
        )
        return Generated(self.module(src), (launch,))

    # backward -------------------------------------------------------------------------------------
    def backward_pass(self) -> Generated:
        g, k = self.g, self.k
        params = Params()
        acc = self.compute
        block, rb = k.BLOCK, k.RB
        programs = max(1, min(k.PROGRAMS, -(-g.R // rb)))
        rpp = -(-g.R // programs)
        programs = -(-g.R // rpp)
        h = float(g.H)
        partial_roles = [r for r in ("dscale", "dbias") if self.stored(r) is not None]
        stages, prefetch = (k.ST or 0), bool(k.PF)
        em, em_row, idx = self.indexers(params, prefetch)
        for n in g.fusion.prologue:
            em.emit(n)
        xv, dy = em.operand(self.x_uid), em.operand(self.grad_uid)
        # scale is the same for every row: loaded once, before the row loop
        em_col = self.emitter(
            RowIndexer(g.dims, [Comp(g.col_axes, "jj", 1)], {frozenset(): None, frozenset({1}): "jmask"}),
            params,
        )
        gamma = self.param(em_col, "scale")
        inv = em_row.operand(self.node.input("inv_variance"))
        loop = ["rr = r0 + tl.arange(0, RB)[:, None]", "rmask = rr < r_hi", "mask = rmask & jmask", "z0 = rr * 0"]
        loop += em_row.lines
        em_row.lines.clear()
        math_lines = [f"xm = tl.where(mask, {xv}, 0.0)", f"dym = tl.where(mask, {dy}, 0.0)", f"gm = dym * {gamma}"]
        if self.rms:
            math_lines += [f"r = {inv}", f"c = tl.sum(gm * xm, axis=1, keep_dims=True) / {h!r}", "xhat = xm * r"]
            dx = "r * (gm - xm * r * r * c)"
        else:
            mean = em_row.operand(self.node.input("mean"))
            loop += em_row.lines
            # both row sums in one reduction: one cross-warp exchange (and its barriers) per row, not two
            math_lines += [
                f"xhat = tl.where(mask, (xm - {mean}) * {inv}, 0.0)",
                "c1, c2 = tl.split(tl.sum(tl.join(xhat * gm, gm), axis=1, keep_dims=True))",
                f"c1 = c1 / {h!r}",
                f"c2 = c2 / {h!r}",
            ]
            dx = f"(gm - (xhat * c1 + c2)) * {inv}"
        em.lines += math_lines
        if "dscale" in partial_roles:
            em.lines.append("a_ds += dym * xhat")
        if "dbias" in partial_roles:
            em.lines.append("a_db += dym")
        self.emit_output(em, dx)
        loop += em.lines

        def nxt(start: str) -> list[str]:
            return [f"rn = {start} + tl.arange(0, RB)[:, None]", "rnmask = rn < r_hi", "nmask = rnmask & jmask"]

        before, loop = prefetched(idx, nxt("r_lo"), nxt("r0 + RB"), loop)
        body = [
            f"pid = {self.pid()}",
            "jj = tl.arange(0, BLOCK)[None, :]",
            f"jmask = jj < {g.H}",
            "z1 = jj * 0",
            f"r_lo = pid * {rpp}",
            f"r_hi = tl.minimum(r_lo + {rpp}, {g.R})",
            *em_col.lines,
            *(f"a_{SHORT[r]} = tl.zeros([RB, BLOCK], {acc})" for r in partial_roles),
            *before,
            *nest(loop_header("r0", "r_lo", "r_hi", "RB", 0 if prefetch else stages), loop),
        ]
        offsets, off = {}, 0
        for role in partial_roles:
            offsets[role] = off
            off += align_up(programs * g.H * self.acc_bytes)
        for role in partial_roles:
            q = params.scratch(f"q_{role}", offsets[role], self.scratch_dtype)
            body.append(
                f"tl.store({q} + pid * {g.H} + jj, tl.sum(a_{SHORT[role]}, axis=0, keep_dims=True), mask=jmask)"
            )
        sources = [params.signature("kernel_rownorm_bwd", ["RB", "BLOCK"]) + "\n" + indent(body)]
        launches = [
            Launch(
                "kernel_rownorm_bwd",
                (programs,),
                tuple(params.args),
                (("RB", rb), ("BLOCK", block), ("num_warps", k.BW)),
            )
        ]
        if partial_roles:
            src, launch = self.sum_partials(partial_roles, offsets, programs)
            sources.append(src)
            launches.append(launch)
        return Generated(module_source(*sources), tuple(launches), off)

    def sum_partials(self, roles: list[str], offsets: dict[str, int], programs: int) -> tuple[str, Launch]:
        g, k = self.g, self.k
        params = Params()
        bh = k.BH
        bg = k.BG or max(2, min(pow2_ceil(programs), max(8, 4096 // bh)))
        col = Comp(g.col_axes, "jj", 1)
        em = self.emitter(
            RowIndexer(g.dims, [col], {frozenset(): None, frozenset({1}): "jmask"}, {1: "z1"}),
            params,
        )
        body = [
            f"jj = {self.pid()} * BH + tl.arange(0, BH)[None, :]",
            f"jmask = jj < {g.H}",
            "z1 = jj * 0",
            "gg0 = tl.arange(0, BG)[:, None]",
        ]
        body += [f"t_{SHORT[r]} = tl.zeros([1, BH], {self.compute})" for r in roles]
        loop = ["gg = g0 + gg0", f"m = (gg < {programs}) & jmask"]
        for role in roles:
            q = params.scratch(f"q_{role}", offsets[role], self.scratch_dtype)
            loop.append(
                f"t_{SHORT[role]} += tl.sum(tl.load({q} + gg * {g.H} + jj, mask=m, other=0.0), axis=0, keep_dims=True)"
            )
        body += nest(f"for g0 in range(0, {programs}, BG):", loop)
        for role in roles:
            self.store_result(em, role, f"t_{SHORT[role]}")
        body += em.lines
        src = params.signature("kernel_rownorm_sum", ["BH", "BG"]) + "\n" + indent(body)
        launch = Launch(
            "kernel_rownorm_sum", (-(-g.H // bh),), tuple(params.args), (("BH", bh), ("BG", bg), ("num_warps", k.SW))
        )
        return src, launch


class RownormTemplate(NormTemplate):
    name = "rownorm"
    priority = 31
    main_kinds = ("layernorm", "layernorm_backward", "rmsnorm", "rmsnorm_backward")
    knob_class = RownormKnobs

    def _geometry(self, piece: Piece) -> RowGeometry | Support:
        fusion = analyze(piece, KINDS, self.name, views=True)
        if isinstance(fusion, Support):
            return fusion
        return geometry(fusion, piece)


class RownormMatch(NormMatch):
    g: RowGeometry

    @cached_property
    def symbolic(self) -> tuple[Piece, RowGeometry, ShapeOrigin] | None:
        """The symbolic piece and geometry where the kernel takes its sizes at run time (sizes.py): a
        forward of a dynamic plan's bucket whose rows are dynamic and whose normalized length is not;
        else None (generated at the shape)."""
        if self.g.kind.endswith("_backward"):
            return None

        def row_geometry(piece: Piece) -> RowGeometry | Support:
            fusion = analyze(piece, KINDS, self.template.name)
            return geometry(fusion, piece) if not isinstance(fusion, Support) else fusion

        found = bucket_analysis(self.piece, row_geometry)
        return found if found is not None and isinstance(found[1].H, int) and isinstance(found[1].R, Expr) else None

    def candidates(self) -> list[RownormKnobs]:
        if self.symbolic is not None:  # at the bucket's hint, one tile per program (no persistent walk)
            _, g, origin = self.symbolic
            sizes = Sizes(origin)
            hint = RowGeometry(g.fusion, tuple(sizes.hint(d) for d in g.dims), g.row_axes, g.col_axes)
            return [k for k in candidate_knobs(hint, self.device, False) if not k.FP]
        return candidate_knobs(self.g, self.device, self.g.kind.endswith("_backward"))

    def generate(self, knobs: RownormKnobs) -> Generated:
        if self.symbolic is not None and not knobs.FP:
            piece, g, origin = self.symbolic
            return _Gen(piece, g, knobs, Sizes(origin)).forward()
        gen = _Gen(self.piece, self.g, knobs)
        return gen.backward_pass() if gen.backward else gen.forward()


RownormTemplate.match_class = RownormMatch
TEMPLATE = RownormTemplate()
