"""Depthwise (and any one-channel-per-group) conv_fprop as a memory-bound stencil, not a
degenerate GEMM.

Output channel k reads input channel k // (K / C) only, so there is no reduction over channels and
no tl.dot: each program owns a tile of BLOCK_M output pixels x BLOCK_N channels and, for every filter
tap (unrolled), loads the shifted image tile (zero outside the image, after the prologue), multiplies
it by the tap's [BLOCK_N] weights and accumulates in fp32 (int32 for int8). With NHWC the channel
axis is contiguous, so each row of a tile is one vector load; the taps re-read neighbouring pixels,
which the L1/L2 caches serve, so DRAM sees the image about once: the kernel is bound by reading the
image and writing the output. The shared epilogue (bias, activations, stores, genstats) follows.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from ....device import Device
from ....dtypes import DataType
from ....ir import Node
from ....ops.conv import ConvFprop, ConvolutionMode
from ....partition import Piece
from ...base import Support
from .base import pow2_at_least
from .gemm import (
    Context, DotKind, GemmPiece, OutputSpace, Signature, TileIndexer, TileTemplate, decompose, operand_tile,
)

UNROLL_TAPS = 32  # filters with more taps loop instead of unrolling


class DepthwiseTemplate(TileTemplate):
    name = "depthwise"
    priority = 55
    main_kinds = ("conv_fprop",)
    main_label = "conv_fprop"
    splits_k = False

    def space(self, main: Node, piece: Piece) -> OutputSpace:
        y = piece.tensor(main.output_uids()[0])
        return OutputSpace(y.dim, rows=(0, *range(2, len(y.dim))), col=1)

    def check(self, gp: GemmPiece, device: Device) -> Support:
        x, w = gp.operand("image"), gp.operand("weight")
        if w.dim[1] != 1:
            return Support.no(f"not a depthwise conv: the filter has {w.dim[1]} channels per group (needs 1)",
                              gp.main)
        if x.data_type.is_integer or w.data_type.is_integer:
            if x.data_type is not DataType.INT8 or w.data_type is not DataType.INT8:
                return Support.no("integer depthwise convs need INT8 image and filter", gp.main)
        if DataType.DOUBLE in (x.data_type, w.data_type):
            return Support.no("DOUBLE depthwise convs are not supported by the Triton templates", gp.main)
        return Support.yes()

    def dot(self, gp: GemmPiece, knobs: Mapping[str, Any], device: Device) -> DotKind:
        if gp.operand("image").data_type.is_integer:
            return DotKind("tl.int32", "tl.int32")
        return DotKind("tl.float32", "tl.float32")

    def candidates(self, piece: Piece, device: Device) -> list[dict[str, Any]]:
        gp, verdict = self.analyze(piece)
        assert gp is not None, verdict.reason
        k = gp.space.dims[1]
        if not device.is_cuda:
            bm = min(32, pow2_at_least(gp.space.m, 16))
            bn = min(32, pow2_at_least(k, 16))
            return [{"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": 4},
                    {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4}]
        # >= 8 elements per thread and >= 128 B contiguous per row keep the loads wide.
        bn = min(128, max(16, pow2_at_least(k, 16)))
        ranked = [(64, min(bn, 64), 4), (32, bn, 4), (128, min(bn, 64), 8), (64, bn, 8), (16, bn, 4)]
        out, seen = [], set()
        for bm, width, warps in ranked:
            if (bm, width) not in seen:
                seen.add((bm, width))
                out.append({"BLOCK_M": bm, "BLOCK_N": width, "num_warps": warps})
        return out

    def estimate(self, piece: Piece, knobs: Mapping[str, Any], device: Device) -> float | None:
        """Bound by the bytes moved (the image once, the output, the filter): ~80% of an H100's copy
        bandwidth when the taps' re-reads hit the caches, plus a launch."""
        gp, _ = self.analyze(piece)
        if gp is None or not device.is_cuda:
            return None
        return gp.moved_bytes() / (0.8 * 3.0e12) * 1e6 + 3.0

    def mainloop(self, ctx: Context, sig: Signature, knobs: Mapping[str, Any], lo: str, hi: str) -> list[str]:
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
        body = decompose("tap", moving, "t") if ntaps > 1 else []
        checks = [ctx.tiling.rmask] if ctx.tiling.rmask else []
        flip = op.convolution_mode is ConvolutionMode.CONVOLUTION
        for i in range(nsp):
            r, d = taps[i], geo.dilation[i]
            body.append(f"xi{i} = o{i} + t{i} * {d}" if r > 1 and d != 1 else
                        f"xi{i} = o{i} + t{i}" if r > 1 else f"xi{i} = o{i}")
            if geo.pre[i] > 0:
                checks.append(f"(xi{i} >= 0)")
            top = (ydims[2 + i] - 1) * geo.stride[i] - geo.pre[i] + (r - 1) * d
            if top > x.dim[2 + i] - 1:
                checks.append(f"(xi{i} < {x.dim[2 + i]})")
            body.append(f"wt{i} = {r - 1} - t{i}" if flip and r > 1 else f"wt{i} = t{i}" if r > 1 else f"wt{i} = 0")
        amask = None
        if checks:
            body.append(f"amask = {' & '.join(checks)}")
            amask = "amask"
        ptr = ctx.ptr_of(sig)
        x_axes = [("r", "y0"), ("c", "cin"), *(("r", f"xi{i}") for i in range(nsp))]
        a_idx = TileIndexer(x_axes, amask, ctx.tiling.cmask, ptr, ("BLOCK_M", "BLOCK_N"), zero=("rm", "rn"))
        w_axes = [("c", "col"), ("r", "rm"), *(("s", f"wt{i}") for i in range(nsp))]
        b_idx = TileIndexer(w_axes, None, ctx.tiling.cmask, ptr, ("1", "BLOCK_N"), zero=("rm", "rn"))
        body += operand_tile(ctx, sig, "image", a_idx, "a")
        body += operand_tile(ctx, sig, "weight", b_idx, "b")
        body.append("acc += a * b")
        if ntaps <= UNROLL_TAPS:
            lines.append(f"for tap in tl.static_range({ntaps}):")
        else:
            lines.append(f"for tap in range({ntaps}):")
        return lines + ["    " + line for line in body]


TEMPLATE = DepthwiseTemplate()
