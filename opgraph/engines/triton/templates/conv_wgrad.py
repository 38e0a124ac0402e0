"""conv_wgrad (the filter gradient DW of a convolution) as a GEMM whose reduction runs over the batch and
the output pixels, with the shared prologue / epilogue / reductions of gemm.py: "SBR -> wgrad" (the
scale + bias + relu of a preceding batchnorm applied to the image while it is loaded, the padding
zero after it) and an optimizer step on DW (W - lr * DW, lr read at run time) are one kernel.

GEMM view, per filter tap t (DW[:, :, t] is one GEMM): rows = C / groups input channels c', columns =
K / groups filters of the group (the group is fixed per program), reduction over the N * prod(P)
output pixels j in BLOCK_K steps: A = X^[n, g*Cg + c', o*stride + t*dil - pre] ([BLOCK_M, BLOCK_K],
zero outside the image), B = DY[n, g*Kg + k, o] ([BLOCK_K, BLOCK_N]; NHWC DY is a plain
[pixels, K] matrix). The taps are the per-program "batch" axes of the output space.

The reduction is huge (100k pixels for a ResNet stage at batch 32) and the output small (K x C x
taps), so it is split over SPLIT_K programs (split-K over the pixels): each writes an fp32 (int32)
partial tile to scratch and a combine launch sums the partials in fixed order (deterministic), then
runs the epilogue; it uses its own finer tiles so that it too spreads over the GPU. TAPS=T > 1 gives
each program T taps of the filter with one accumulator each: the DY tile is loaded once per step
for all T (T must divide the number of taps), which cuts the operand traffic when channels are few;
with MERGE_TAPS=1 the T taps and the channels share the tile's rows, one accumulator (_wgrad_merge.py).

Depthwise (one channel per group): each filter element is a dot product over the pixels of one
channel, not a GEMM: each program owns all taps (rows, padded to a power of two) x BLOCK_N channels,
loads a DY tile [pixels, channels] once per step and, for every tap (unrolled), the shifted image
tile, and accumulates their products in fp32 (no tl.dot); split over the pixels as above.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from ....core.config import Support
from ....core.dtypes import DataType
from ....core.errors import AttributeValueError
from ....core.ir import Node
from ....core.piece import Piece
from ....core.symbolic import SymInt
from ....ops.conv import ConvGeometry, ConvolutionMode, ConvWgrad
from ..gemm import (
    BlockedCombine,
    Context,
    DotKind,
    MainLoop,
    OutputSpace,
    Signature,
    TileIndexer,
    TileLoop,
    TileTemplate,
    Tiling,
    decompose,
    dot_kind,
    estimate_us,
    gemm_candidates,
    needs_int64,
    operand_bytes,
    operand_tile,
    prologue_share,
    static,
    uses_fp32,
    with_subtile,
)
from ..knobs import TileKnobs
from ._prologue_pass import OffersProloguePass
from ._wgrad_merge import MergedTaps
from .base import pow2_at_least, unique
from .preferences import MERGED_WGRAD, SBR_WGRAD_LEAN

UNROLL_TAPS = 32  # the depthwise loop unrolls at most this many taps
MIN_GPU_CHANNELS = 8  # fewer input channels per group (not depthwise): no fused neighbours on the GPU
LEAN_PROLOGUE = 48  # SBR -> wgrad: image elements a thread transforms a step, at most (SBR_WGRAD_LEAN)


@dataclass(frozen=True)
class TapTiling(Tiling):
    """Tiles with `per_program` taps (the output space's batch axes) per program: the header leaves
    the tap group `tg` instead of the tap; `tap_lines(j)` then sets bb / pb / y{tap axes} of tap j
    of the group (what the epilogue and the split-K store address)."""

    per_program: int = 1

    @property
    def per_split(self) -> SymInt:
        return self.tiles * (self.space.nbatch // self.per_program) * self.space.groups

    def batch_lines(self) -> list[str]:
        lines = super().batch_lines()
        if self.per_program == 1:
            return lines
        sp = self.space
        return [lines[0], f"tg = pb // {sp.groups}" if sp.groups > 1 else "tg = pb"]

    def batch_coordinate_lines(self) -> list[str]:
        return super().batch_coordinate_lines() if self.per_program == 1 else []  # (per tap: tap_lines)

    def tap_lines(self, j: int) -> list[str]:
        sp = self.space
        if self.per_program == 1:
            return []
        lines = [f"bb = tg * {self.per_program} + {j}"]
        lines.append(f"pb = bb * {sp.groups} + g" if sp.groups > 1 else "pb = bb")
        return lines + decompose("bb", [(a, sp.dims[a]) for a in sp.batch], "y")

    def tap_coords(self, j: int) -> tuple[list[str], list[str]]:
        """Lines computing tap j's coordinates, and their names per spatial axis (before the loop)."""
        sp = self.space
        if self.per_program == 1:
            return [], [f"y{a}" for a in sp.batch]
        lines = [f"tb{j} = tg * {self.per_program} + {j}"]
        lines += decompose(f"tb{j}", [(a, sp.dims[a]) for a in sp.batch], f"tt{j}_")
        return lines, [f"tt{j}_{a}" for a in sp.batch]


def _stencil(dw_dim: tuple[int, ...], x_dim: tuple[int, ...]) -> bool:
    """Depthwise (one channel per group, one filter per group): per-channel dot products."""
    return dw_dim[1] == 1 and dw_dim[0] == x_dim[1]


class ConvWgradTemplate(TileTemplate):
    name = "conv_wgrad"
    priority = 50
    main_kinds = ("conv_wgrad",)
    main_label = "conv_wgrad"

    def space(self, main: Node, piece: Piece) -> OutputSpace:
        dw = piece.tensor(main.output_uids()[0])
        x = piece.tensor(main.input("image"))  # type: ignore[arg-type]
        taps = tuple(range(2, len(dw.dim)))
        if _stencil(dw.dim, x.dim):
            return OutputSpace(dw.dim, rows=taps, col=0)
        return OutputSpace(dw.dim, rows=(1,), col=0, batch=taps, groups=x.dim[1] // dw.dim[1])


class ConvWgradMatch(OffersProloguePass):
    """A conv_wgrad piece: its plain main loop is the GEMM over pixels (TAPS taps a program); a depthwise
    wgrad runs `Stencil`, MERGE_TAPS=1 configs `MergedTaps` (_wgrad_merge.py)."""

    template: ConvWgradTemplate
    combine = BlockedCombine()

    # -- shapes --
    @cached_property
    def is_stencil(self) -> bool:
        return _stencil(self.gp.space.dims, self.gp.operand("image").dim)

    @cached_property
    def geometry(self) -> ConvGeometry:
        op = self.gp.main.op
        assert isinstance(op, ConvWgrad)
        return op.geometry(len(self.gp.space.dims) - 2)

    @cached_property
    def pixels(self) -> int:
        dy = self.gp.operand("loss")
        return dy.dim[0] * math.prod(dy.dim[2:])

    @cached_property
    def ntaps(self) -> int:
        return math.prod(self.gp.space.dims[2:])

    @cached_property
    def elem(self) -> int:
        return operand_bytes(self.gp.operand("image").data_type, self.gp.operand("loss").data_type)

    @cached_property
    def stencil_loop(self) -> Stencil:
        return Stencil(self)

    @cached_property
    def merged_loop(self) -> MergedTaps:
        return MergedTaps(self)

    # -- verdict and hooks --
    def check(self) -> Support:
        gp, device = self.gp, self.device
        x, dy = gp.operand("image"), gp.operand("loss")
        if self.is_stencil:
            if x.data_type.is_integer or dy.data_type.is_integer:
                if x.data_type is not DataType.INT8 or dy.data_type is not DataType.INT8:
                    return Support.no("integer depthwise wgrads need INT8 image and loss", gp.main)
            if DataType.DOUBLE in (x.data_type, dy.data_type):
                return Support.no("DOUBLE convolutions are not supported by the Triton templates", gp.main)
            return Support.yes()
        if device.is_cuda and gp.space.m < MIN_GPU_CHANNELS and len(gp.piece.nodes) > 1:
            return Support.no(
                f"{gp.space.m} input channel(s) per group: the GEMM tiles (16+ rows of channels) are "
                "mostly padding (the ResNet stem's wgrad, 3 channels, took 5.4 ms on an H100), so this "
                "wgrad runs alone, where a library convolution can take it",
                gp.main,
            )
        kind = dot_kind(x.data_type, dy.data_type, interpret=self.interpret)
        if isinstance(kind, str):
            return Support.no(kind, gp.main)
        return Support.yes()

    def loop(self, k: TileKnobs) -> TileLoop:
        if k.merged:  # (its checks refuse depthwise wgrads)
            return self.merged_loop
        return self.stencil_loop if self.is_stencil else self

    def validate(self, k: TileKnobs) -> None:
        if k.persistent:
            raise AttributeValueError(
                "PERSISTENT is not a conv_wgrad knob: its grid is sized by SPLIT_K and TAPS",
                op=self.gp.main.label(),
                rule="triton.conv_wgrad.knob",
                hint="drop PERSISTENT",
            )
        if k.BLOCK_K is None:
            raise AttributeValueError(
                "conv_wgrad configs need BLOCK_K (pixels a step)",
                op=self.gp.main.label(),
                rule="triton.conv_wgrad.knob",
                hint="take configs from engine_configs()",
            )

    def dot(self, k: TileKnobs) -> DotKind:
        x, dy = self.gp.operand("image"), self.gp.operand("loss")
        if self.is_stencil:
            return DotKind("tl.int32", "tl.int32") if x.data_type.is_integer else DotKind("tl.float32", "tl.float32")
        kind = dot_kind(x.data_type, dy.data_type, interpret=self.interpret, fp32_precision=k.precision)
        assert not isinstance(kind, str)
        return kind

    def iterations(self, k: TileKnobs) -> int:
        assert k.BLOCK_K is not None
        return -(-self.pixels // k.BLOCK_K)

    def constexprs(self, k: TileKnobs) -> dict[str, int]:
        assert k.BLOCK_K is not None
        return {"BLOCK_M": k.BLOCK_M, "BLOCK_N": k.BLOCK_N, "BLOCK_K": k.BLOCK_K}

    def per_program(self, k: TileKnobs) -> int:
        taps = 1 if self.is_stencil else k.taps
        if taps < 1 or self.ntaps % taps:
            divisors = [d for d in range(1, self.ntaps + 1) if self.ntaps % d == 0]
            raise AttributeValueError(
                f"TAPS={taps} must divide the filter's {self.ntaps} taps",
                op=self.gp.main.label(),
                rule="triton.conv_wgrad.knob",
                hint=f"use one of {divisors}",
            )
        return taps

    def tiling(self, k: TileKnobs) -> Tiling:
        split = k.split_k
        sp = self.gp.space
        scratch = sp.partials(split) if split > 1 or k.merged else 0
        return TapTiling(
            sp, k.BLOCK_M, k.BLOCK_N, k.group_m, split, needs_int64(self.gp, scratch), per_program=self.per_program(k)
        )

    # -- knobs --
    def candidates(self) -> list[TileKnobs]:
        gp, device = self.gp, self.device
        if self.is_stencil:
            return self.stencil_loop.candidates()
        x, dy = gp.operand("image"), gp.operand("loss")
        extra: dict[str, Any] = {"fp32_precision": "tf32"} if uses_fp32(x.data_type, dy.data_type) else {}
        elem = self.elem
        sp = gp.space
        pixels = self.pixels
        merged = self.merged_loop
        if not device.is_cuda:
            configs = gemm_candidates(
                sp.m,
                sp.n,
                pixels,
                nprog=sp.nbatch * sp.groups,
                device=device,
                elem_bytes=elem,
                moved_bytes=gp.moved_bytes(),
                extra=extra,
            )
            first = configs[0]
            assert first.BLOCK_K is not None
            iters = -(-pixels // first.BLOCK_K)
            # a split whenever the loop is long, so that the tests run the combine launch
            configs = [first.replace(SPLIT_K=max(first.split_k, min(4, iters // 2)) if iters >= 4 else 1), *configs[1:]]
            if merged.applies:  # before the broadest config (a saved plan may hold one)
                configs = MERGED_WGRAD.apply(configs, merged.candidates(extra), -1)
        else:
            configs = self._gpu_candidates(extra)
            if merged.applies:
                configs = MERGED_WGRAD.apply(configs, merged.candidates(extra), 1)
            if gp.prologue.get(gp.main.input("image")):  # type: ignore[arg-type]
                # the prologue runs on every tap's image tile in registers beside the taps' accumulators
                most = max(c.taps for c in configs)
                configs = SBR_WGRAD_LEAN.apply(
                    configs, lambda c: c.taps == most and prologue_share(c, most) <= LEAN_PROLOGUE
                )
        configs = with_subtile(configs, gp, device)
        if "fp32_precision" in extra:
            configs.insert(1, configs[0].replace(fp32_precision="ieee"))
        return self.offer_prologue_pass(configs, self.ntaps)

    def _gpu_candidates(self, extra: Mapping[str, Any]) -> list[TileKnobs]:
        """Tiles as wide as the channels need (a ResNet wgrad is 64-256 x 64-256 per tap), TAPS along
        the filter's last axis when the tiles are small, and SPLIT_K so that the grid holds ~2
        programs per SM, capped so that the partials stay small next to the operands; ranked by the
        cost model. The top config also comes with twice its split (more programs, more partials)."""
        sp = self.gp.space
        bk = {1: 128, 2: 64}.get(self.elem, 32)
        out = []
        shapes = [(128, 128), (64, 128), (128, 64), (64, 64), (64, 32), (32, 64), (32, 32)]
        last_axis = sp.dims[-1] if len(sp.dims) > 2 else 1
        for bm, bn in shapes:
            if bm > max(32, pow2_at_least(sp.m, 32)) or bn > max(32, pow2_at_least(sp.n, 32)):
                continue
            for taps in sorted({1, last_axis}):
                if taps > 1 and bm * bn > 8192:
                    continue  # big tiles already reuse operands; T accumulators would spill
                warps = 8 if bm * bn >= 16384 or taps > 1 and bm * bn >= 8192 else 4
                stages = 3 if taps > 1 or bm * bn >= 16384 else 4
                out.append(
                    TileKnobs(
                        BLOCK_M=bm,
                        BLOCK_N=bn,
                        BLOCK_K=bk,
                        GROUP_M=8,
                        SPLIT_K=self.split_for(bm, bn, taps, bk),
                        TAPS=taps,
                        num_warps=warps,
                        num_stages=stages,
                        **extra,
                    )
                )
        out.sort(key=self._cost)
        out = out[:6]
        top = out[0]
        if -(-self.pixels // bk) // (2 * top.split_k) >= 8:
            out.insert(1, top.replace(SPLIT_K=2 * top.split_k))
        # the fallback: one tap per program, plain 64 x 64 tiles, the reduction still split
        small = min(bk, 32) if self.elem != 1 else bk
        out.append(
            TileKnobs(
                BLOCK_M=64,
                BLOCK_N=64,
                BLOCK_K=small,
                GROUP_M=8,
                SPLIT_K=self.split_for(64, 64, 1, small),
                TAPS=1,
                num_warps=4,
                num_stages=2,
                **extra,
            )
        )
        return unique(out)

    def split_for(self, bm: int, bn: int, taps: int, bk: int) -> int:
        """SPLIT_K for ~2 programs per SM with >= 8 steps each, halved while the partials exceed half
        the bytes of the operands."""
        sp = self.gp.space
        programs = static(TapTiling(sp, bm, bn, per_program=taps).per_split)
        iters = -(-self.pixels // bk)
        split = max(1, min(iters // 8, -(-2 * max(self.device.sm_count, 1) // programs)))
        while split > 1 and sp.partials(split) * 4 > self.gp.moved_bytes() // 2:
            split //= 2
        return split

    def _cost(self, k: TileKnobs) -> float:
        sp = self.gp.space
        taps = k.taps
        t = estimate_us(
            sp.m,
            sp.n,
            self.pixels,
            k,
            nprog=sp.nbatch * sp.groups,
            device=self.device,
            elem_bytes=self.elem,
            moved_bytes=self.gp.moved_bytes(),
        )
        # operand traffic through L2: the image once per tap, DY once per tap group (~8 TB/s on Hopper)
        x, dy = self.gp.operand("image"), self.gp.operand("loss")
        tiles_m, tiles_n = -(-sp.m // k.BLOCK_M), -(-sp.n // k.BLOCK_N)
        l2 = sp.nbatch * (x.nbytes * tiles_n + dy.nbytes * tiles_m / taps)
        return max(t, l2 / 8e12 * 1e6 + 3.0)

    def cost(self, k: TileKnobs) -> float | None:
        if not self.device.is_cuda:
            return None
        if self.is_stencil:
            return self.gp.moved_bytes() / (0.6 * 3.0e12) * 1e6 + 5.0
        return self._cost(k)

    # -- main loops --
    def dy_step(self, ctx: Context, sig: Signature, bk: int) -> tuple[list[str], str | None]:
        """A main-loop step's output pixels (j, its mask, jp{axis}) and its DY tile `b` [BLOCK_K pixels,
        BLOCK_N filters]; the mask's name is returned."""
        dy = ctx.gp.operand("loss")
        body = ["j = it * BLOCK_K + tl.arange(0, BLOCK_K)"]
        jmask = None
        if self.pixels % bk:
            body.append(f"jmask = j < {self.pixels}")
            jmask = "jmask"
        axes = [(0, dy.dim[0]), *((a, dy.dim[a]) for a in range(2, len(dy.dim)))]
        body += decompose("j", axes, "jp")
        pixel_rows = ("j", tuple(axes))
        dy_axes = [("r", "jp0"), ("c", "col"), *(("r", f"jp{2 + a}") for a in range(len(dy.dim) - 2))]
        b_idx = TileIndexer(
            dy_axes, jmask, ctx.tiling.cmask, ctx.ptr_of(sig), ("BLOCK_K", "BLOCK_N"), pixel_rows, zero=("j", "rn")
        )
        return body + operand_tile(ctx, sig, "loss", b_idx, "b"), jmask

    def image_positions(
        self, ctx: Context, taps: list[str], jmask: str | None, name: str
    ) -> tuple[list[str], str | None]:
        """Image positions {name}_{a} of the step's pixels at the taps named `taps` (per spatial axis), and
        their mask `{name}_m` (None: all inside)."""
        gp = ctx.gp
        op = gp.main.op
        assert isinstance(op, ConvWgrad)
        geo = self.geometry
        x, dy = gp.operand("image"), gp.operand("loss")
        dw = gp.space.dims
        flip = op.convolution_mode is ConvolutionMode.CONVOLUTION
        lines, checks = [], [jmask] if jmask else []
        for a in range(len(dw) - 2):
            r, s, d, p0 = dw[2 + a], geo.stride[a], geo.dilation[a], geo.pre[a]
            tap = f"({r - 1} - {taps[a]})" if flip and r > 1 else taps[a] if r > 1 else "0"
            terms = [f"jp{2 + a}" if s == 1 else f"jp{2 + a} * {s}"]
            if r > 1:
                terms.append(tap if d == 1 else f"{tap} * {d}")
            expr = " + ".join(terms) + (f" - {p0}" if p0 else "")
            lines.append(f"{name}_{a} = {expr}")
            if p0 > 0:
                checks.append(f"({name}_{a} >= 0)")
            if (dy.dim[2 + a] - 1) * s + (r - 1) * d - p0 > x.dim[2 + a] - 1:
                checks.append(f"({name}_{a} < {x.dim[2 + a]})")
        if not checks:
            return lines, None
        lines.append(f"{name}_m = {' & '.join(checks)}")
        return lines, f"{name}_m"

    def lines(self, ctx: Context, sig: Signature, k: TileKnobs, lo: str, hi: str) -> MainLoop:
        """The GEMM over pixels: per step the DY tile once and, per tap of the program, the image tile at
        that tap and one dot into the tap's accumulator."""
        gp = ctx.gp
        assert ctx.dot is not None and isinstance(ctx.tiling, TapTiling) and k.BLOCK_K is not None
        tiling = ctx.tiling
        x = gp.operand("image")
        nsp = len(x.dim) - 2
        sp = gp.space
        ptr = ctx.ptr_of(sig)
        per = tiling.per_program
        accs = ["acc"] if per == 1 else [f"acc{j}" for j in range(per)]
        lines = [f"xc = g * {sp.dims[1]} + rm" if sp.groups > 1 else "xc = rm"]
        tap_names = []
        for j in range(per):
            coord_lines, names = tiling.tap_coords(j)
            lines += coord_lines
            tap_names.append(names)
        lines += [f"{acc} = tl.zeros((BLOCK_M, BLOCK_N), {ctx.dot.acc})" for acc in accs]
        body, jmask = self.dy_step(ctx, sig, k.BLOCK_K)
        for j, acc in enumerate(accs):
            pos, pmask = self.image_positions(ctx, tap_names[j], jmask, f"xi{j}")
            body += pos
            x_axes = [("c", "jp0"), ("r", "xc"), *(("c", f"xi{j}_{a}") for a in range(nsp))]
            a_idx = TileIndexer(x_axes, tiling.rmask, pmask, ptr, ("BLOCK_M", "BLOCK_K"), zero=("rm", "j"))
            body += operand_tile(ctx, sig, "image", a_idx, "a")
            body.append(f"{acc} = {ctx.dot.call('a', 'b', acc)}")
        lines.append(f"for it in range({lo}, {hi}):")
        return MainLoop(lines + ["    " + line for line in body], tuple(accs))


class Stencil(TileLoop):
    """Depthwise: per step a DY tile [BLOCK_K pixels, BLOCK_N channels] and, per tap, the shifted image
    tile; acc_t[channels] += sum over pixels of their product; the taps' sums are placed in the rows of
    `acc` at the end (no tl.dot: BLOCK_K may be 8)."""

    tensor_core = False
    m: ConvWgradMatch

    def iterations(self, k: TileKnobs) -> int:
        return self.m.iterations(k)

    def candidates(self) -> list[TileKnobs]:
        m = self.m
        sp = m.gp.space
        bm = max(16, pow2_at_least(sp.m, 16))  # all taps in one tile
        pixels = m.pixels
        if not m.device.is_cuda:
            bn = min(32, pow2_at_least(sp.n, 16))
            iters = -(-pixels // 16)
            return [
                TileKnobs(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=16, SPLIT_K=min(4, max(1, iters // 2)), num_warps=4),
                TileKnobs(BLOCK_M=bm, BLOCK_N=16, BLOCK_K=16, SPLIT_K=1, num_warps=4),
            ]
        sms = max(m.device.sm_count, 1)
        out = []
        for bn, bk, warps in ((64, 16, 4), (128, 8, 4), (32, 32, 4), (64, 32, 8)):
            if bn > max(16, pow2_at_least(sp.n, 16)):
                continue
            tiles = -(-sp.n // bn)
            iters = -(-pixels // bk)
            split = max(1, min(iters // 8, -(-2 * sms // tiles)))
            out.append(TileKnobs(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split, num_warps=warps))
        out.append(TileKnobs(BLOCK_M=bm, BLOCK_N=16, BLOCK_K=16, SPLIT_K=1, num_warps=4))
        return out

    def lines(self, ctx: Context, sig: Signature, k: TileKnobs, lo: str, hi: str) -> MainLoop:
        m, gp = self.m, ctx.gp
        assert ctx.dot is not None and k.BLOCK_K is not None
        x = gp.operand("image")
        nsp = len(x.dim) - 2
        sp = gp.space
        ntaps = m.ntaps
        ptr = ctx.ptr_of(sig)
        acc_t = ctx.dot.acc
        unroll = ntaps <= UNROLL_TAPS
        lines = []
        if unroll:
            lines += [f"acc_t{t} = tl.zeros((BLOCK_K, BLOCK_N), {acc_t})" for t in range(ntaps)]
        else:
            lines.append(f"acc = tl.zeros((BLOCK_M, BLOCK_N), {acc_t})")
        body, jmask = m.dy_step(ctx, sig, k.BLOCK_K)
        taps = [(a, sp.dims[a]) for a in range(2, len(sp.dims))]
        if unroll:
            for t in range(ntaps):
                coords = _unravel(t, [r for _, r in taps])
                pos, pmask = m.image_positions(ctx, [str(c) for c in coords], jmask, "xi")
                body += pos
                x_axes = [("r", "jp0"), ("c", "col"), *(("r", f"xi_{a}") for a in range(nsp))]
                a_idx = TileIndexer(x_axes, pmask, ctx.tiling.cmask, ptr, ("BLOCK_K", "BLOCK_N"), zero=("j", "rn"))
                body += operand_tile(ctx, sig, "image", a_idx, "a")
                body.append(f"acc_t{t} += a * b")
            lines.append(f"for it in range({lo}, {hi}):")
            lines += ["    " + line for line in body]
            lines.append(f"acc = tl.zeros((BLOCK_M, BLOCK_N), {acc_t})")
            for t in range(ntaps):
                lines.append(f"acc = tl.where((rm == {t})[:, None], tl.sum(acc_t{t}, axis=0)[None, :], acc)")
            return MainLoop(lines)
        # many taps (3-D): a runtime tap loop, each tap's sum placed in its row at once
        inner = ["for tap in range(" + str(ntaps) + "):"]
        tap_lines = decompose("tap", [(a - 2, r) for a, r in taps], "tc")
        pos, pmask = m.image_positions(ctx, [f"tc{a}" for a in range(nsp)], jmask, "xi")
        x_axes = [("r", "jp0"), ("c", "col"), *(("r", f"xi_{a}") for a in range(nsp))]
        a_idx = TileIndexer(x_axes, pmask, ctx.tiling.cmask, ptr, ("BLOCK_K", "BLOCK_N"), zero=("j", "rn"))
        tap_body = tap_lines + pos + operand_tile(ctx, sig, "image", a_idx, "a")
        tap_body.append("acc = tl.where((rm == tap)[:, None], acc + tl.sum(a * b, axis=0)[None, :], acc)")
        body += inner + ["    " + line for line in tap_body]
        lines.append(f"for it in range({lo}, {hi}):")
        return MainLoop(lines + ["    " + line for line in body])


def _unravel(index: int, sizes: list[int]) -> list[int]:
    out = []
    for size in reversed(sizes):
        out.append(index % size)
        index //= size
    return list(reversed(out))


ConvWgradTemplate.match_class = ConvWgradMatch
TEMPLATE = ConvWgradTemplate()
