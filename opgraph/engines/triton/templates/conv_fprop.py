"""conv_fprop as an implicit GEMM, with the shared prologue / epilogue / reductions of gemm.py.

GEMM view: M = N * prod(output spatial) output pixels (the tile's rows), N = K / groups output
channels of one group (the columns; the group is fixed per program), and the reduction runs over
(filter taps x C / groups) in one flat loop of taps * cdiv(C/groups, BLOCK_K) steps, so that the
compiler pipelines it whatever the filter size (`num_stages`). Each step gathers an A tile
[BLOCK_M pixels, BLOCK_K channels] of the image at one filter tap (zero outside the image: any
pre/post padding, stride, dilation; 1-D, 2-D and 3-D alike) and a B tile [BLOCK_K, BLOCK_N] of the
filter (flipped in CONVOLUTION mode). Layouts come from the strides: NHWC makes the A loads
contiguous along channels, KRSC the B loads.

A prologue on the image (scale + bias + relu of a preceding batchnorm) runs on the gathered tile,
and the padded positions are zeroed after it.

MERGE_TAPS=1 (few channels per group: a stem's 3): the K lanes run over the filter's last spatial
axis and the channels together, so that a step covers a whole filter row: the 7x7 stem's 49 taps x 3
channels padded to 16 lanes (784 lanes an output row, 147 used) become 7 rows x 21 channels padded
to 32 (224). The image column then depends on the row and the lane (a [BLOCK_M, BLOCK_K] index,
`TileIndexer`'s "t" axis). The lane order follows the image's layout: (s, c) with c fastest for NHWC
(the 21 elements a lane row reads are contiguous), (c, s) with s fastest for NCHW (S contiguous
columns per channel; a ViT's 16x16 patches at stride 16 read whole image rows).
"""

from __future__ import annotations

import math
from functools import cached_property
from typing import Any

from ....core.config import Support
from ....core.dtypes import DataType
from ....core.errors import AttributeValueError
from ....core.ir import Node
from ....core.piece import Piece
from ....ops.conv import ConvFprop, ConvolutionMode
from ...cost import rates
from ...shared.conv_shapes import FEW_CHANNELS, NARROW_GROUP
from ..gemm import (
    Context,
    MainLoop,
    OutputSpace,
    Signature,
    TileIndexer,
    TileLoop,
    TileTemplate,
    decompose,
    estimate_us,
    finish_candidates,
    fp32_knobs,
    gemm_candidates,
    input_taps,
    operand_bytes,
    operand_tile,
    prologue_share,
)
from ..knobs import TileKnobs
from ._conv_fit import HOPPER, ImplicitGemmFit
from ._prologue_pass import OffersProloguePass
from .base import pow2_at_least, unique
from .preferences import MERGED_STEM, SBR_CONV_LEAN

LEAN_PROLOGUE = 32  # SBR -> conv: image elements a thread transforms a step, at most (SBR_CONV_LEAN)
# a filter prologue or NCHW lanes: accumulator and filter-tile floats a thread holds, at most, for the first
# MERGE_TAPS configs
MERGED_FLOATS = 128
MERGE_BELOW = FEW_CHANNELS  # channels per group under which MERGE_TAPS configs are candidates
MERGE = "MERGE_TAPS"


class ConvFpropTemplate(TileTemplate):
    name = "conv_fprop"
    priority = 50
    main_kinds = ("conv_fprop",)
    main_label = "conv_fprop"
    dot_roles = ("image", "weight")

    def space(self, main: Node, piece: Piece) -> OutputSpace:
        y = piece.tensor(main.output_uids()[0])
        x = piece.tensor(main.input("image"))  # type: ignore[arg-type]
        w = piece.tensor(main.input("weight"))  # type: ignore[arg-type]
        return OutputSpace(y.dim, rows=(0, *range(2, len(y.dim))), col=1, groups=x.dim[1] // w.dim[1])


class ConvFpropMatch(OffersProloguePass):
    """A conv_fprop piece: its plain main loop is one filter tap and BLOCK_K channels a step; MERGE_TAPS=1
    configs run `MergedTaps`."""

    template: ConvFpropTemplate

    @cached_property
    def shape(self) -> tuple[int, int, int]:
        """(channels per group, filter taps, groups)."""
        w, x = self.gp.operand("weight"), self.gp.operand("image")
        return w.dim[1], math.prod(w.dim[2:]), x.dim[1] // w.dim[1]

    @cached_property
    def elem(self) -> int:
        """Bytes an operand element of the product."""
        return operand_bytes(self.gp.operand("image").data_type, self.gp.operand("weight").data_type)

    @cached_property
    def merged_loop(self) -> MergedTaps:
        return MergedTaps(self)

    def check(self) -> Support:
        cg, _, groups = self.shape
        types = {self.gp.operand(r).data_type for r in self.template.dot_roles}
        if self.device.is_cuda and groups > 1 and 1 < cg < NARROW_GROUP and DataType.BFLOAT16 in types:
            # an open bug, held by tests/engines/test_triton_conv.py::test_gpu_grouped_conv_bf16_kernel_bug
            return Support.no(
                f"bf16 grouped conv with {cg} channels per group: the generated kernel's output was wrong on an "
                "H200 (3x3, 32 groups of 8 channels, 28x28, N=32: non-finite values; fp16, and N=8, right), an open "
                "bug, so another engine (cuDNN, PyTorch) runs it; the generated kernel also took 3.8x cuDNN's time "
                "on such narrow groups",
                self.gp.main,
            )
        return super().check()

    def loop(self, k: TileKnobs) -> TileLoop:
        return self.merged_loop if k.merged else self

    def step_k(self, k: TileKnobs) -> int:
        """The K a main-loop tap covers: C / groups, or with MERGE_TAPS a filter row's S x C / groups."""
        cg = self.shape[0]
        return cg * self.gp.operand("weight").dim[-1] if k.merged else cg

    def iterations(self, k: TileKnobs) -> int:
        """Filter taps x channel blocks; with MERGE_TAPS the other axes' taps x blocks of (s, c) lanes."""
        cg, taps, _ = self.shape
        step = self.step_k(k)
        assert k.BLOCK_K is not None
        return taps * cg // step * -(-step // k.BLOCK_K)

    def _merged(self, configs: list[TileKnobs]) -> list[TileKnobs]:
        """MERGE_TAPS variants of the first configs of three distinct tiles, where the channels per group
        are few and the filter's last spatial axis has more than one tap (BLOCK_K: the row's S * C lanes,
        at least 32 for 8-bit operands, at most 64; SPLIT_K at most a third of the merged trip count),
        placed as MERGED_STEM says: on the GPU first for 16-bit operands (measured), best estimate first;
        after the first three for other types (not measured); on the CPU before the broadest config."""
        cg, _, _ = self.shape
        last = self.gp.operand("weight").dim[-1]
        if cg >= MERGE_BELOW or last == 1:
            return configs
        least = 32 if self.elem == 1 else 16
        merged: list[TileKnobs] = []
        for c in configs[:-1]:
            if len(merged) == 3:
                break
            if any((m.BLOCK_M, m.BLOCK_N, m.num_warps) == (c.BLOCK_M, c.BLOCK_N, c.num_warps) for m in merged):
                continue  # distinct tiles: the merged loop's registers differ by tile, not by stages
            knobs = c.replace(MERGE_TAPS=1, BLOCK_K=min(64, pow2_at_least(last * cg, least)))
            knobs = knobs.replace(SPLIT_K=max(1, min(c.split_k, self.merged_loop.iterations(knobs) // 3)))
            merged.append(knobs)
        if self.device.is_cuda and self.elem == 2:
            # a prologue on the filter (a float32 weight cast to bf16) holds the B tile in registers beside
            # the accumulator, and NCHW's (c, s) lanes index more per element: ViT-B/16's patch embedding
            # spilled at 128 x 256 (Triton 3.6 and 3.9) and 256 x 128 (3.9), not at 128 x 128, as fast on the
            # GPU (bench/results/constants.md#patch-convolutions): tiles over MERGED_FLOATS go last
            tight = self.merged_loop.columns_fastest or bool(self.gp.prologue.get(self.gp.main.input("weight")))  # type: ignore[arg-type]

            def rank(c: TileKnobs) -> tuple[bool, float]:
                assert c.BLOCK_K is not None
                floats = (c.BLOCK_M + c.BLOCK_K) * c.BLOCK_N / (32 * c.warps)
                return tight and floats > MERGED_FLOATS, self.estimate(c) or math.inf

            return MERGED_STEM.apply(configs, sorted(merged, key=rank), 0)
        return MERGED_STEM.apply(configs, merged, 3 if self.device.is_cuda else -1)

    def candidates(self) -> list[TileKnobs]:
        gp, device, elem = self.gp, self.device, self.elem
        cg, taps, groups = self.shape
        x, w = gp.operand("image"), gp.operand("weight")
        extra = fp32_knobs(x.data_type, w.data_type)
        configs = gemm_candidates(
            gp.space.m,
            gp.space.n,
            cg * taps,
            nprog=groups,
            device=device,
            elem_bytes=elem,
            k_step=cg,
            moved_bytes=gp.moved_bytes(),
            extra=extra,
        )
        if device.is_cuda and elem == 2:
            configs = self._ranked(configs)
        if device.is_cuda and gp.prologue.get(gp.main.input("image")):  # type: ignore[arg-type]
            # the prologue runs on the image tile in registers: at most LEAN_PROLOGUE of its elements a
            # thread a step, 3 stages at most (else the first unsplit config of <= 128 rows)
            configs = SBR_CONV_LEAN.apply(
                configs,
                lambda c: c.SPLIT_K == 1 and (c.num_stages or 0) <= 3 and prologue_share(c) <= LEAN_PROLOGUE,
                lambda c: c.BLOCK_M <= 128 and c.SPLIT_K == 1,
            )
        configs = self._merged(configs)
        return self.offer_prologue_pass(finish_candidates(configs, gp, device, extra), taps)

    def _ranked(self, base: list[TileKnobs]) -> list[TileKnobs]:
        """16-bit operands on Hopper: gemm_candidates' configs plus larger tiles with the K loop split
        over enough programs to fill the SMs, ranked by `conv_cost` (which knows that these implicit
        GEMMs are bound by moving operand tiles from L2, see there). The first of gemm_candidates'
        ranking stays among the alternatives; the plain fallback stays last."""
        cg, taps, groups = self.shape
        n = self.gp.space.n
        iters = taps * -(-cg // 64)
        pool = list(base[:-1])
        widest = max(32, pow2_at_least(n, 32))
        for bm, bn in ((128, 256), (256, 128), (128, 128), (256, 64), (128, 64), (64, 128), (64, 64)):
            if bn > widest:
                continue
            for split in (1, 2, 3, 4, 5, 6, 8):
                if split > 1 and iters // split < 6:
                    break
                for stages in (3, 4):
                    if stages * (bm + bn) * 64 * 2 > 200_000:
                        continue
                    pool.append(
                        TileKnobs(
                            BLOCK_M=bm,
                            BLOCK_N=bn,
                            BLOCK_K=min(64, pow2_at_least(cg, 16)),
                            GROUP_M=8,
                            SPLIT_K=split,
                            num_warps=8 if bm * bn >= 16384 else 4,
                            num_stages=stages,
                            fp32_precision=base[0].fp32_precision,
                        )
                    )
        ranked = sorted(unique(pool), key=lambda c: conv_cost(self, c))
        out = ranked[:6]
        out += [c for c in base[:3] if c not in out]  # the generic ranking's first picks, as alternatives
        return out + base[-1:]

    def cost(self, k: TileKnobs) -> float | None:
        if not self.device.is_cuda:
            return None
        if self.elem == 2:
            return conv_cost(self, k)
        cg, taps, groups = self.shape
        return estimate_us(
            self.gp.space.m,
            self.gp.space.n,
            cg * taps,
            k,
            nprog=groups,
            device=self.device,
            elem_bytes=self.elem,
            k_step=self.step_k(k),
            moved_bytes=self.gp.moved_bytes(),
        )

    def lines(self, ctx: Context, sig: Signature, k: TileKnobs, lo: str, hi: str) -> MainLoop:
        return _conv_loop(ctx, sig, k, lo, hi, self._tap_tiles)

    def _tap_tiles(
        self, ctx: Context, geo: Any, flip: bool, ptr: Any, bk: int
    ) -> tuple[list[str], TileIndexer, TileIndexer]:
        """One filter tap and BLOCK_K channels a step: the step's lines and the two operands' indexers."""
        gp = ctx.gp
        x, w = gp.operand("image"), gp.operand("weight")
        nsp = len(x.dim) - 2
        taps = w.dim[2:]
        ydims = gp.space.dims
        cg, _, groups = self.shape
        body, amask = _step(ctx, geo, flip, taps, -(-cg // bk), "kc")
        kmask, kc = None, "kc"
        if cg % bk:  # channels past the group's end: wrapped in the loads, zeroed by selects
            body += [f"kmask = kc < {cg}", f"kcc = kc % {cg}"]
            kmask, kc = "kmask", "kcc"
        body.append(f"xc = g * {cg} + {kc}" if groups > 1 else f"xc = {kc}")
        x_axes = [("r", "y0"), ("c", "xc"), *(("r", f"xi{i}") for i in range(nsp))]
        flat = None
        if (
            all(r == 1 for r in taps)
            and all(s == 1 for s in geo.stride)
            and not any(geo.pre)
            and tuple(x.dim[2:]) == tuple(ydims[2:])
        ):
            flat = ("rm", tuple((a, ydims[a]) for a in gp.space.rows))  # a 1x1 conv reads pixel rows as they are
        a_idx = TileIndexer(x_axes, amask, kmask, ptr, ("BLOCK_M", "BLOCK_K"), flat, zero=("rm", "kc"), select=kmask)
        w_axes = [("c", "col"), ("r", kc), *(("s", f"wt{i}") for i in range(nsp))]
        b_idx = TileIndexer(
            w_axes, kmask, ctx.tiling.cmask, ptr, ("BLOCK_K", "BLOCK_N"), zero=("kc", "rn"), select=kmask
        )
        return body, a_idx, b_idx


class MergedTaps(TileLoop):
    """MERGE_TAPS=1: the other filter axes' taps one a step, the lanes over (s, c) of the last axis
    (ls, lc); the image column xs = o + ls * dilation is a [BLOCK_M, BLOCK_K] index. Lanes past
    S * C and columns outside the image are wrapped into it for the loads and zeroed by selects
    (`TileIndexer`'s tmask), as the channel tail is in the plain loop."""

    m: ConvFpropMatch

    def check_knobs(self, k: TileKnobs) -> None:
        super().check_knobs(k)
        w = self.m.gp.operand("weight")
        if w.dim[-1] == 1:
            raise AttributeValueError(
                f"{MERGE}=1 needs a filter whose last spatial axis has more than one tap (filter {list(w.dim)})",
                op=self.m.gp.main.label(),
                rule="triton.conv.merge_taps",
                hint=f"drop {MERGE} from this config",
            )

    def iterations(self, k: TileKnobs) -> int:
        return ConvFpropMatch.iterations(self.m, k)

    @cached_property
    def columns_fastest(self) -> bool:
        """Whether the lanes run (c, s) with s fastest: an image whose columns are contiguous and channels
        not (NCHW), where a lane row then reads S consecutive elements, and with the stride equal to S
        (a ViT's patch embedding) consecutive pixels' rows adjoin; else (s, c), c fastest (NHWC)."""
        x = self.m.gp.operand("image")
        return x.stride[-1] == 1 and x.stride[1] != 1

    def lines(self, ctx: Context, sig: Signature, k: TileKnobs, lo: str, hi: str) -> MainLoop:
        return _conv_loop(ctx, sig, k, lo, hi, self._tiles)

    def _tiles(
        self, ctx: Context, geo: Any, flip: bool, ptr: Any, bk: int
    ) -> tuple[list[str], TileIndexer, TileIndexer]:
        gp = ctx.gp
        x, w = gp.operand("image"), gp.operand("weight")
        cg, _, groups = self.m.shape
        last = len(x.dim) - 3
        taps, ydims = w.dim[2:], gp.space.dims
        span = taps[last] * cg
        body, amask = _step(ctx, geo, flip, taps[:last], -(-span // bk), "lane")
        kmask, lw = None, "lane"
        if span % bk:
            body += [f"kmask = lane < {span}", f"lw = lane % {span}"]
            kmask, lw = "kmask", "lw"
        if self.columns_fastest:
            body += [f"ls = {lw} % {taps[last]}", f"lc = {lw} // {taps[last]}"]
        else:
            body += [f"ls = {lw} // {cg}", f"lc = {lw} % {cg}"]
        d, width = geo.dilation[last], x.dim[-1]
        body.append(f"xs = o{last}[:, None] + " + (f"(ls * {d})[None, :]" if d != 1 else "ls[None, :]"))
        inside = ["(xs >= 0)"] if geo.pre[last] > 0 else []
        if (ydims[-1] - 1) * geo.stride[last] - geo.pre[last] + (taps[last] - 1) * d > width - 1:
            inside.append(f"(xs < {width})")
        xw = "xs"
        if inside:
            bias = width * -(-geo.pre[last] // width)  # a multiple of the width that makes xs >= 0
            body.append(f"xw = (xs + {bias}) % {width}" if bias else f"xw = xs % {width}")
            xw = "xw"
        smask = None
        if kmask or inside:
            body.append(f"smask = {' & '.join(([f'{kmask}[None, :]'] if kmask else []) + inside)}")
            smask = "smask"
        body.append(f"xc = g * {cg} + lc" if groups > 1 else "xc = lc")
        x_axes = [("r", "y0"), ("c", "xc"), *(("r", f"xi{i}") for i in range(last)), ("t", xw)]
        a_idx = TileIndexer(x_axes, amask, None, ptr, ("BLOCK_M", "BLOCK_K"), zero=("rm", "lane"), tmask=smask)
        body.append(f"wsl = {taps[last] - 1} - ls" if flip else "wsl = ls")
        w_axes = [("c", "col"), ("r", "lc"), *(("s", f"wt{i}") for i in range(last)), ("r", "wsl")]
        b_idx = TileIndexer(
            w_axes, kmask, ctx.tiling.cmask, ptr, ("BLOCK_K", "BLOCK_N"), zero=("lane", "rn"), select=kmask
        )
        return body, a_idx, b_idx


def _conv_loop(ctx: Context, sig: Signature, k: TileKnobs, lo: str, hi: str, tiles: Any) -> MainLoop:
    """The implicit GEMM's main loop: the output pixels' input origins o{i}, then per step the operand
    tiles `tiles` gives (the step's lines and the image / filter indexers) and one dot."""
    gp = ctx.gp
    op = gp.main.op
    assert isinstance(op, ConvFprop) and ctx.dot is not None and k.BLOCK_K is not None
    nsp = len(gp.operand("image").dim) - 2
    geo = op.geometry(nsp)
    lines = []
    for i in range(nsp):
        s, p0 = geo.stride[i], geo.pre[i]
        expr = f"y{2 + i}" if s == 1 else f"y{2 + i} * {s}"
        lines.append(f"o{i} = {expr} - {p0}" if p0 else f"o{i} = {expr}")
    lines.append(f"acc = tl.zeros((BLOCK_M, BLOCK_N), {ctx.dot.acc})")
    flip = op.convolution_mode is ConvolutionMode.CONVOLUTION
    body, a_idx, b_idx = tiles(ctx, geo, flip, ctx.ptr_of(sig), k.BLOCK_K)
    body += operand_tile(ctx, sig, "image", a_idx, "a")
    body += operand_tile(ctx, sig, "weight", b_idx, "b")
    body.append(f"acc = {ctx.dot.call('a', 'b', 'acc')}")
    lines.append(f"for it in range({lo}, {hi}):")
    lines += ["    " + line for line in body]
    return MainLoop(lines)


def _step(ctx: Context, geo: Any, flip: bool, taps: Any, blocks: int, lane: str) -> tuple[list[str], str | None]:
    """A main-loop step's lines: its filter tap over `taps` (t{i}) and its K lanes `lane` (`blocks` blocks of
    BLOCK_K a tap), the taps' input coordinates (xi{i}) and filter taps (wt{i}), and the rows' bounds as
    `amask` (returned; None where every row is in bounds)."""
    body = (
        [f"tap = it // {blocks}", f"{lane} = (it % {blocks}) * BLOCK_K + tl.arange(0, BLOCK_K)"]
        if blocks > 1
        else ["tap = it", f"{lane} = tl.arange(0, BLOCK_K)"]
    )
    body += decompose("tap", [(i, r) for i, r in enumerate(taps) if r > 1], "t") if math.prod(taps) > 1 else []
    checks = [ctx.tiling.rmask] if ctx.tiling.rmask else []
    body += input_taps(geo, taps, ctx.gp.space.dims, ctx.gp.operand("image").dim, flip, checks)
    if not checks:
        return body, None
    return body + [f"amask = {' & '.join(checks)}"], "amask"


def conv_cost(match: ConvFpropMatch, knobs: TileKnobs, fit: ImplicitGemmFit = HOPPER) -> float:
    """Estimated microseconds of a 16-bit implicit-GEMM config on a Hopper GPU, with `fit`'s constants
    (_conv_fit.py; the measurements: bench/results/constants.md#conv-cost-fit).

    A program's K step takes the longest of: its latency (hidden in proportion to the prefetch
    distance) plus its tile's math at the step rate; the SM's multiplies, for all the programs it
    holds; its loads from L2, an image row weighing more than a filter row unless a 1x1 conv reads
    the pixel rows as they are; and, for channels that are no multiple of the vector width (the
    stem's 3), scalar loads. An SM holds as many programs as its shared memory (one stage when K
    takes one step: nothing to pipeline) and registers (the fp32 accumulator and a few a thread)
    allow. The epilogue moves the tile's output and full-size inputs (a residual). The SMs' rounds,
    the L2 reads (the image tile re-read once per column of tiles, the filter once per row) and DRAM
    (each tensor once, a strided 1x1 reading only the pixels it samples) overlap imperfectly: a
    p-norm, so that configs near the DRAM floor still differ by their rounds. A full-size epilogue
    input waits on DRAM after the main loop, hidden only by the other programs on the SM. Split-K
    fills the SMs when the tiles are few (a 7x7 or 14x14 image with 256-512 channels) at the cost of
    writing and re-reading fp32 partials and a second launch."""
    gp, device = match.gp, match.device
    cg, taps, groups = match.shape
    m, n = gp.space.m, gp.space.n
    k = cg * taps
    assert knobs.BLOCK_K is not None
    bm, bn, bk = knobs.BLOCK_M, knobs.BLOCK_N, knobs.BLOCK_K
    split, stages = knobs.split_k, knobs.num_stages or 3
    warps = knobs.warps
    sms = max(device.sm_count, 1)
    per = -(-match.steps(knobs) // split)
    programs = -(-m // bm) * -(-n // bn) * groups * split
    smem = (stages if per > 1 else 1) * (bm + bn) * bk * 2
    regs = bm * bn // (32 * warps) + fit.regs_per_thread
    resident = max(1, min(fit.smem_per_sm // (smem + fit.smem_per_program), fit.regs_per_sm // (32 * warps * regs)))
    busiest = -(-programs // sms)  # programs on the busiest SM
    rounds, together = -(-busiest // resident), min(busiest, resident)
    x = gp.operand("image")
    rows = (1.0 if taps == 1 and tuple(x.dim[2:]) == tuple(gp.space.dims[2:]) else fit.image_row_weight) * bm + bn
    mflop = 2 * bm * bn * bk / 1e6
    lag = fit.step_latency_us * fit.latency_stages / max(1, stages - 1)  # prefetch distance stages - 1
    t_it = max(
        lag + fit.step_us_per_mflop * mflop,
        together * mflop / fit.sm_mflop_per_us,
        together * rows * bk * 2 / fit.sm_l2_bytes_per_us,
    )
    if cg % fit.vector_channels:
        t_it = max(t_it, together * (bm + bn) * bk / fit.sm_scalar_elems_per_us)
    piece = gp.piece
    size = m * n * groups
    extra = (
        sum(
            piece.tensor(u).nbytes
            for u in {u for nd in gp.epilogue for u in nd.input_uids()}
            if u in piece.inputs and piece.tensor(u).numel * 2 > size
        )
        / size
    )  # bytes per output element
    stored = sum(piece.tensor(u).nbytes for u in gp.stores) / size
    t_prog = (
        per * t_it
        + min(stages - 1, per) * t_it / 2
        + bm * bn * (stored + extra) / fit.epilogue_bytes_per_us
        + fit.program_us
    )
    traffic = groups * ((m * k * 2) * -(-n // bn) + (n * k * 2) * -(-m // bm))
    moved = gp.moved_bytes() - x.nbytes + min(x.nbytes, m * k * groups * 2)
    limits = (rounds * t_prog, traffic / fit.l2_bytes_per_us, moved / (fit.dram_share * rates(device)[0] / 1e6))
    t = sum(v**fit.overlap_norm for v in limits) ** (1 / fit.overlap_norm) + busiest * bm * bn * extra / (
        together * fit.sm_epilogue_dram_bytes_per_us
    )
    if split > 1:
        t += split * m * n * groups * 4 * 2 / fit.split_bytes_per_us + fit.split_launch_us
    return t + fit.base_us


ConvFpropTemplate.match_class = ConvFpropMatch
TEMPLATE = ConvFpropTemplate()
