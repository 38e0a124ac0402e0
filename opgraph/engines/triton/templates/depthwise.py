"""Depthwise (and any one-channel-per-group) conv_fprop as a memory-bound stencil, not a
degenerate GEMM.

Output channel k reads input channel k // (K / C) only, so there is no reduction over channels and
no tl.dot: each tap is a multiply-add of a shifted image tile by the tap's [BLOCK_N] weights,
accumulated in fp32 (int32 for int8). Two kernels:

* **row strips** (knob ROWS > 0; 2-D convs with unit stride and dilation along H, and no reduction
  over channels): a program owns BLOCK_W output pixels along W x BLOCK_N channels of ROWS
  consecutive output rows of one image. It walks the input rows once, top to bottom: each input row
  is loaded S times (one per filter column, shifted along W; the shifted copies are cache hits) and
  feeds the R output rows it touches, whose accumulators roll down; an output row is complete after
  its last filter row and goes through the epilogue at once. The weights (up to ROW_TAPS taps; with
  WLOAD=1, any filter, they are loaded again at every row, from L1) and per-channel epilogue
  operands are loaded once per program (not per tap and tile), each input element is converted to
  fp32 S times (not R x S) and the row loop is software-pipelined (num_stages: rows ahead in
  flight). Reductions along rows (genstats) accumulate per program. Knobs: ROWS, BLOCK_W (pixels
  per strip, a power of two), BLOCK_N, num_warps, num_stages, MAXNREG (a register cap for ptxas:
  128 keeps two 8-warp programs per SM, see `RowStrips.candidates`) and WLOAD.
* **pixel tiles** (ROWS = 0, any geometry): a program owns a tile of BLOCK_M output pixels
  (flattened) x BLOCK_N channels and, for every filter tap (unrolled up to UNROLL_TAPS), loads the
  shifted image tile (zero outside the image, after the prologue), multiplies it by the tap's
  weights and accumulates. The tile's input addresses are computed once, each tap adding its shift
  (a constant the load folds in). With WCOPY=1 a launch before the kernel writes the filter as fp32
  [taps, K], so that a tap's BLOCK_N weights are one vector load, not one scalar load and conversion
  per channel (a [K, 1, R, S] filter puts a tap's channels R x S elements apart).

With NHWC the channel axis is contiguous, so each row of a tile is one vector load; the taps
re-read neighbouring pixels, which the L1/L2 caches serve, so DRAM sees the image about once. A
7x7 filter makes the kernel bound by issuing instructions, not by the bytes: a multiply-add and a
conversion per element and tap, the loads and masks shared by a thread's 8 channels. The shared
epilogue (bias, activations, stores, genstats) follows.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar

from ....core.config import NumericalNote, Support
from ....core.dtypes import DataType
from ....core.errors import AttributeValueError
from ....core.ir import Node
from ....core.piece import Piece
from ....core.symbolic import SymInt
from ....ops.conv import ConvFprop, ConvolutionMode
from ..casts import from_storage
from ..gemm import (
    Context,
    DotKind,
    MainLoop,
    OutputSpace,
    Signature,
    Strategy,
    TileIndexer,
    TileMatch,
    TileTemplate,
    Tiling,
    decompose,
    epilogue,
    input_taps,
    needs_int64,
    operand_tile,
    preload_lines,
)
from ..knobs import RowStripKnobs, TileKnobs
from .base import Generated, Launch, pow2_at_least

UNROLL_TAPS = 32  # filters with more taps loop over all axes but the last, which unrolls
UNROLL_MAX = 49  # the most taps UNROLL=1 unrolls (7x7: Triton 3.6's sm_90 code for them, 112 registers)
ROW_TAPS = 9  # the row-strip kernel keeps R x S weight vectors in registers up to 3x3 (more: WLOAD=1)
# WLOAD=1 holds R accumulators and S shifted input tiles, and unrolls R x S taps a row: up to 7x7
# (ConvNeXt's; a 13x13 strip took 255 registers, 4 KB of spills and minutes of compiling for sm_90)
WLOAD_SIDE = 7


_ASSIGNED = re.compile(r"^(\w+) = ")


def unrolls_whole() -> bool:
    """Whether a 7x7 filter's pixel tiles unroll all 49 taps first: Triton before 3.9 (3.6's sm_90 code for
    them: 112 registers, no spills, the fastest measured); 3.9's spills even at 255 registers, so its
    candidates loop over the filter rows first."""
    from ..compiler import triton_version

    major, minor = (int(p) for p in triton_version().split(".")[:2])
    return (major, minor) < (3, 9)


@dataclass(frozen=True)
class RowTiling(Tiling):
    """The row-strip grid: `groups_m` row groups (image, block of ROWS output rows, strip of
    BLOCK_W pixels) x channel blocks. Rows are masked always (the strip's width and the last block
    of rows are ragged)."""

    groups_m: int = 1

    @property
    def npm(self) -> int:
        return self.groups_m

    @property
    def rmask(self) -> str | None:
        return "rmask"


class DepthwiseTemplate(TileTemplate):
    name = "depthwise"
    priority = 55
    main_kinds = ("conv_fprop",)
    main_label = "conv_fprop"
    splits_k = False

    def space(self, main: Node, piece: Piece) -> OutputSpace:
        y = piece.tensor(main.output_uids()[0])
        return OutputSpace(y.dim, rows=(0, *range(2, len(y.dim))), col=1)


class DepthwiseMatch(TileMatch):
    """A depthwise conv: its plain kernel computes pixel tiles (every tap unrolled); ROWS > 0 configs
    (RowStripKnobs) run `RowStrips`."""

    template: DepthwiseTemplate
    own_knobs = frozenset({"WCOPY", "UNROLL"})

    @cached_property
    def rows(self) -> RowStrips:
        return RowStrips(self)

    def check(self) -> Support:
        x, w = self.gp.operand("image"), self.gp.operand("weight")
        if w.dim[1] != 1:
            return Support.no(
                f"not a depthwise conv: the filter has {w.dim[1]} channels per group (needs 1)", self.gp.main
            )
        if x.data_type.is_integer or w.data_type.is_integer:
            if x.data_type is not DataType.INT8 or w.data_type is not DataType.INT8:
                return Support.no("integer depthwise convs need INT8 image and filter", self.gp.main)
        if DataType.DOUBLE in (x.data_type, w.data_type):
            return Support.no("DOUBLE depthwise convs are not supported by the Triton templates", self.gp.main)
        return Support.yes()

    def dot(self, k: Any) -> DotKind:
        if self.gp.operand("image").data_type.is_integer:
            return DotKind("tl.int32", "tl.int32")
        return DotKind("tl.float32", "tl.float32")

    def knobs(self, stored: Mapping[str, Any]) -> Any:
        """Row-strip knobs where ROWS > 0, else pixel tiles' (a stored ROWS=0 and its BLOCK_W left out)."""
        if int(stored.get("ROWS", 0)) > 0:
            return RowStripKnobs.parse(stored, self.template.name)
        return TileKnobs.parse({k: v for k, v in stored.items() if k not in ("ROWS", "BLOCK_W")}, self.template.name)

    def notes(self, knobs: Any) -> frozenset[NumericalNote]:
        return frozenset()

    # -- knobs -------------------------------------------------------------------------------------

    def candidates(self) -> list[Any]:
        gp, device = self.gp, self.device
        k = gp.space.dims[1]
        rows: list[Any] = self.rows.candidates() if self.rows.applies else []
        # (strips loading their weights at every row lose to the pixel tiles: offered after them)
        kept, loaded = [r for r in rows if not r.WLOAD], [r for r in rows if r.WLOAD]
        wcopy = 1 if self.copies_filter else None
        if not device.is_cuda:
            bm = min(32, pow2_at_least(gp.space.m, 16))
            bn = min(32, pow2_at_least(k, 16))
            tiles = [
                TileKnobs(BLOCK_M=bm, BLOCK_N=bn, num_warps=4, WCOPY=wcopy),
                TileKnobs(BLOCK_M=16, BLOCK_N=16, num_warps=4),
            ]
            return kept[:1] + tiles + loaded[:1]
        # pixel tiles: a thread holds 8 channels (one 16-byte load of 16-bit data) of 2-4 pixels; each
        # tap costs it a load and a conversion per pixel, a multiply-add per element and (WCOPY=1) two
        # vector loads of weights, where the filter's own layout would take 8 scalar loads: about 2.8
        # instructions per element and tap at 4 pixels (32 elements, ~112 registers), unrolled; 64-channel
        # tiles first where the channels allow (bench/results/constants.md#depthwise-pixel-tiles)
        bn = min(32, max(16, pow2_at_least(k, 16)))
        wide = [(128, 64, 8)] if k % 64 == 0 else []
        ranked = [*wide, (32 * 4, bn, 4), (32 * 8, bn, 8), (64, bn, 4)]
        # a 7x7 filter's 49 taps unrolled whole where Triton's code for them fits the registers (UNROLL=1;
        # bench/results/constants.md#depthwise-pixel-tiles), else nested; the other way last, for tuning
        whole = self.nests_taps and self.taps <= UNROLL_MAX
        unroll = 1 if whole and unrolls_whole() else None
        out = [
            TileKnobs(BLOCK_M=bm, BLOCK_N=width, num_warps=warps, WCOPY=wcopy, UNROLL=unroll)
            for bm, width, warps in ranked
        ]
        out.append(TileKnobs(BLOCK_M=32, BLOCK_N=min(64, max(16, pow2_at_least(k, 16))), num_warps=4))
        if whole:
            out.append(out[0].replace(UNROLL=None if unroll else 1))
        return kept + out + loaded

    def cost(self, k: Any) -> float | None:
        """Bound by the bytes moved (the image once, the output, the filter): ~80% of an H100's copy
        bandwidth when the taps' re-reads hit the caches, plus a launch."""
        if not self.device.is_cuda:
            return None
        return self.gp.moved_bytes() / (0.8 * 3.0e12) * 1e6 + 3.0

    def validate(self, k: TileKnobs) -> None:
        if k.UNROLL and self.taps > UNROLL_MAX:
            raise AttributeValueError(
                f"UNROLL=1 unrolls at most {UNROLL_MAX} filter taps; this filter has {self.taps}",
                op=self.gp.main.label(),
                rule="triton.depthwise.knob",
                hint="drop UNROLL (the taps then loop over all filter axes but the last, which unrolls)",
            )
        if k.WCOPY and not self.copies_filter:
            raise AttributeValueError(
                "WCOPY=1 copies a float filter without a prologue; this piece's filter is an integer one or "
                "computed by a prologue",
                op=self.gp.main.label(),
                rule="triton.depthwise.knob",
                hint="drop WCOPY (the pixel tiles then read the filter as it is)",
            )

    def strategy(self, k: Any) -> Strategy:
        return self if isinstance(k, RowStripKnobs) else super().strategy(k)  # (cost: the bytes, either kind)

    def generate(self, knobs: TileKnobs | RowStripKnobs) -> Generated:
        if isinstance(knobs, RowStripKnobs):
            return self.build(self.rows, knobs)
        return super().generate(knobs)

    # -- code --------------------------------------------------------------------------------------

    def lines(self, ctx: Context, sig: Signature, k: TileKnobs, lo: str, hi: str) -> MainLoop:
        """Pixel tiles: for every filter tap (unrolled), the shifted image tile times the tap's weights."""
        gp = ctx.gp
        op = gp.main.op
        assert isinstance(op, ConvFprop) and ctx.dot is not None
        x, w = gp.operand("image"), gp.operand("weight")
        nsp = len(x.dim) - 2
        geo = op.geometry(nsp)
        taps = w.dim[2:]
        ntaps = math.prod(taps)
        ydims = gp.space.dims
        mult = ydims[1] // x.dim[1]
        lines = []
        for i in range(nsp):
            s, p0 = geo.stride[i], geo.pre[i]
            expr = f"y{2 + i}" if s == 1 else f"y{2 + i} * {s}"
            lines.append(f"o{i} = {expr} - {p0}" if p0 else f"o{i} = {expr}")
        lines.append(f"cin = col // {mult}" if mult > 1 else "cin = col")
        lines.append(f"acc = tl.zeros((BLOCK_M, BLOCK_N), {ctx.dot.acc})")
        moving = [(i, r) for i, r in enumerate(taps) if r > 1]
        nested = self.nests_taps and not k.UNROLL
        if nested:
            body = [*decompose("outer", moving[:-1], "t"), f"t{moving[-1][0]} = inner"]
        else:
            body = decompose("tap", moving, "t") if ntaps > 1 else []
        checks = [ctx.tiling.rmask] if ctx.tiling.rmask else []
        body += input_taps(geo, taps, ydims, x.dim, op.convolution_mode is ConvolutionMode.CONVOLUTION, checks)
        amask = None
        if checks:
            body.append(f"amask = {' & '.join(checks)}")
            amask = "amask"
        ptr = ctx.ptr_of(sig)
        # each input coordinate as the output's (o{i}, the same for every tap) plus the tap's shift: the
        # rows' offsets are computed once and a tap adds a scalar (unrolled: a constant the load folds in)
        shifts = [f"t{i} * {geo.dilation[i]}" if geo.dilation[i] != 1 else f"t{i}" for i in range(nsp)]
        x_axes = [
            ("r", "y0"),
            ("c", "cin"),
            *(("r", f"o{i}", shifts[i]) if taps[i] > 1 else ("r", f"xi{i}") for i in range(nsp)),
        ]
        a_idx = TileIndexer(x_axes, amask, ctx.tiling.cmask, ptr, ("BLOCK_M", "BLOCK_N"), zero=("rm", "rn"))
        body += operand_tile(ctx, sig, "image", a_idx, "a")
        if k.WCOPY:  # (validate: a float filter without a prologue)
            body.append(self.copied_filter(ctx, sig, taps))
        else:
            w_axes = [("c", "col"), ("r", "rm"), *(("s", f"wt{i}") for i in range(nsp))]
            b_idx = TileIndexer(w_axes, None, ctx.tiling.cmask, ptr, ("1", "BLOCK_N"), zero=("rm", "rn"))
            body += operand_tile(ctx, sig, "weight", b_idx, "b")
        body.append("acc += a * b")
        if nested:
            inner = moving[-1][1]
            lines += [f"for outer in range({ntaps // inner}):", f"    for inner in tl.static_range({inner}):"]
            return MainLoop(lines + ["        " + line for line in body])
        unrolled = ntaps <= UNROLL_TAPS or k.UNROLL
        lines.append(f"for tap in tl.static_range({ntaps}):" if unrolled else f"for tap in range({ntaps}):")
        return MainLoop(lines + ["    " + line for line in body])

    @cached_property
    def taps(self) -> int:
        """The filter's taps (the product of its spatial dims)."""
        return math.prod(self.gp.operand("weight").dim[2:])

    @cached_property
    def nests_taps(self) -> bool:
        """Whether the pixel tiles' taps run as a loop over all filter axes but the last, whose taps unroll
        (each one's shift a constant), unless UNROLL=1 unrolls them all: filters of more than UNROLL_TAPS
        taps over two axes or more (7x7)."""
        moving = [r for r in self.gp.operand("weight").dim[2:] if r > 1]
        return self.taps > UNROLL_TAPS and len(moving) > 1 and moving[-1] <= UNROLL_TAPS

    # -- the filter copied tap-major (WCOPY=1) ----------------------------------------------------------

    @cached_property
    def copies_filter(self) -> bool:
        """Whether WCOPY=1 applies: a float filter without a prologue (the copy is a plain conversion)."""
        uid = self.gp.main.input("weight")
        w = self.gp.operand("weight")
        return isinstance(uid, int) and not self.gp.prologue.get(uid) and not w.data_type.is_integer

    def copied_filter(self, ctx: Context, sig: Signature, taps: tuple[int, ...]) -> str:
        """The line loading tap (wt0, wt1, ...)'s BLOCK_N weights as `b` from the filter's copy: [taps, K]
        fp32 in scratch, channels contiguous (one vector load, no conversion, where the filter's own layout
        puts a tap's channels `taps` elements apart), made by a launch before the kernel (`_copy_launch`)."""
        k = ctx.gp.space.dims[1]
        offset = ctx.scratch.alloc(math.prod(taps) * k * 4)
        ws = sig.scratch("wcopy", offset, "float32")
        flat = " + ".join(f"wt{i} * {math.prod(taps[i + 1 :])}" for i, r in enumerate(taps) if r > 1) or "0"
        mask = f", mask={ctx.tiling.cmask}[None, :], other=0" if ctx.tiling.cmask else ""
        ctx.before.append(self._copy_launch(ctx, offset, taps))
        return f"b = tl.load({ws} + ({flat}) * {k} + col[None, :]{mask})"

    def _copy_launch(self, ctx: Context, offset: int, taps: tuple[int, ...]) -> tuple[str, Launch]:
        """The kernel writing the filter [K, 1, *taps] (any strides) as fp32 [taps, K] into scratch at `offset`."""
        w = self.gp.operand("weight")
        uid = self.gp.main.input("weight")
        assert isinstance(uid, int)
        k = w.dim[0]
        total = math.prod(taps) * k
        sig = Signature()
        src = ctx.ptr_of(sig)(uid)
        ws = sig.scratch("wcopy", offset, "float32")
        moving = [(i, r) for i, r in enumerate(taps) if r > 1]
        lines = [
            "i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)",
            f"imask = i < {total}",
            f"c = i % {k}",
            f"tap = i // {k}",
            *decompose("tap", moving, "wt"),
        ]
        terms = [f"c * {w.stride[0]}", *(f"wt{i} * {w.stride[2 + i]}" for i, _ in moving)]
        load = f"tl.load({src} + {' + '.join(terms)}, mask=imask, other=0)"
        lines.append(f"tl.store({ws} + i, {from_storage(load, w.data_type, 'tl.float32')}, mask=imask)")
        block = min(1024, pow2_at_least(total, 16))
        launch = Launch("kernel_filter", (-(-total // block),), tuple(sig.args), (("BLOCK", block), ("num_warps", 4)))
        return sig.source("kernel_filter", ["BLOCK"], lines), launch


class RowStrips:
    """The row-strip kernel (ROWS > 0) of a DepthwiseMatch, made through the shared path (TileMatch.build):
    its own grid (RowTiling), body (the whole strip walk with the epilogue inside, `kernel_body`) and meta."""

    writes_partials: ClassVar[bool] = False

    def __init__(self, m: DepthwiseMatch) -> None:
        self.m = m

    @cached_property
    def applies(self) -> bool:
        """Whether the row-strip kernel runs this piece."""
        gp = self.m.gp
        op = gp.main.op
        assert isinstance(op, ConvFprop)
        x = gp.operand("image")
        if len(x.dim) != 4:
            return False
        geo = op.geometry(2)
        if geo.stride[0] != 1 or geo.dilation[0] != 1:
            return False
        if not self.keeps_weights and max(gp.operand("weight").dim[2:]) > WLOAD_SIDE:
            return False
        return all(r.along == "rows" for r in gp.reductions)

    @cached_property
    def keeps_weights(self) -> bool:
        """Whether the filter's R x S weight vectors fit registers for the whole program (else WLOAD=1)."""
        return math.prod(self.m.gp.operand("weight").dim[2:]) <= ROW_TAPS

    def candidates(self) -> list[RowStripKnobs]:
        """Row-strip configs. A strip covers the output width (up to 64 pixels), BLOCK_N channels
        make rows of >= 64 bytes, and BLOCK_W x BLOCK_N / threads = 8 elements per thread: the R x S
        weight vectors (72 fp32 registers for 3x3) plus R accumulators keep a program near 128
        registers, i.e. 16 warps per SM. Filters of more taps load their weights at every row
        (WLOAD=1), holding R accumulators and S shifted input tiles instead: 4 elements per thread
        (7x7: 56 registers of them) in strips of up to 32 pixels. ROWS trades the halo rows (R - 1
        per program) and the per-program loads of weights against filling the GPU: the smallest number
        of waves of (16 warps per SM), then the most rows."""
        gp, device = self.m.gp, self.m.device
        sp = gp.space
        n, k, ho, wo = sp.dims
        r = gp.operand("weight").dim[2]
        wload = None if self.keeps_weights else 1
        if not device.is_cuda:
            bw = min(8, pow2_at_least(wo, 2))
            return [
                RowStripKnobs(
                    ROWS=min(4, ho),
                    BLOCK_W=bw,
                    BLOCK_N=min(16, pow2_at_least(k, 4)),
                    num_warps=1,
                    num_stages=2,
                    WLOAD=wload,
                )
            ]
        if gp.operand("image").data_type.itemsize == 1:
            return []  # 16 int8 channels per thread: 144 weight registers
        if wload:
            bw = min(32, pow2_at_least(wo, 4))
            bn = min(pow2_at_least(k, 8), max(8, 1024 // bw), 32)
            warps = max(1, min(8, bw * bn // 128))
        else:
            bw = min(64, pow2_at_least(wo, 4))
            bn = min(pow2_at_least(k, 8), max(8, 2048 // bw), 64)
            warps = max(4, min(8, bw * bn // 256))  # (narrow strips: 4 warps, fewer channels per thread)
        slots = 16 // warps * max(device.sm_count, 1)  # programs resident at ~128 registers
        strips = -(-wo // bw) * -(-k // bn) * n

        def cost(rows: int) -> float:  # waves x (input rows + ~2 rows' worth of per-program set-up)
            return -(-strips * -(-ho // rows) // slots) * (rows + r - 1 + 2)

        # the fewest rows per program for each number of row blocks (no needlessly ragged blocks)
        options = sorted({-(-ho // blocks) for blocks in range(1, ho + 1)}, key=lambda rows: (cost(rows), -rows))
        best = options[0]
        out = []
        for rows in [best, *[o for o in options[1:4] if o != best]]:
            out.append(
                RowStripKnobs(
                    ROWS=rows,
                    BLOCK_W=bw,
                    BLOCK_N=bn,
                    num_warps=warps,
                    num_stages=4,
                    MAXNREG=None if wload else 128,
                    WLOAD=wload,
                )
            )
        # 3 stages (less shared memory), plain cached loads (num_stages=1: the shifted copies of a row
        # hit L1, nothing prefetched), half the channels per program
        out[1:1] = [out[0].replace(num_stages=3), out[0].replace(num_stages=1)]
        if bn >= 16:
            out.insert(3, out[0].replace(BLOCK_N=bn // 2, num_warps=max(1, warps // 2)))
        return out

    def check_knobs(self, k: RowStripKnobs) -> None:
        if not self.applies:
            raise AttributeValueError(
                f"the {self.m.template.name} template cannot run this piece with ROWS="
                f"{k.ROWS}: the row-strip kernel (ROWS > 0) needs a 2-D conv with unit stride "
                f"and dilation along H, a filter of at most {ROW_TAPS} taps or {WLOAD_SIDE}x{WLOAD_SIDE}, and no "
                "reduction over channels",
                rule="triton.depthwise.knob",
                hint="use ROWS=0 (pixel tiles)",
            )
        if not self.keeps_weights and not k.WLOAD:
            taps = math.prod(self.m.gp.operand("weight").dim[2:])
            raise AttributeValueError(
                f"the {self.m.template.name} template's row strips keep at most {ROW_TAPS} weight vectors "
                f"in registers; this filter has {taps} taps",
                rule="triton.depthwise.knob",
                hint="add WLOAD=1 (the weights loaded at every row), or use ROWS=0 (pixel tiles)",
            )

    def blocks(self, k: RowStripKnobs) -> tuple[int, int]:
        """(row blocks, strips) along H and W of an image."""
        _, _, ho, wo = self.m.gp.space.dims
        return -(-ho // k.ROWS), -(-wo // k.BLOCK_W)

    def tiling(self, k: RowStripKnobs) -> Tiling:
        sp = self.m.gp.space
        nhb, nwb = self.blocks(k)
        return RowTiling(sp, k.BLOCK_W, k.BLOCK_N, 1, 1, needs_int64(self.m.gp), groups_m=sp.dims[0] * nhb * nwb)

    def constexprs(self, k: RowStripKnobs) -> dict[str, int]:
        return {"BLOCK_M": k.BLOCK_W, "BLOCK_N": k.BLOCK_N}

    def meta(self, k: RowStripKnobs) -> tuple[tuple[str, Any], ...]:
        return (("num_warps", k.warps), ("num_stages", k.stages), *((("maxnreg", k.MAXNREG),) if k.MAXNREG else ()))

    def programs(self, tiling: Tiling, k: RowStripKnobs) -> SymInt:
        return tiling.per_split

    def body(self, ctx: Context, sig: Signature, k: RowStripKnobs, partials: int | None) -> list[str]:
        nhb, nwb = self.blocks(k)
        return self.kernel_body(ctx, sig, k.ROWS, nhb, nwb, k.stages, bool(k.WLOAD))

    def kernel_body(
        self, ctx: Context, sig: Signature, rows: int, nhb: int, nwb: int, stages: int, reload: bool = False
    ) -> list[str]:
        gp = ctx.gp
        op = gp.main.op
        assert isinstance(op, ConvFprop) and ctx.dot is not None
        t = ctx.tiling
        sp = t.space
        x, w = gp.operand("image"), gp.operand("weight")
        geo = op.geometry(2)
        r, s = w.dim[2], w.dim[3]
        n, k, ho, wo = sp.dims
        hi, wi = x.dim[2], x.dim[3]
        mult = k // x.dim[1]
        flip = op.convolution_mode is ConvolutionMode.CONVOLUTION
        lines = ["pid = tl.program_id(0)"]
        if t.big:
            lines.append("pid = pid.to(tl.int64)")
        lines += [
            f"pid_n = pid % {t.npn}",
            f"pid_m = pid // {t.npn}",
            f"wb = pid_m % {nwb}",
            f"q = pid_m // {nwb}",
            f"hb = q % {nhb}",
            f"n = q // {nhb}",
            "pb = 0",
            "g = 0",
            "ow = wb * BLOCK_M + tl.arange(0, BLOCK_M)",
            "rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)",
        ]
        if t.cmask:
            lines.append(f"cmask = rn < {sp.n}")
        lines += [
            "col = rn",
            "y1 = col",
            f"cin = col // {mult}" if mult > 1 else "cin = col",
            f"owmask = ow < {wo}",
            f"h0 = hb * {rows}",
            "y0 = n + ow * 0",
            "y3 = ow",
        ]
        ptr = ctx.ptr_of(sig)

        def weights(kh: int, prefix: str) -> list[str]:
            """Filter row kh's S vectors of BLOCK_N weights (prologue included), named prefix{kh}_{kw}."""
            out = []
            for kw in range(s):
                th, tw = (r - 1 - kh, s - 1 - kw) if flip else (kh, kw)
                idx = TileIndexer(
                    [("c", "col"), ("r", "ow"), ("s", str(th)), ("s", str(tw))],
                    None,
                    t.cmask,
                    ptr,
                    ("1", "BLOCK_N"),
                    zero=("ow", "rn"),
                )
                out += operand_tile(ctx, sig, "weight", idx, f"{prefix}{kh}_{kw}")
            return out

        if not reload:  # the filter, once (else each row loads the filter rows it uses: L1 hits)
            for kh in range(r):
                lines += weights(kh, "w")
        # the image columns each filter column reads, and their bounds (loop-invariant)
        span = (nwb * t.block_m - 1) * geo.stride[1] - geo.pre[1] + (s - 1) * geo.dilation[1]
        for kw in range(s):
            base = f"ow * {geo.stride[1]}" if geo.stride[1] != 1 else "ow"
            off = kw * geo.dilation[1] - geo.pre[1]
            lines.append(f"iw{kw} = {base} + {off}" if off else f"iw{kw} = {base}")
            checks = []
            if geo.pre[1] > kw * geo.dilation[1]:
                checks.append(f"(iw{kw} >= 0)")
            if span - (s - 1 - kw) * geo.dilation[1] > wi - 1:
                checks.append(f"(iw{kw} < {wi})")
            lines.append(f"xm{kw} = {' & '.join(checks) if checks else 'ow >= 0'}")

        def x_index(kw: int) -> TileIndexer:
            axes = [("s", "n"), ("c", "cin"), ("s", "ih"), ("r", f"iw{kw}")]
            return TileIndexer(axes, f"xr{kw}", t.cmask, ptr, ("BLOCK_M", "BLOCK_N"), zero=("ow", "rn"))

        image = gp.main.input("image")
        assert isinstance(image, int)
        pre_lines, preset = preload_lines(ctx, sig, gp.prologue.get(image, ()), x_index(0))
        out_idx = t.output_indexer(ptr)
        epi_lines, epi_preset = preload_lines(ctx, sig, gp.epilogue, out_idx, skip=[gp.out])
        lines += pre_lines + epi_lines
        for plan in ctx.reductions:
            lines += plan.init_lines("racc", "BLOCK_N")

        def load_row(j: str) -> list[str]:
            out = [f"ih = h0 + {j} - {geo.pre[0]}" if geo.pre[0] else f"ih = h0 + {j}", f"rv = (ih >= 0) & (ih < {hi})"]
            for kw in range(s):
                out.append(f"xr{kw} = (xm{kw} & rv) != 0")  # (!= 0: vector & scalar masks confuse the interpreter)
                out += operand_tile(ctx, sig, "image", x_index(kw), f"x{kw}", preset)
            return out

        def taps(kh: int, prefix: str = "w") -> str:
            return " + ".join(f"x{kw} * {prefix}{kh}_{kw}" for kw in range(s))

        def use(kh: int, prefix: str = "w") -> list[str]:
            """The lines making filter row kh's weights at hand (none where the program keeps them). In the
            loop (prefix lw) a filter prologue's temporaries are renamed too: a name also bound before
            the loop would be carried from one iteration to the next."""
            if not reload:
                return []
            lines = weights(kh, prefix)
            if prefix != "lw":
                return lines
            bound = {m.group(1) for x in lines if (m := _ASSIGNED.match(x)) and not m.group(1).startswith("lw")}
            if not bound:
                return lines
            rename = re.compile(r"\b(" + "|".join(sorted(bound)) + r")\b")
            return [rename.sub(r"\1_lw", x) for x in lines]

        def finish(acc: str, o: str) -> list[str]:
            out = [
                f"oh = h0 + {o}",
                f"rmask = (owmask & (oh < {ho})) != 0",
                "y2 = oh + ow * 0",
                f"rm = (n * {ho} + oh) * {wo} + ow",
            ]
            return out + epilogue(ctx, sig, acc, 1, epi_preset, "racc" if ctx.reductions else None)

        # input row j feeds output rows j - kh (kh = 0..R-1); output o completes at row o + R - 1.
        # Rows j < R - 1 and j >= ROWS are peeled (static, only the outputs that exist); the rows in
        # between run in a pipelined loop where the R - 1 open accumulators A0 (oldest) .. roll down.
        names: dict[int, str] = {}
        loop_lo, loop_hi = r - 1, rows  # dynamic rows: every tap feeds an output of the block

        def static_row(j: int) -> list[str]:
            out = load_row(str(j))
            for kh in range(r):
                o = j - kh
                if 0 <= o < rows:
                    out += use(kh)
                    if o in names:
                        out.append(f"{names[o]} = {names[o]} + {taps(kh)}")
                    else:
                        names[o] = f"acc{o}"
                        out.append(f"acc{o} = {taps(kh)}")
            o = j - (r - 1)
            if 0 <= o < rows:
                out += finish(names.pop(o), str(o))
            return out

        if loop_hi - loop_lo < 2:  # short blocks: all rows static
            for j in range(rows + r - 1):
                lines += static_row(j)
            return lines + self._reduction_stores(ctx, sig, out_idx)
        for j in range(loop_lo):
            lines += static_row(j)
        opened = [f"A{i}" for i in range(r - 1)]
        for i, name in enumerate(opened):
            lines.append(f"{name} = {names.pop(i)}")
        lines.append(f"for j in tl.range({loop_lo}, {loop_hi}, num_stages={stages}):")
        body = load_row("j")
        # (the loop's weights have names of their own: a name also bound before the loop would be
        # carried from one iteration to the next, held in registers throughout)
        lw = "lw" if reload else "w"
        body += use(0, lw)
        body.append(f"An = {taps(0, lw)}")
        for i, name in enumerate(opened):
            body += use(r - 1 - i, lw)
            body.append(f"{name} = {name} + {taps(r - 1 - i, lw)}")
        oldest = opened[0] if opened else "An"
        body += finish(oldest, f"j - {r - 1}" if r > 1 else "j")
        for name, nxt in zip(opened, [*opened[1:], "An"]):
            body.append(f"{name} = {nxt}")
        lines += ["    " + line for line in body]
        # after the loop, A_i holds output rows - R + 1 + i
        for i, name in enumerate(opened):
            names[rows - r + 1 + i] = name
        for j in range(loop_hi, rows + r - 1):
            lines += static_row(j)
        return lines + self._reduction_stores(ctx, sig, out_idx)

    @staticmethod
    def _reduction_stores(ctx: Context, sig: Signature, indexer: TileIndexer) -> list[str]:
        """The program's partials (or, with one slot, the results) of the reductions along rows."""
        lines = []
        for plan in ctx.reductions:
            lines += plan.store_lines(ctx, sig, {uid: f"racc{uid}" for uid, *_ in plan.arrays}, indexer)
        return lines


DepthwiseTemplate.match_class = DepthwiseMatch
TEMPLATE = DepthwiseTemplate()
