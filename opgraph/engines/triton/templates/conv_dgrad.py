"""conv_dgrad (the data gradient DX of a convolution) as an implicit GEMM, with the shared prologue /
epilogue / reductions of gemm.py: "dgrad + drelu" (relu_backward of DX against the forward
activation), dgrad + the pointwise inputs of a batchnorm backward and per-channel reductions of
them (sum of DX, sum of DX * x_hat), all in the one kernel.

GEMM view: M = N * prod(image spatial) input pixels (the tile's rows), N = C / groups input channels
of one group (the columns; the group is fixed per program), reduction over (filter taps x K / groups)
in one flat loop of taps * cdiv(K/groups, BLOCK_K) steps. Each step gathers an A tile
[BLOCK_M pixels, BLOCK_K filters] of DY at the output positions o = (i + pre - t * dil) / stride that
filter tap t maps each pixel i to (zero where o is outside DY), and a B tile [BLOCK_K, BLOCK_N] of
W at tap t (flipped in CONVOLUTION mode). For stride 1 this is the convolution of DY with the
flipped, transposed filter. NHWC makes the A loads contiguous along filters, KRSC the B loads along
channels.

Stride > 1 ("holes"): only the taps with (i + pre - t * dil) % stride == 0 reach pixel i. With
PHASES=1 (the default) the rows are ordered by phase, i = phase + stride * u per strided axis, and each
program covers pixels of one phase only: it loops over that phase's taps alone (an arithmetic
progression of taps per axis, known per phase), so no work is spent on holes, and o = u + e with a
per-tap constant e. PHASES=0 keeps the pixels in their natural order and masks the holes (stride^d
times the work; kept as the simple reference path). Rows are still addressed by their natural flat
index `rm`, so the epilogue, split-K partials and reductions are those of gemm.py unchanged.

Depthwise (one channel per group): no reduction over channels, so no tl.dot: each program owns
BLOCK_M pixels x BLOCK_N channels and accumulates DY (shifted per tap) x the tap's filter weights in
fp32 over the taps and the channel multiplier, a memory-bound stencil like depthwise.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from ....core.config import Support
from ....core.dtypes import DataType
from ....core.ir import Node
from ....core.piece import Piece
from ....ops.conv import ConvDgrad, ConvGeometry, ConvolutionMode
from ..gemm import (
    Context,
    DotKind,
    MainLoop,
    OutputSpace,
    Signature,
    TileIndexer,
    TileLoop,
    TileMatch,
    TileTemplate,
    Tiling,
    decompose,
    dot_kind,
    estimate_us,
    gemm_candidates,
    needs_int64,
    operand_bytes,
    operand_tile,
    uses_fp32,
    with_subtile,
)
from ..knobs import TileKnobs
from .base import pow2_at_least
from .preferences import DGRAD_LOSS_PROLOGUE

UNROLL_TAPS = 32  # stencil (depthwise) loops with more taps x multiplier steps are not unrolled


@dataclass(frozen=True)
class Phases:
    """The stride phases of DX's spatial axes. Per axis a: `stride[a]` phases (1 for unstrided axes),
    `extent[a]` = cdiv(H_a, stride_a) pixels per phase; per axis and phase the valid filter taps
    t = first + j * step (j < count) and the per-tap offset e(t) = (phase + pre - t * dil) // stride
    (exact), so that o = u + e."""

    stride: tuple[int, ...]
    size: tuple[int, ...]  # DX spatial dims
    extent: tuple[int, ...]
    first: tuple[tuple[int, ...], ...]
    count: tuple[tuple[int, ...], ...]
    step: tuple[int, ...]

    @staticmethod
    def make(geo: ConvGeometry, x_sp: tuple[int, ...], taps: tuple[int, ...]) -> Phases:
        first, count, step = [], [], []
        for s, p0, d, r in zip(geo.stride, geo.pre, geo.dilation, taps):
            valid = [[t for t in range(r) if (ph + p0 - t * d) % s == 0] for ph in range(s)]
            first.append(tuple(v[0] if v else 0 for v in valid))
            count.append(tuple(len(v) for v in valid))
            step.append(s // math.gcd(s, d))
        extent = tuple(-(-h // s) for h, s in zip(x_sp, geo.stride))
        return Phases(geo.stride, tuple(x_sp), extent, tuple(first), tuple(count), tuple(step))

    @property
    def nphases(self) -> int:
        return math.prod(self.stride)

    def max_taps(self) -> int:
        return math.prod(max(c) for c in self.count)

    def mean_taps(self) -> float:
        return math.prod(sum(c) / len(c) for c in self.count)


@dataclass(frozen=True)
class PhaseTiling(Tiling):
    """Tiles over the phase-ordered rows: the row-tile index pid_m runs over (phase, tile of the
    phase's N x prod(extent) rows); the header leaves the phase `ph{a}` per axis, the natural
    coordinates y{axis} and the natural flat row index `rm` (so stores, partials and reductions
    address rows as usual), and `rmask` (rows past a phase's pixels)."""

    phases: Phases | None = None

    @property
    def phase_rows(self) -> int:
        assert self.phases is not None
        return self.space.dims[0] * math.prod(self.phases.extent)

    @property
    def npm_phase(self) -> int:
        return -(-self.phase_rows // self.block_m)

    @property
    def npm(self) -> int:
        assert self.phases is not None
        return self.phases.nphases * self.npm_phase

    @property
    def rmask(self) -> str | None:
        assert self.phases is not None
        ragged = any(h % s for h, s in zip(self.phases.size, self.phases.stride))
        return "rmask" if ragged or self.phase_rows % self.block_m else None

    def row_lines(self) -> list[str]:
        """The phase-ordered rows: the phase `ph{a}` per strided axis, the row within the phase `ru` and its
        coordinates u{axis}, the natural coordinates y{axis} and flat row index `rm` (so that stores,
        partials and reductions address rows as usual)."""
        ph = self.phases
        assert ph is not None
        sp = self.space
        nsp = len(ph.stride)
        rows = [
            f"phase = pid_m // {self.npm_phase}",
            f"ru = (pid_m % {self.npm_phase}) * BLOCK_M + tl.arange(0, BLOCK_M)",
        ]
        strided = [(a, s) for a, s in enumerate(ph.stride) if s > 1]
        rows += decompose("phase", [(a, s) for a, s in strided], "ph") if strided else []
        rows += decompose("ru", [(0, sp.dims[0]), *((2 + a, ph.extent[a]) for a in range(nsp))], "u")
        rows.append("y0 = u0")
        for a in range(nsp):
            s = ph.stride[a]
            rows.append(f"y{2 + a} = ph{a} + u{2 + a} * {s}" if s > 1 else f"y{2 + a} = u{2 + a}")
        flat = "y0"
        for a in range(nsp):
            flat = f"({flat}) * {ph.size[a]} + y{2 + a}"
        return rows + [f"rm = {flat}"]

    def row_mask_lines(self) -> list[str]:
        """Rows past a phase's pixels: past the phase's rows, or past the image on a ragged axis."""
        ph = self.phases
        assert ph is not None
        masks = [f"(ru < {self.phase_rows})"] if self.phase_rows % self.block_m else []
        masks += [f"(y{2 + a} < {ph.size[a]})" for a, s in enumerate(ph.stride) if ph.size[a] % s]
        return [f"rmask = {' & '.join(masks)}"] if masks else []

    def row_coordinate_lines(self) -> list[str]:
        return []  # (the row lines gave them)


def _stencil(w_dim: tuple[int, ...]) -> bool:
    """Depthwise (one channel per group): the stencil main loop instead of a GEMM."""
    return w_dim[1] == 1


class ConvDgradTemplate(TileTemplate):
    name = "conv_dgrad"
    priority = 50
    main_kinds = ("conv_dgrad",)
    main_label = "conv_dgrad"

    def space(self, main: Node, piece: Piece) -> OutputSpace:
        dx = piece.tensor(main.output_uids()[0])
        w = piece.tensor(main.input("filter"))  # type: ignore[arg-type]
        groups = 1 if _stencil(w.dim) else dx.dim[1] // w.dim[1]
        return OutputSpace(dx.dim, rows=(0, *range(2, len(dx.dim))), col=1, groups=groups)


class ConvDgradMatch(TileMatch):
    """A conv_dgrad piece: its plain main loop keeps the pixels in natural order and masks a stride's holes;
    strided configs with PHASES=1 run `PhaseLoop`, depthwise dgrads `Stencil`."""

    template: ConvDgradTemplate

    # -- shapes --
    @cached_property
    def shape(self) -> tuple[int, int, int, int]:
        """(filters per group, channels per group, filter taps, groups)."""
        w = self.gp.operand("filter")
        groups = self.gp.space.dims[1] // w.dim[1]
        return w.dim[0] // groups, w.dim[1], math.prod(w.dim[2:]), groups

    @cached_property
    def is_stencil(self) -> bool:
        return _stencil(self.gp.operand("filter").dim)

    @cached_property
    def op(self) -> ConvDgrad:
        op = self.gp.main.op
        assert isinstance(op, ConvDgrad)
        return op

    @cached_property
    def geometry(self) -> ConvGeometry:
        return self.op.geometry(len(self.gp.space.dims) - 2)

    @cached_property
    def strided(self) -> bool:
        return any(s > 1 for s in self.geometry.stride)

    @cached_property
    def stride_phases(self) -> Phases:
        return Phases.make(self.geometry, tuple(self.gp.space.dims[2:]), tuple(self.gp.operand("filter").dim[2:]))

    @cached_property
    def elem(self) -> int:
        return operand_bytes(self.gp.operand("loss").data_type, self.gp.operand("filter").data_type)

    @cached_property
    def stencil_loop(self) -> Stencil:
        return Stencil(self)

    @cached_property
    def phase_loop(self) -> PhaseLoop:
        return PhaseLoop(self)

    def phases(self, k: TileKnobs) -> Phases | None:
        """The stride phases a config's rows are ordered by (None: natural order)."""
        if self.is_stencil or not self.strided or not k.phases:
            return None
        return self.stride_phases

    # -- verdict and hooks --
    def check(self) -> Support:
        dy, w = self.gp.operand("loss"), self.gp.operand("filter")
        if self.is_stencil:
            if dy.data_type.is_integer or w.data_type.is_integer:
                if dy.data_type is not DataType.INT8 or w.data_type is not DataType.INT8:
                    return Support.no("integer depthwise dgrads need INT8 loss and filter", self.gp.main)
            if DataType.DOUBLE in (dy.data_type, w.data_type):
                return Support.no("DOUBLE convolutions are not supported by the Triton templates", self.gp.main)
            return Support.yes()
        kind = dot_kind(dy.data_type, w.data_type, interpret=self.interpret)
        if isinstance(kind, str):
            return Support.no(kind, self.gp.main)
        return Support.yes()

    def loop(self, k: TileKnobs) -> TileLoop:
        if self.is_stencil:
            return self.stencil_loop
        return self.phase_loop if self.phases(k) is not None else self

    def dot(self, k: TileKnobs) -> DotKind:
        dy, w = self.gp.operand("loss"), self.gp.operand("filter")
        if self.is_stencil:
            return DotKind("tl.int32", "tl.int32") if dy.data_type.is_integer else DotKind("tl.float32", "tl.float32")
        kind = dot_kind(dy.data_type, w.data_type, interpret=self.interpret, fp32_precision=k.precision)
        assert not isinstance(kind, str)
        return kind

    def iterations(self, k: TileKnobs) -> int:
        """Every filter tap x filter blocks (the holes of a stride masked)."""
        kg, _, ntaps, _ = self.shape
        assert k.BLOCK_K is not None
        return ntaps * -(-kg // k.BLOCK_K)

    def tiling(self, k: TileKnobs) -> Tiling:
        split = 1 if self.is_stencil else k.split_k
        sp = self.gp.space
        scratch = sp.partials(split) if split > 1 else 0
        big = needs_int64(self.gp, scratch)
        phases = self.phases(k)
        if phases is not None:
            return PhaseTiling(sp, k.BLOCK_M, k.BLOCK_N, k.group_m, split, big, phases=phases)
        return Tiling(sp, k.BLOCK_M, k.BLOCK_N, k.group_m, split, big)

    def constexprs(self, k: TileKnobs) -> dict[str, int]:
        out = {"BLOCK_M": k.BLOCK_M, "BLOCK_N": k.BLOCK_N}
        if k.BLOCK_K is not None:
            out["BLOCK_K"] = k.BLOCK_K
        return out

    # -- knobs --
    def candidates(self) -> list[TileKnobs]:
        gp, device = self.gp, self.device
        if self.is_stencil:
            return self.stencil_loop.candidates()
        dy, w = gp.operand("loss"), gp.operand("filter")
        kg, cg, ntaps, groups = self.shape
        extra: dict[str, Any] = {"fp32_precision": "tf32"} if uses_fp32(dy.data_type, w.data_type) else {}
        if self.strided:
            extra["PHASES"] = 1
        taps = max(1, round(self.stride_phases.mean_taps())) if self.strided else ntaps
        configs = gemm_candidates(
            gp.space.m,
            gp.space.n,
            kg * taps,
            nprog=groups,
            device=device,
            elem_bytes=self.elem,
            k_step=kg,
            moved_bytes=gp.moved_bytes(),
            extra=extra,
        )
        if device.is_cuda and gp.prologue.get(gp.main.input("loss")):  # type: ignore[arg-type]
            configs = DGRAD_LOSS_PROLOGUE.apply(configs, lambda c: c.BLOCK_M <= 128)
        configs = with_subtile(configs, gp, device)
        if "fp32_precision" in extra:
            configs.insert(1, configs[0].replace(fp32_precision="ieee"))
        if self.strided:
            configs.append(configs[-1].replace(PHASES=0))  # the masked path, as a fallback
        return configs

    def cost(self, k: TileKnobs) -> float | None:
        if not self.device.is_cuda:
            return None
        if self.is_stencil:
            return self.gp.moved_bytes() / (0.8 * 3.0e12) * 1e6 + 3.0
        kg, _, ntaps, groups = self.shape
        phases = self.phases(k)
        taps = phases.mean_taps() if phases is not None else float(ntaps)  # masked holes still cost
        return estimate_us(
            self.gp.space.m,
            self.gp.space.n,
            max(1, round(kg * taps)),
            k,
            nprog=groups,
            device=self.device,
            elem_bytes=self.elem,
            k_step=kg,
            moved_bytes=self.gp.moved_bytes(),
        )

    # -- main loops --
    def operands(self, ctx: Context, sig: Signature, kmask: str | None, amask: str | None, flat: bool) -> list[str]:
        """The A (DY at positions o{a}, filters dk) and B (W at taps wt{a}) tiles, and the product."""
        gp = ctx.gp
        assert ctx.dot is not None
        nsp = len(gp.space.dims) - 2
        ptr = ctx.ptr_of(sig)
        dy_axes = [("r", "y0"), ("c", "dk"), *(("r", f"o{a}") for a in range(nsp))]
        rows = ("rm", tuple((a, gp.space.dims[a]) for a in gp.space.rows)) if flat else None
        a_idx = TileIndexer(dy_axes, amask, kmask, ptr, ("BLOCK_M", "BLOCK_K"), rows, zero=("rm", "kc"), select=kmask)
        w_axes = [("r", "dk"), ("c", "rn"), *(("s", f"wt{a}") for a in range(nsp))]
        b_idx = TileIndexer(
            w_axes, kmask, ctx.tiling.cmask, ptr, ("BLOCK_K", "BLOCK_N"), zero=("kc", "rn"), select=kmask
        )
        lines = operand_tile(ctx, sig, "loss", a_idx, "a")
        lines += operand_tile(ctx, sig, "filter", b_idx, "b")
        lines.append(f"acc = {ctx.dot.call('a', 'b', 'acc')}")
        return lines

    def k_chunk(self, bk: int, nkb: int) -> tuple[list[str], str | None]:
        """Lines giving `tap` (the flat tap step), `kc` (filters of this step within the group), `dk`
        (global filter index) and the filter mask."""
        kg, _, _, groups = self.shape
        if nkb > 1:
            lines = [f"tap = it // {nkb}", f"kc = (it % {nkb}) * BLOCK_K + tl.arange(0, BLOCK_K)"]
        else:
            lines = ["tap = it", "kc = tl.arange(0, BLOCK_K)"]
        kmask, kc = None, "kc"
        if kg % bk:  # filters past the group's end: wrapped in the loads, zeroed by selects
            lines += [f"kmask = kc < {kg}", f"kcc = kc % {kg}"]
            kmask, kc = "kmask", "kcc"
        lines.append(f"dk = g * {kg} + {kc}" if groups > 1 else f"dk = {kc}")
        return lines, kmask

    def lines(self, ctx: Context, sig: Signature, k: TileKnobs, lo: str, hi: str) -> MainLoop:
        """Pixels in natural order; every tap, holes of a stride masked."""
        gp = ctx.gp
        assert ctx.dot is not None and k.BLOCK_K is not None
        geo, dy, taps, xd = self.geometry, gp.operand("loss"), tuple(gp.operand("filter").dim[2:]), gp.space.dims
        nsp = len(dy.dim) - 2
        kg, _, ntaps, _ = self.shape
        bk = k.BLOCK_K
        nkb = -(-kg // bk)
        lines = [f"b{a} = y{2 + a} + {geo.pre[a]}" if geo.pre[a] else f"b{a} = y{2 + a}" for a in range(nsp)]
        lines.append(f"acc = tl.zeros((BLOCK_M, BLOCK_N), {ctx.dot.acc})")
        body, kmask = self.k_chunk(bk, nkb)
        moving = [(a, r) for a, r in enumerate(taps) if r > 1]
        body += decompose("tap", moving, "t") if ntaps > 1 else []
        checks = [ctx.tiling.rmask] if ctx.tiling.rmask else []
        body += _positions(geo, taps, xd, dy.dim, checks, self.op.convolution_mode)
        amask = None
        if checks:
            body.append(f"amask = {' & '.join(checks)}")
            amask = "amask"
        flat = (
            all(r == 1 for r in taps)
            and all(s == 1 for s in geo.stride)
            and not any(geo.pre)
            and tuple(dy.dim[2:]) == tuple(xd[2:])
        )
        body += self.operands(ctx, sig, kmask, amask, flat)
        lines.append(f"for it in range({lo}, {hi}):")
        return MainLoop(lines + ["    " + line for line in body])


def _positions(
    geo: ConvGeometry,
    taps: tuple[int, ...],
    xd: tuple[int, ...],
    yd: tuple[int, ...],
    checks: list[str],
    mode: ConvolutionMode,
) -> list[str]:
    """o{a} (DY positions of pixels b{a} = i + pre at taps t{a}), their validity checks, and the
    filter taps wt{a} to read (flipped in CONVOLUTION mode)."""
    lines = []
    for a, r in enumerate(taps):
        s, d, p0 = geo.stride[a], geo.dilation[a], geo.pre[a]
        num = f"b{a} - t{a} * {d}" if r > 1 and d != 1 else f"b{a} - t{a}" if r > 1 else f"b{a}"
        lowest, highest = p0 - (r - 1) * d, xd[2 + a] - 1 + p0
        if s == 1:
            lines.append(f"o{a} = {num}")
            if lowest < 0:
                checks.append(f"(o{a} >= 0)")
            if highest > yd[2 + a] - 1:
                checks.append(f"(o{a} < {yd[2 + a]})")
        else:
            lines += [f"q{a} = {num}", f"o{a} = q{a} // {s}"]
            if lowest < 0:
                checks.append(f"(q{a} >= 0)")
            checks.append(f"(q{a} % {s} == 0)")
            if highest // s > yd[2 + a] - 1:
                checks.append(f"(o{a} < {yd[2 + a]})")
        flip = mode is ConvolutionMode.CONVOLUTION
        lines.append(f"wt{a} = {r - 1} - t{a}" if flip and r > 1 else f"wt{a} = t{a}" if r > 1 else f"wt{a} = 0")
    return lines


class PhaseLoop(TileLoop):
    """Stride > 1 with PHASES=1: pixels of one phase per program (PhaseTiling); only the taps that reach
    the phase."""

    m: ConvDgradMatch

    def iterations(self, k: TileKnobs) -> int:
        kg = self.m.shape[0]
        assert k.BLOCK_K is not None
        return self.m.stride_phases.max_taps() * -(-kg // k.BLOCK_K)

    def lines(self, ctx: Context, sig: Signature, k: TileKnobs, lo: str, hi: str) -> MainLoop:
        m, gp = self.m, ctx.gp
        assert ctx.dot is not None and isinstance(ctx.tiling, PhaseTiling) and k.BLOCK_K is not None
        ph = ctx.tiling.phases
        assert ph is not None
        geo, dy, taps = m.geometry, gp.operand("loss"), tuple(gp.operand("filter").dim[2:])
        nsp = len(dy.dim) - 2
        kg = m.shape[0]
        bk = k.BLOCK_K
        nkb = -(-kg // bk)
        lines = []
        trips = []
        for a in range(nsp):
            s = ph.stride[a]
            if s == 1:
                lines += [f"f{a} = 0", f"n{a} = {taps[a]}"]
            else:
                lines.append(f"f{a} = {_select(f'ph{a}', ph.first[a])}")
                lines.append(f"n{a} = {_select(f'ph{a}', ph.count[a])}")
            trips.append(f"n{a}")
        lines.append(f"trips = {' * '.join(trips)} * {nkb}")
        lines.append(f"acc = tl.zeros((BLOCK_M, BLOCK_N), {ctx.dot.acc})")
        body, kmask = m.k_chunk(bk, nkb)
        rest = "tap"
        for a in reversed(range(nsp)):
            if a == 0:
                body.append(f"j{a} = {rest}")
            else:
                body += [f"j{a} = {rest} % n{a}", f"tq{a} = {rest} // n{a}"]
                rest = f"tq{a}"
        checks = [ctx.tiling.rmask] if ctx.tiling.rmask else []
        flip = m.op.convolution_mode is ConvolutionMode.CONVOLUTION
        for a in range(nsp):
            s, d, p0, r = ph.stride[a], geo.dilation[a], geo.pre[a], taps[a]
            step = ph.step[a]
            body.append(f"t{a} = f{a} + j{a} * {step}" if step != 1 else f"t{a} = f{a} + j{a}")
            base = f"ph{a} + {p0}" if s > 1 else f"{p0}"
            num = f"{base} - t{a} * {d}" if d != 1 else f"{base} - t{a}"
            body.append(f"e{a} = ({num}) // {s}" if s > 1 else f"e{a} = {num}")
            body.append(f"o{a} = u{2 + a} + e{a}")
            offsets = [(q + p0 - t * d) // s for q in range(s) for t in range(r) if (q + p0 - t * d) % s == 0]
            if min(offsets) < 0:
                checks.append(f"(o{a} >= 0)")
            if ph.extent[a] - 1 + max(offsets) > dy.dim[2 + a] - 1:
                checks.append(f"(o{a} < {dy.dim[2 + a]})")
            body.append(f"wt{a} = {r - 1} - t{a}" if flip else f"wt{a} = t{a}")
        amask = None
        if checks:
            body.append(f"amask = {' & '.join(checks)}")
            amask = "amask"
        body += m.operands(ctx, sig, kmask, amask, flat=False)
        lines.append(f"for it in range({lo}, tl.minimum({hi}, trips)):")
        return MainLoop(lines + ["    " + line for line in body])


class Stencil(TileLoop):
    """Depthwise: acc[pixels, channels] += DY[.., c*m + j, o(tap)] * W[c*m + j, 0, tap] over the taps
    and the channel multiplier m, without tl.dot (no split)."""

    tensor_core = False
    m: ConvDgradMatch

    def iterations(self, k: TileKnobs) -> int:
        kg, _, ntaps, _ = self.m.shape
        return ntaps * kg

    def candidates(self) -> list[TileKnobs]:
        c = self.m.gp.space.dims[1]
        if not self.m.device.is_cuda:
            bm = min(32, pow2_at_least(self.m.gp.space.m, 16))
            bn = min(32, pow2_at_least(c, 16))
            return [TileKnobs(BLOCK_M=bm, BLOCK_N=bn, num_warps=4), TileKnobs(BLOCK_M=16, BLOCK_N=16, num_warps=4)]
        # as depthwise.py: >= 8 elements per thread and >= 128 B contiguous per row keep loads wide
        bn = min(128, max(16, pow2_at_least(c, 16)))
        ranked = [(64, min(bn, 64), 4), (32, bn, 4), (128, min(bn, 64), 8), (64, bn, 8), (16, bn, 4)]
        out, seen = [], set()
        for bm, width, warps in ranked:
            if (bm, width) not in seen:
                seen.add((bm, width))
                out.append(TileKnobs(BLOCK_M=bm, BLOCK_N=width, num_warps=warps))
        return out

    def lines(self, ctx: Context, sig: Signature, k: TileKnobs, lo: str, hi: str) -> MainLoop:
        m, gp = self.m, ctx.gp
        assert ctx.dot is not None
        geo, dy, taps, xd = m.geometry, gp.operand("loss"), tuple(gp.operand("filter").dim[2:]), gp.space.dims
        nsp = len(dy.dim) - 2
        mult, _, ntaps, _ = m.shape
        lines = [f"b{a} = y{2 + a} + {geo.pre[a]}" if geo.pre[a] else f"b{a} = y{2 + a}" for a in range(nsp)]
        lines.append(f"acc = tl.zeros((BLOCK_M, BLOCK_N), {ctx.dot.acc})")
        body = [f"tap = it // {mult}", f"dk = col * {mult} + it % {mult}"] if mult > 1 else ["tap = it", "dk = col"]
        moving = [(a, r) for a, r in enumerate(taps) if r > 1]
        body += decompose("tap", moving, "t") if ntaps > 1 else []
        checks = [ctx.tiling.rmask] if ctx.tiling.rmask else []
        body += _positions(geo, taps, xd, dy.dim, checks, m.op.convolution_mode)
        amask = None
        if checks:
            body.append(f"amask = {' & '.join(checks)}")
            amask = "amask"
        ptr = ctx.ptr_of(sig)
        dy_axes = [("r", "y0"), ("c", "dk"), *(("r", f"o{a}") for a in range(nsp))]
        a_idx = TileIndexer(dy_axes, amask, ctx.tiling.cmask, ptr, ("BLOCK_M", "BLOCK_N"), zero=("rm", "rn"))
        w_axes = [("c", "dk"), ("r", "rm"), *(("s", f"wt{a}") for a in range(nsp))]
        b_idx = TileIndexer(w_axes, None, ctx.tiling.cmask, ptr, ("1", "BLOCK_N"), zero=("rm", "rn"))
        body += operand_tile(ctx, sig, "loss", a_idx, "a")
        body += operand_tile(ctx, sig, "filter", b_idx, "b")
        body.append("acc += a * b")
        steps = ntaps * mult
        lines.append(f"for it in tl.static_range({steps}):" if steps <= UNROLL_TAPS else f"for it in range({steps}):")
        return MainLoop(lines + ["    " + line for line in body])


def _select(index: str, values: tuple[int, ...]) -> str:
    """A scalar expression equal to values[index] (index a runtime scalar in [0, len(values)))."""
    if len(set(values)) == 1:
        return str(values[0])
    expr = str(values[-1])
    for i in reversed(range(len(values) - 1)):
        expr = f"tl.where({index} == {i}, {values[i]}, {expr})"
    return expr


ConvDgradTemplate.match_class = ConvDgradMatch
TEMPLATE = ConvDgradTemplate()
