"""The running sum (cumsum) along one axis as a fused piece, one launch: a pointwise prologue computing
its input (RoBERTa's position ids scan `input_ids != pad`), and a pointwise epilogue on its output
(`* mask + pad`); tensors in memory may be read through views (as the rownorm template reads them).

Each program takes ROWS rows (positions of the kept axes, any strides) and walks the scanned axis in
chunks of BLOCK elements (from its end for a reverse scan): a chunk's sums are `tl.cumsum` along the
tile's columns plus the row's carry (the sum of the chunks before it), which the chunk's total then
advances. The sums run in the piece's compute type: fp64 where a value is an integer (exact, as the
float64 reference), else fp32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

from ....core.config import Support
from ....core.device import Device
from ....core.ir import ShapeOrigin
from ....core.piece import Piece
from ....core.symbolic import Expr
from ....ops.scan import Cumsum
from ..knobs import ScanKnobs
from ..sizes import Sizes, above_one, bucket_analysis
from ._norm_common import (
    Comp,
    Fusion,
    NormGen,
    NormMatch,
    NormTemplate,
    Params,
    RowIndexer,
    analyze,
    memory_order,
    nest,
    pow2_ceil,
)
from .base import Generated, Launch, indent, unique

KINDS = ("cumsum",)


@dataclass(frozen=True)
class ScanGeometry:
    fusion: Fusion
    dims: tuple[int, ...]
    row_axes: tuple[int, ...]  # kept axes of size > 1, memory order
    axis: int  # the scanned axis

    @property
    def R(self) -> int:
        return math.prod(self.dims[a] for a in self.row_axes)

    @property
    def L(self) -> int:
        return self.dims[self.axis]

    @property
    def reverse(self) -> bool:
        return self.fusion.norm.op_as(Cumsum).reverse


def geometry(fusion: Fusion) -> ScanGeometry:
    dims, axis = fusion.x.dim, fusion.norm.op_as(Cumsum).axis
    rows = memory_order([a for a in range(len(dims)) if a != axis and above_one(dims[a])], fusion.x.stride)
    return ScanGeometry(fusion, dims, rows, axis)


def candidate_knobs(g: ScanGeometry, device: Device) -> list[ScanKnobs]:
    """GPU: the whole axis in one step up to 1024 elements (longer ones in chunks of 1024), rows up to
    4096 elements a tile; then chunks of 256. Interpreter: small tiles, several programs and (the
    alternative) several chunks, so the loop, the carry and the masks all run."""
    full = pow2_ceil(g.L)
    if not device.is_cuda:
        return unique(
            [
                ScanKnobs(ROWS=min(2, pow2_ceil(g.R)), BLOCK=min(full, 16)),
                ScanKnobs(ROWS=min(4, pow2_ceil(g.R)), BLOCK=min(full, 4)),
            ]
        )
    out = []
    for block in (min(full, 1024), min(full, 256)):
        rows = max(1, min(pow2_ceil(g.R), 4096 // block))
        out.append(ScanKnobs(ROWS=rows, BLOCK=block, num_warps=8 if rows * block >= 4096 else 4))
    return unique(out)


class _Gen(NormGen):
    g: ScanGeometry

    def generate(self) -> Generated:
        g, acc, knobs, text = self.g, self.compute, self.k, self.text
        params = Params()
        masks = {frozenset(): None, frozenset({0}): "rmask", frozenset({1}): "jmask", frozenset({0, 1}): "mask"}
        col = Comp((g.axis,) if above_one(g.L) else (), "jj", 1)
        indexer = RowIndexer(g.dims, [Comp(g.row_axes, "rr", 0), col], masks, {0: "z0", 1: "z1"}, text)
        em = self.emitter(indexer, params)
        for n in g.fusion.prologue:
            em.emit(n)
        xv = em.operand(self.x_uid)
        em.lines += [
            f"xm = tl.where(mask, {xv}, 0.0)",
            f"cs = tl.cumsum(xm, axis=1, reverse={g.reverse}) + carry",
            "carry += tl.sum(xm, axis=1, keep_dims=True)",
        ]
        self.emit_output(em, "cs")
        n_chunks = (g.L + knobs.BLOCK - 1) // knobs.BLOCK
        chunks = text(n_chunks)
        last = str(n_chunks - 1) if isinstance(n_chunks, int) else f"{chunks} - 1"
        start = f"({last} - c) * BLOCK" if g.reverse else "c * BLOCK"
        cols = f"{start} + tl.arange(0, BLOCK)[None, :]"
        loop = [
            f"jj = ({cols}).to(tl.int64)" if self.big else f"jj = {cols}",
            f"jmask = jj < {text(g.L)}",
            "mask = rmask & jmask",
            "z1 = jj * 0",
            *em.lines,
        ]
        body = [
            f"rr = {self.pid()} * ROWS + tl.arange(0, ROWS)[:, None]",
            f"rmask = rr < {text(g.R)}",
            "z0 = rr * 0",
            f"carry = tl.zeros([ROWS, 1], {acc})",
            *nest(f"for c in range(0, {chunks}):", loop),
        ]
        self.add_sizes(params)
        src = params.signature("kernel_scan", ["ROWS", "BLOCK"]) + "\n" + indent(body)
        if self.sizes is None:
            grid, grid_expr = -(-g.R // knobs.ROWS), None
        else:
            grid, programs = self.sizes.grid(g.R, knobs.ROWS)
            grid_expr = (programs,)
        launch = Launch(
            "kernel_scan",
            (grid,),
            tuple(params.args),
            (("ROWS", knobs.ROWS), ("BLOCK", knobs.BLOCK), ("num_warps", knobs.warps)),
            grid_expr=grid_expr,
        )
        return Generated(self.module(src), (launch,))


class ScanTemplate(NormTemplate):
    name = "scan"
    priority = 29
    main_kinds = KINDS
    knob_class = ScanKnobs

    def _geometry(self, piece: Piece) -> ScanGeometry | Support:
        if "cumsum" not in piece.kind_set:  # (known without a pass: the partitioner asks per op)
            return Support.no("the scan template needs a cumsum op in the piece")
        fusion = analyze(piece, KINDS, self.name, views=True)
        return fusion if isinstance(fusion, Support) else geometry(fusion)


class ScanMatch(NormMatch):
    g: ScanGeometry

    @cached_property
    def symbolic(self) -> tuple[Piece, ScanGeometry, ShapeOrigin] | None:
        """The symbolic piece and geometry where the kernel takes its sizes at run time (sizes.py): a
        piece of a dynamic plan's bucket whose rows or scanned length are dynamic; else None (generated
        at the shape)."""

        def scan_geometry(piece: Piece) -> ScanGeometry | Support:
            fusion = analyze(piece, KINDS, self.template.name, views=True)
            return fusion if isinstance(fusion, Support) else geometry(fusion)

        found = bucket_analysis(self.piece, scan_geometry)
        return found if found is not None and (isinstance(found[1].R, Expr) or isinstance(found[1].L, Expr)) else None

    def candidates(self) -> list[ScanKnobs]:
        if self.symbolic is not None:  # at the bucket's hint: the same knobs for every shape of it
            _, g, origin = self.symbolic
            sizes = Sizes(origin)
            return candidate_knobs(
                ScanGeometry(g.fusion, tuple(sizes.hint(d) for d in g.dims), g.row_axes, g.axis), self.device
            )
        return candidate_knobs(self.g, self.device)

    def generate(self, knobs: ScanKnobs) -> Generated:
        if self.symbolic is not None:
            piece, g, origin = self.symbolic
            return _Gen(piece, g, knobs, Sizes(origin)).generate()
        return _Gen(self.piece, self.g, knobs).generate()


ScanTemplate.match_class = ScanMatch
TEMPLATE = ScanTemplate()
