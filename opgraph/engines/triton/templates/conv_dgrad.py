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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ....core.config import Support
from ....core.device import Device
from ....core.dtypes import DataType
from ....core.ir import Node
from ....core.piece import Piece
from ....ops.conv import ConvDgrad, ConvGeometry, ConvolutionMode
from ..gemm import (
    Context,
    DotKind,
    GemmPiece,
    OutputSpace,
    Signature,
    TileIndexer,
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
from .base import pow2_at_least

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

    def header(self, *, with_split: bool, pid: str = "tl.program_id(0)") -> list[str]:
        lines = super().header(with_split=with_split, pid=pid)
        ph = self.phases
        assert ph is not None
        sp = self.space
        nsp = len(ph.stride)
        # replace the natural row decomposition (from "rm = ..." on) with the phase-ordered one
        start = next(i for i, line in enumerate(lines) if line.startswith("rm = "))
        cut = next(i for i, line in enumerate(lines) if line.startswith("col = "))
        rows = [
            f"phase = pid_m // {self.npm_phase}",
            f"ru = (pid_m % {self.npm_phase}) * BLOCK_M + tl.arange(0, BLOCK_M)",
        ]
        strided = [(a, s) for a, s in enumerate(ph.stride) if s > 1]
        rows += decompose("phase", [(a, s) for a, s in strided], "ph") if strided else []
        rows += decompose("ru", [(0, sp.dims[0]), *((2 + a, ph.extent[a]) for a in range(nsp))], "u")
        rows.append("y0 = u0")
        masks = [f"(ru < {self.phase_rows})"] if self.phase_rows % self.block_m else []
        for a in range(nsp):
            s = ph.stride[a]
            rows.append(f"y{2 + a} = ph{a} + u{2 + a} * {s}" if s > 1 else f"y{2 + a} = u{2 + a}")
            if ph.size[a] % s:
                masks.append(f"(y{2 + a} < {ph.size[a]})")
        flat = "y0"
        for a in range(nsp):
            flat = f"({flat}) * {ph.size[a]} + y{2 + a}"
        rows.append(f"rm = {flat}")
        rows.append("rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)")
        if masks:
            rows.append(f"rmask = {' & '.join(masks)}")
        if self.cmask:
            rows.append(f"cmask = rn < {sp.n}")
        natural = tuple(f"{p}{a} = " for a in sp.rows for p in ("y", "q_y"))
        rest = [line for line in lines[cut:] if not line.startswith(natural)]
        return lines[:start] + rows + rest


@dataclass(frozen=True)
class _LoopOperands:
    """What every dgrad main loop starts from: the op, its geometry, DY, the spatial rank, the
    filter taps and DX's dims."""

    op: ConvDgrad
    geo: ConvGeometry
    dy: Any
    nsp: int
    taps: tuple[int, ...]
    xd: tuple[int, ...]


class ConvDgradTemplate(TileTemplate):
    name = "conv_dgrad"
    priority = 50
    main_kinds = ("conv_dgrad",)
    main_label = "conv_dgrad"

    # -- shapes --
    @staticmethod
    def _stencil(w_dim: tuple[int, ...]) -> bool:
        """Depthwise (one channel per group): the stencil main loop instead of a GEMM."""
        return w_dim[1] == 1

    def space(self, main: Node, piece: Piece) -> OutputSpace:
        dx = piece.tensor(main.output_uids()[0])
        w = piece.tensor(main.input("filter"))  # type: ignore[arg-type]
        groups = 1 if self._stencil(w.dim) else dx.dim[1] // w.dim[1]
        return OutputSpace(dx.dim, rows=(0, *range(2, len(dx.dim))), col=1, groups=groups)

    @staticmethod
    def _shape(gp: GemmPiece) -> tuple[int, int, int, int]:
        """(filters per group, channels per group, filter taps, groups)."""
        w = gp.operand("filter")
        c = gp.space.dims[1]
        groups = c // w.dim[1]
        return w.dim[0] // groups, w.dim[1], math.prod(w.dim[2:]), groups

    def _geometry(self, gp: GemmPiece) -> ConvGeometry:
        op = gp.main.op
        assert isinstance(op, ConvDgrad)
        return op.geometry(len(gp.space.dims) - 2)


    def _loop_operands(self, gp: GemmPiece) -> _LoopOperands:
        op = gp.main.op
        assert isinstance(op, ConvDgrad)
        dy, w = gp.operand("loss"), gp.operand("filter")
        return _LoopOperands(op, self._geometry(gp), dy, len(dy.dim) - 2, tuple(w.dim[2:]), tuple(gp.space.dims))
    def _phases(self, gp: GemmPiece, knobs: Mapping[str, Any]) -> Phases | None:
        geo = self._geometry(gp)
        if self._stencil(gp.operand("filter").dim) or all(s == 1 for s in geo.stride):
            return None
        if not int(knobs.get("PHASES", 1)):
            return None
        return Phases.make(geo, tuple(gp.space.dims[2:]), tuple(gp.operand("filter").dim[2:]))

    # -- TileTemplate hooks --
    def check(self, gp: GemmPiece, device: Device) -> Support:
        dy, w = gp.operand("loss"), gp.operand("filter")
        if self._stencil(w.dim):
            if dy.data_type.is_integer or w.data_type.is_integer:
                if dy.data_type is not DataType.INT8 or w.data_type is not DataType.INT8:
                    return Support.no("integer depthwise dgrads need INT8 loss and filter", gp.main)
            if DataType.DOUBLE in (dy.data_type, w.data_type):
                return Support.no("DOUBLE convolutions are not supported by the Triton templates", gp.main)
            return Support.yes()
        kind = dot_kind(dy.data_type, w.data_type, interpret=not device.is_cuda)
        if isinstance(kind, str):
            return Support.no(kind, gp.main)
        return Support.yes()

    def dot(self, gp: GemmPiece, knobs: Mapping[str, Any], device: Device) -> DotKind:
        dy, w = gp.operand("loss"), gp.operand("filter")
        if self._stencil(w.dim):
            return DotKind("tl.int32", "tl.int32") if dy.data_type.is_integer else DotKind("tl.float32", "tl.float32")
        kind = dot_kind(dy.data_type, w.data_type, interpret=not device.is_cuda,
                        fp32_precision=knobs.get("fp32_precision", "tf32"))
        assert not isinstance(kind, str)
        return kind

    def iterations(self, gp: GemmPiece, knobs: Mapping[str, Any]) -> int:
        kg, _, ntaps, _ = self._shape(gp)
        if self._stencil(gp.operand("filter").dim):
            return ntaps * kg
        phases = self._phases(gp, knobs)
        taps = phases.max_taps() if phases is not None else ntaps
        return taps * -(-kg // int(knobs["BLOCK_K"]))

    def tiling(self, gp: GemmPiece, knobs: Mapping[str, Any]) -> Tiling:
        stencil = self._stencil(gp.operand("filter").dim)
        split = 1 if stencil else int(knobs.get("SPLIT_K", 1))
        sp = gp.space
        scratch = split * sp.nbatch * sp.groups * sp.m * sp.n if split > 1 else 0
        big = needs_int64(gp, scratch)
        bm, bn, gm = int(knobs["BLOCK_M"]), int(knobs["BLOCK_N"]), int(knobs.get("GROUP_M", 8))
        phases = self._phases(gp, knobs)
        if phases is not None:
            return PhaseTiling(sp, bm, bn, gm, split, big, phases=phases)
        return Tiling(sp, bm, bn, gm, split, big)

    def constexprs(self, knobs: Mapping[str, Any]) -> dict[str, int]:
        out = {"BLOCK_M": int(knobs["BLOCK_M"]), "BLOCK_N": int(knobs["BLOCK_N"])}
        if "BLOCK_K" in knobs:
            out["BLOCK_K"] = int(knobs["BLOCK_K"])
        return out

    # -- knobs --
    def candidates(self, piece: Piece, device: Device) -> list[dict[str, Any]]:
        gp, verdict = self.analyze(piece)
        assert gp is not None, verdict.reason
        dy, w = gp.operand("loss"), gp.operand("filter")
        if self._stencil(w.dim):
            return self._stencil_candidates(gp, device)
        kg, cg, ntaps, groups = self._shape(gp)
        extra: dict[str, Any] = {"fp32_precision": "tf32"} if uses_fp32(dy.data_type, w.data_type) else {}
        geo = self._geometry(gp)
        strided = any(s > 1 for s in geo.stride)
        if strided:
            extra["PHASES"] = 1
        taps = ntaps
        if strided:
            taps = max(1, round(Phases.make(geo, tuple(gp.space.dims[2:]), tuple(w.dim[2:])).mean_taps()))
        elem = operand_bytes(dy.data_type, w.data_type)
        configs = gemm_candidates(gp.space.m, gp.space.n, kg * taps, nprog=groups, device=device,
                                  elem_bytes=elem, k_step=kg, moved_bytes=gp.moved_bytes(), extra=extra)
        if device.is_cuda and gp.prologue.get(gp.main.input("loss")):  # type: ignore[arg-type]
            small = [c for c in configs[:-1] if c["BLOCK_M"] <= 128]
            configs = small[:1] + [c for c in configs if c not in small[:1]]
        configs = with_subtile(configs, gp, device)
        if "fp32_precision" in extra:
            configs.insert(1, {**configs[0], "fp32_precision": "ieee"})
        if strided:
            configs.append({**configs[-1], "PHASES": 0})  # the masked path, as a fallback
        return configs

    def _stencil_candidates(self, gp: GemmPiece, device: Device) -> list[dict[str, Any]]:
        c = gp.space.dims[1]
        if not device.is_cuda:
            bm = min(32, pow2_at_least(gp.space.m, 16))
            bn = min(32, pow2_at_least(c, 16))
            return [{"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": 4}, {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4}]
        # as depthwise.py: >= 8 elements per thread and >= 128 B contiguous per row keep loads wide
        bn = min(128, max(16, pow2_at_least(c, 16)))
        ranked = [(64, min(bn, 64), 4), (32, bn, 4), (128, min(bn, 64), 8), (64, bn, 8), (16, bn, 4)]
        out, seen = [], set()
        for bm, width, warps in ranked:
            if (bm, width) not in seen:
                seen.add((bm, width))
                out.append({"BLOCK_M": bm, "BLOCK_N": width, "num_warps": warps})
        return out

    def estimate(self, piece: Piece, knobs: Mapping[str, Any], device: Device) -> float | None:
        gp, _ = self.analyze(piece)
        if gp is None or not device.is_cuda:
            return None
        if self._stencil(gp.operand("filter").dim):
            return gp.moved_bytes() / (0.8 * 3.0e12) * 1e6 + 3.0
        kg, _, ntaps, groups = self._shape(gp)
        phases = self._phases(gp, knobs)
        taps = phases.mean_taps() if phases is not None else float(ntaps)  # masked holes still cost
        elem = operand_bytes(gp.operand("loss").data_type, gp.operand("filter").data_type)
        return estimate_us(gp.space.m, gp.space.n, max(1, round(kg * taps)), knobs, nprog=groups, device=device,
                           elem_bytes=elem, k_step=kg, moved_bytes=gp.moved_bytes())

    # -- main loops --
    def mainloop(self, ctx: Context, sig: Signature, knobs: Mapping[str, Any], lo: str, hi: str) -> list[str]:
        if self._stencil(ctx.gp.operand("filter").dim):
            return self._stencil_loop(ctx, sig)
        if isinstance(ctx.tiling, PhaseTiling):
            return self._phase_loop(ctx, sig, knobs, lo, hi)
        return self._masked_loop(ctx, sig, knobs, lo, hi)

    def _operands(self, ctx: Context, sig: Signature, kmask: str | None, amask: str | None,
                  flat: bool) -> list[str]:
        """The A (DY at positions o{a}, filters dk) and B (W at taps wt{a}) tiles, and the product."""
        gp = ctx.gp
        assert ctx.dot is not None
        nsp = len(gp.space.dims) - 2
        ptr = ctx.ptr_of(sig)
        dy_axes = [("r", "y0"), ("c", "dk"), *(("r", f"o{a}") for a in range(nsp))]
        rows = ("rm", tuple((a, gp.space.dims[a]) for a in gp.space.rows)) if flat else None
        a_idx = TileIndexer(dy_axes, amask, kmask, ptr, ("BLOCK_M", "BLOCK_K"), rows, zero=("rm", "kc"),
                            select=kmask)
        w_axes = [("r", "dk"), ("c", "rn"), *(("s", f"wt{a}") for a in range(nsp))]
        b_idx = TileIndexer(w_axes, kmask, ctx.tiling.cmask, ptr, ("BLOCK_K", "BLOCK_N"), zero=("kc", "rn"),
                            select=kmask)
        lines = operand_tile(ctx, sig, "loss", a_idx, "a")
        lines += operand_tile(ctx, sig, "filter", b_idx, "b")
        lines.append(f"acc = {ctx.dot.call('a', 'b', 'acc')}")
        return lines

    def _k_chunk(self, gp: GemmPiece, bk: int, nkb: int) -> tuple[list[str], str | None]:
        """Lines giving `tap` (the flat tap step), `kc` (filters of this step within the group), `dk`
        (global filter index) and the filter mask."""
        kg, _, _, groups = self._shape(gp)
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

    def _masked_loop(self, ctx: Context, sig: Signature, knobs: Mapping[str, Any], lo: str, hi: str) -> list[str]:
        """Pixels in natural order; every tap, holes of a stride masked."""
        gp = ctx.gp
        assert ctx.dot is not None
        lp = self._loop_operands(gp)
        op, geo, dy, nsp, taps, xd = lp.op, lp.geo, lp.dy, lp.nsp, lp.taps, lp.xd
        kg, _, ntaps, _ = self._shape(gp)
        bk = int(knobs["BLOCK_K"])
        nkb = -(-kg // bk)
        lines = [f"b{a} = y{2 + a} + {geo.pre[a]}" if geo.pre[a] else f"b{a} = y{2 + a}" for a in range(nsp)]
        lines.append(f"acc = tl.zeros((BLOCK_M, BLOCK_N), {ctx.dot.acc})")
        body, kmask = self._k_chunk(gp, bk, nkb)
        moving = [(a, r) for a, r in enumerate(taps) if r > 1]
        body += decompose("tap", moving, "t") if ntaps > 1 else []
        checks = [ctx.tiling.rmask] if ctx.tiling.rmask else []
        body += self._positions(geo, taps, xd, dy.dim, checks, op.convolution_mode)
        amask = None
        if checks:
            body.append(f"amask = {' & '.join(checks)}")
            amask = "amask"
        flat = all(r == 1 for r in taps) and all(s == 1 for s in geo.stride) and not any(geo.pre) \
            and tuple(dy.dim[2:]) == tuple(xd[2:])
        body += self._operands(ctx, sig, kmask, amask, flat)
        lines.append(f"for it in range({lo}, {hi}):")
        return lines + ["    " + line for line in body]

    @staticmethod
    def _positions(geo: ConvGeometry, taps: tuple[int, ...], xd: tuple[int, ...], yd: tuple[int, ...],
                   checks: list[str], mode: ConvolutionMode) -> list[str]:
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

    def _phase_loop(self, ctx: Context, sig: Signature, knobs: Mapping[str, Any], lo: str, hi: str) -> list[str]:
        """Pixels of one phase per program; only the taps that reach the phase."""
        gp = ctx.gp
        assert ctx.dot is not None and isinstance(ctx.tiling, PhaseTiling)
        ph = ctx.tiling.phases
        assert ph is not None
        lp = self._loop_operands(gp)
        op, geo, dy, nsp, taps = lp.op, lp.geo, lp.dy, lp.nsp, lp.taps
        kg, _, _, _ = self._shape(gp)
        bk = int(knobs["BLOCK_K"])
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
        body, kmask = self._k_chunk(gp, bk, nkb)
        rest = "tap"
        for a in reversed(range(nsp)):
            if a == 0:
                body.append(f"j{a} = {rest}")
            else:
                body += [f"j{a} = {rest} % n{a}", f"tq{a} = {rest} // n{a}"]
                rest = f"tq{a}"
        checks = [ctx.tiling.rmask] if ctx.tiling.rmask else []
        flip = op.convolution_mode is ConvolutionMode.CONVOLUTION
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
        body += self._operands(ctx, sig, kmask, amask, flat=False)
        lines.append(f"for it in range({lo}, tl.minimum({hi}, trips)):")
        return lines + ["    " + line for line in body]

    def _stencil_loop(self, ctx: Context, sig: Signature) -> list[str]:
        """Depthwise: acc[pixels, channels] += DY[.., c*m + j, o(tap)] * W[c*m + j, 0, tap] over the taps
        and the channel multiplier m, without tl.dot."""
        gp = ctx.gp
        assert ctx.dot is not None
        lp = self._loop_operands(gp)
        op, geo, dy, nsp, taps, xd = lp.op, lp.geo, lp.dy, lp.nsp, lp.taps, lp.xd
        mult, _, ntaps, _ = self._shape(gp)
        lines = [f"b{a} = y{2 + a} + {geo.pre[a]}" if geo.pre[a] else f"b{a} = y{2 + a}" for a in range(nsp)]
        lines.append(f"acc = tl.zeros((BLOCK_M, BLOCK_N), {ctx.dot.acc})")
        body = [f"tap = it // {mult}", f"dk = col * {mult} + it % {mult}"] if mult > 1 else ["tap = it", "dk = col"]
        moving = [(a, r) for a, r in enumerate(taps) if r > 1]
        body += decompose("tap", moving, "t") if ntaps > 1 else []
        checks = [ctx.tiling.rmask] if ctx.tiling.rmask else []
        body += self._positions(geo, taps, xd, dy.dim, checks, op.convolution_mode)
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
        return lines + ["    " + line for line in body]


def _select(index: str, values: tuple[int, ...]) -> str:
    """A scalar expression equal to values[index] (index a runtime scalar in [0, len(values)))."""
    if len(set(values)) == 1:
        return str(values[0])
    expr = str(values[-1])
    for i in reversed(range(len(values) - 1)):
        expr = f"tl.where({index} == {i}, {values[i]}, {expr})"
    return expr


TEMPLATE = ConvDgradTemplate()
