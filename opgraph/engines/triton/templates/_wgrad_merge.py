"""conv_wgrad's MERGE_TAPS=1 configs (few channels per group: a stem's 3): the tile's rows run over
TAPS filter taps and the channels together, (tap, c) with c fastest, instead of over the channels alone.

The plain wgrad tile has C / groups rows (16+ after padding) per tap: the 7x7 stem's 3 channels fill
3 of 16-32 rows, and its 49 taps are 49 (or 7 groups of 7) such tiles, each loading the image and DY
again (over 20x cuDNN's time in the ResNet-18 training step: bench/results/triton-preferences.md
#merged-wgrad). Merged, a program's rows are the lanes (tap, c) of TAPS taps (a filter row: 7 x 3 = 21 lanes
padded to 32; or every tap: 147 to 256): one A tile [lanes, pixels] gathered from the image (its
column depends on the lane and the pixel: a [rows, cols] index, `TileIndexer`'s "t" axes), one DY tile,
one dot a step. Lanes past TAPS x C are wrapped onto real ones (their rows of the dot are computed and
never stored), and image positions outside the image on an axis of several taps are wrapped into it for
the loads and zeroed by a select (gemm/indexing.py says why); the pixel tail and the bounds of an axis of
one tap (a column mask) stay in the loads, as in the plain wgrad.

The lanes of a tile are several taps of the output space (whose rows are the channels and whose batch
axes are the taps), so the main kernel always writes fp32 partials to scratch at each lane's own (tap,
channel) and the split-K combine launch, unchanged, sums them and runs the epilogue (even at SPLIT_K=1).
These configs are candidates the tuner times, after the heuristic's first config (MERGED_WGRAD,
preferences.py), until a GPU run has measured them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import cached_property
from typing import Any, Protocol

from ....core.device import Device
from ....core.errors import AttributeValueError
from ....ops.conv import ConvGeometry, ConvolutionMode, ConvWgrad
from ..gemm import Context, GemmPiece, MainLoop, Signature, TileIndexer, TileLoop, decompose, operand_tile
from ..knobs import TileKnobs
from .base import pow2_at_least
from .conv_fprop import MERGE, MERGE_BELOW

MAX_LANES = 256  # rows of a merged tile, at most


class WgradMatch(Protocol):
    """What the merged loop asks of conv_wgrad's match (ConvWgradMatch)."""

    gp: GemmPiece
    device: Device

    @property
    def elem(self) -> int: ...

    @property
    def pixels(self) -> int: ...

    @property
    def geometry(self) -> ConvGeometry: ...

    def iterations(self, k: TileKnobs) -> int: ...

    def per_program(self, k: TileKnobs) -> int: ...

    def split_for(self, bm: int, bn: int, taps: int, bk: int) -> int: ...

    def dy_step(self, ctx: Context, sig: Signature, bk: int) -> tuple[list[str], str | None]: ...


class MergedTaps(TileLoop):
    """conv_wgrad's MERGE_TAPS=1 loop (a strategy of ConvWgradMatch): lanes `rm` -> tap of the group `ml` and
    channel `lc`; per step the DY tile [pixels, filters], the image tile [lanes, pixels] at each lane's
    tap, one dot into `acc`; partials at each lane's own (tap, channel), always."""

    writes_partials = True
    m: WgradMatch  # type: ignore[assignment]

    @cached_property
    def applies(self) -> bool:
        """Whether MERGE_TAPS configs are offered: a float wgrad, not depthwise, of fewer than MERGE_BELOW
        channels per group, more than one filter tap, no prologue on the image."""
        gp = self.m.gp
        x, dy = gp.operand("image"), gp.operand("loss")
        ntaps = math.prod(gp.space.dims[2:])
        depthwise = not gp.space.batch  # (its rows are the taps: conv_wgrad's stencil loop)
        prologue = gp.prologue.get(gp.main.input("image"))  # type: ignore[arg-type]
        return (
            not depthwise
            and gp.space.m < MERGE_BELOW
            and ntaps > 1
            and not prologue
            and not x.data_type.is_integer
            and not dy.data_type.is_integer
        )

    def tap_counts(self) -> list[int]:
        """TAPS of the merged candidates: a filter row (the last axis' taps) and every tap, where the lanes fit."""
        sp = self.m.gp.space
        counts = sorted({sp.dims[-1], math.prod(sp.dims[2:])} - {1})
        return [t for t in counts if t * sp.m <= MAX_LANES]

    def candidates(self, extra: Mapping[str, Any]) -> list[TileKnobs]:
        """Merged configs: one row tile of pow2(TAPS x C) lanes, columns as wide as the filters need,
        SPLIT_K for ~2 programs per SM (the template's rule); on the CPU, small tiles for the interpreter."""
        m = self.m
        sp, elem = m.gp.space, m.elem
        out = []
        for taps in self.tap_counts():
            bm = pow2_at_least(taps * sp.m, 16)
            if not m.device.is_cuda:  # the interpreter: small tiles, a split whenever the loop is long
                iters = -(-m.pixels // 16)
                out.append(
                    TileKnobs(
                        BLOCK_M=bm,
                        BLOCK_N=min(32, pow2_at_least(sp.n, 16)),
                        BLOCK_K=16,
                        GROUP_M=1,
                        MERGE_TAPS=1,
                        TAPS=taps,
                        SPLIT_K=min(4, max(1, iters // 2)),
                        num_warps=4,
                        **extra,
                    )
                )
                continue
            bk = {1: 128, 2: 64}.get(elem, 32) if bm <= 64 else {1: 32}.get(elem, 16)  # 256 lanes: 32 spilled
            for bn in (32, 64, 128):
                if bn > max(32, pow2_at_least(sp.n, 32)) or bn == 32 and sp.n > 32:
                    continue
                warps = 8 if bm * bn >= 8192 else 4
                out.append(
                    TileKnobs(
                        BLOCK_M=bm,
                        BLOCK_N=bn,
                        BLOCK_K=bk,
                        GROUP_M=1,
                        MERGE_TAPS=1,
                        TAPS=taps,
                        SPLIT_K=m.split_for(bm, bn, taps, bk),
                        num_warps=warps,
                        num_stages=3,
                        **extra,
                    )
                )
        return out

    def check_knobs(self, k: TileKnobs) -> None:
        """Typed errors for a merged config that cannot run this piece."""
        super().check_knobs(k)
        gp = self.m.gp
        span = self.m.per_program(k) * gp.space.m
        why = None
        if not self.applies:
            why = (
                f"{MERGE}=1 needs a wgrad that is not depthwise, of float operands, fewer than {MERGE_BELOW} "
                "channels per group, more than one filter tap and no prologue on the image"
            )
        elif k.BLOCK_M < span:
            why = f"{MERGE}=1 with TAPS={k.taps} needs BLOCK_M >= TAPS x channels per group = {span}"
        if why:
            raise AttributeValueError(
                why,
                op=gp.main.label(),
                rule="triton.conv_wgrad.merge_taps",
                hint=f"drop {MERGE} from this config, or raise BLOCK_M",
            )

    def iterations(self, k: TileKnobs) -> int:
        return self.m.iterations(k)

    def lines(self, ctx: Context, sig: Signature, k: TileKnobs, lo: str, hi: str) -> MainLoop:
        m, gp = self.m, ctx.gp
        assert ctx.dot is not None and k.BLOCK_K is not None
        op = gp.main.op
        assert isinstance(op, ConvWgrad)
        geo = m.geometry
        x, dy = gp.operand("image"), gp.operand("loss")
        sp = gp.space
        nsp = len(x.dim) - 2
        taps = getattr(ctx.tiling, "per_program", 1)
        cg, span = sp.m, taps * sp.m
        flip = op.convolution_mode is ConvolutionMode.CONVOLUTION
        ptr = ctx.ptr_of(sig)
        lines = [
            f"lw = rm % {span}" if k.BLOCK_M > span else "lw = rm",
            f"ml = lw // {cg}",
            f"lc = lw % {cg}",
            _tap_of_lane(taps, sp.nbatch),
        ]
        lines += decompose("mb", [(a, sp.dims[a]) for a in sp.batch], "mt")
        lines.append(f"xc = g * {cg} + lc" if sp.groups > 1 else "xc = lc")
        lines.append(f"acc = tl.zeros((BLOCK_M, BLOCK_N), {ctx.dot.acc})")
        body, jmask = m.dy_step(ctx, sig, k.BLOCK_K)
        # image positions: o * stride + tap * dilation - pre, the lane part before the loop
        tmask: list[str] = []  # (lanes past the span: rows of the dot that are never stored)
        x_axes: list[tuple[str, str]] = [("c", "jp0"), ("r", "xc")]
        cmask = [jmask] if jmask else []
        for a in range(nsp):
            r, s, d, p0 = sp.dims[2 + a], geo.stride[a], geo.dilation[a], geo.pre[a]
            o = f"jp{2 + a}" if s == 1 else f"jp{2 + a} * {s}"
            width = x.dim[2 + a]
            reach = (dy.dim[2 + a] - 1) * s + (r - 1) * d - p0 > width - 1
            if r == 1:  # one tap on this axis: the position depends on the pixel only
                body.append(f"xi_{a} = {o}" + (f" - {p0}" if p0 else ""))
                cmask += ([f"(xi_{a} >= 0)"] if p0 > 0 else []) + ([f"(xi_{a} < {width})"] if reach else [])
                x_axes.append(("c", f"xi_{a}"))
                continue
            tap = f"({r - 1} - mt{2 + a})" if flip else f"mt{2 + a}"
            lines.append(f"xo_{a} = {tap}" + (f" * {d}" if d != 1 else "") + (f" - {p0}" if p0 else ""))
            body.append(f"xs_{a} = ({o})[None, :] + xo_{a}[:, None]")
            inside = ([f"(xs_{a} >= 0)"] if p0 > 0 else []) + ([f"(xs_{a} < {width})"] if reach else [])
            if inside:
                bias = width * -(-p0 // width)  # a multiple of the width that makes the position >= 0
                body.append(f"xw_{a} = (xs_{a} + {bias}) % {width}" if bias else f"xw_{a} = xs_{a} % {width}")
                tmask += inside
            x_axes.append(("t", f"xw_{a}" if inside else f"xs_{a}"))
        if cmask:
            body.append(f"pm = {' & '.join(cmask)}")
        if tmask:
            body.append(f"tm = {' & '.join(tmask)}")
        a_idx = TileIndexer(
            x_axes,
            None,
            "pm" if cmask else None,
            ptr,
            ("BLOCK_M", "BLOCK_K"),
            zero=("rm", "j"),
            tmask="tm" if tmask else None,
        )
        body += operand_tile(ctx, sig, "image", a_idx, "a")
        body.append(f"acc = {ctx.dot.call('a', 'b', 'acc')}")
        lines.append(f"for it in range({lo}, {hi}):")
        return MainLoop(lines + ["    " + line for line in body])

    def store_partials(self, ctx: Context, sig: Signature, k: TileKnobs, loop: MainLoop, offset: int) -> list[str]:
        """The main kernel's end: each lane's row of `acc` into the partials at its own (tap, channel), the
        layout the combine launch reads ([split][tap * groups + group][channel][filter])."""
        t = ctx.tiling
        sp = t.space
        dtype = "int32" if ctx.dot is not None and ctx.dot.is_int else "float32"
        ws = sig.scratch("ws_acc", offset, dtype)
        span = getattr(t, "per_program", 1) * sp.m
        pb = f"mb * {sp.groups} + g" if sp.groups > 1 else "mb"
        row = f"(ks * {sp.nbatch * sp.groups} + {pb}) * {sp.m} + lc" if t.split > 1 else f"({pb}) * {sp.m} + lc"
        masks = [f"(rm < {span})[:, None]"] if k.BLOCK_M > span else []
        masks += [f"{t.cmask}[None, :]"] if t.cmask else []
        mask = f", mask={' & '.join(masks)}" if masks else ""
        return [f"tl.store({ws} + ({row})[:, None] * {sp.n} + rn[None, :], acc{mask})"]


def _tap_of_lane(taps: int, nbatch: int) -> str:
    """The output space's tap (batch index) of each lane: the program's tap group `tg` (TapTiling's
    header), or the tap `bb` itself when a program has one tap."""
    if taps == 1:
        return "mb = bb + ml"
    return f"mb = tg * {taps} + ml" if nbatch > taps else "mb = ml"
