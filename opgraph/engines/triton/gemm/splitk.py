"""Split-K: the main loop divided over programs, fp32/int32 partials summed in fixed order by a second kernel."""

from __future__ import annotations

from collections.abc import Callable

from ....core.device import Device
from ....core.symbolic import SymInt
from ..knobs import TileKnobs
from ..sizes import above_one
from .epilogue import Context
from .scratch import Signature
from .tiling import Tiling, static


def split_range(iters: int, split: int) -> tuple[list[str], str, str]:
    """Lines and (lo, hi) bounds of this program's share of `iters` main-loop iterations."""
    if split <= 1:
        return [], "0", str(iters)
    per = -(-iters // split)
    return [f"it_lo = ks * {per}", f"it_hi = tl.minimum(it_lo + {per}, {iters})"], "it_lo", "it_hi"


def _slot_row(t: Tiling, ks: str) -> str:
    """The partial row of the tile's rows `rm` in slice `ks`: slices of the batch programs' M rows, each row
    N wide (a bucket kernel's at its run-time sizes, in scratch laid out for the bucket's largest shape)."""
    sp, text = t.space, t.text
    nprog = sp.nbatch * sp.groups
    if above_one(nprog):
        return f"({ks} * {text(nprog)} + pb) * {text(sp.m)} + rm"
    return f"{ks} * {text(sp.m)} + rm"


def split_store(ctx: Context, sig: Signature, offset: int) -> list[str]:
    """The main kernel's end under split-K: store this slice's accumulator."""
    t = ctx.tiling
    dtype = "int32" if ctx.dot is not None and ctx.dot.is_int else "float32"
    ws = sig.scratch("ws_acc", offset, dtype)
    mask = t.output_indexer(ctx.ptr_of(sig)).mask()
    row = _slot_row(t, "ks")
    return [
        f"tl.store({ws} + ({row})[:, None] * {t.text(t.space.n)} + rn[None, :], acc{f', mask={mask}' if mask else ''})"
    ]


def split_sum(ctx: Context, sig: Signature, offset: int) -> list[str]:
    """The epilogue kernel's start under split-K: the accumulator as the sum of the slices."""
    t = ctx.tiling
    is_int = ctx.dot is not None and ctx.dot.is_int
    dtype = "int32" if is_int else "float32"
    ws = sig.scratch("ws_acc", offset, dtype)
    mask = t.output_indexer(ctx.ptr_of(sig)).mask()
    lines = [f"acc = tl.zeros((BLOCK_M, BLOCK_N), tl.{dtype})"]
    lines.append(f"for kss in tl.static_range({t.split}):")
    row = _slot_row(t, "kss")
    masked = f", mask={mask}, other=0" if mask else ""
    lines.append(f"    acc += tl.load({ws} + ({row})[:, None] * {t.text(t.space.n)} + rn[None, :]{masked})")
    return lines


def epilogue_tiling(
    tiling: Tiling, knobs: TileKnobs, device: Device, count: Callable[[SymInt], int] = static
) -> Tiling:
    """The tiles of the split-K epilogue launch. Each program sums SPLIT_K partial tiles (all
    loads issued at once) and runs the epilogue, so a tile of the main kernel's size would give few
    programs, each with SPLIT_K x (BM x BN / threads) loads in flight (a 128 x 128 tile split 2: 52
    programs for a 1568 x 512 conv). Finer tiles, down to 32 x 32, until there are about two programs
    per SM (knobs EPI_M / EPI_N set them). `count` gives the programs of a tiling as an int (a bucket
    kernel's: at the bucket's smallest shape, where split-K pays)."""
    bm, bn = tiling.block_m, tiling.block_n
    if knobs.EPI_M is not None or knobs.EPI_N is not None:
        bm, bn = knobs.EPI_M or bm, knobs.EPI_N or bn
    else:
        bm, bn = min(bm, 64), min(bn, 128)
        want = 2 * max(device.sm_count, 1)
        while bm * bn > 1024 and count(Tiling(tiling.space, bm, bn).per_split) < want:
            if bm >= bn and bm > 32 or bn <= 32:
                bm //= 2
            else:
                bn //= 2
    return Tiling(tiling.space, bm, bn, 1, tiling.split, tiling.big, text=tiling.text)


def slice_block(split: int, tiling: Tiling, interpret: bool) -> int:
    """Partial slices the combine launch loads at once: about 4096 elements (16 KB) per load, so
    that a few programs keep enough bytes in flight whatever the split."""
    budget = (1024 if interpret else 4096) // (tiling.block_m * tiling.block_n)
    return max(2, min(1 << max(0, split - 1).bit_length(), 1 << max(0, budget.bit_length() - 1)))


def split_sum_blocked(ctx: Context, sig: Signature, offset: int) -> list[str]:
    """The combine launch's start under split-K: `acc` as the sum of the SPLIT_K partial tiles,
    BLOCK_S slices per (pipelined) load and a fixed-order sum over them (deterministic). gemm.py's
    split_sum adds one slice per step, which serialises on the load latency for deep splits."""
    t = ctx.tiling
    sp = t.space
    dtype = "int32" if ctx.dot is not None and ctx.dot.is_int else "float32"
    ws = sig.scratch("ws_acc", offset, dtype)
    nprog = sp.nbatch * sp.groups
    rows = f"pb * {t.text(sp.m)} + rm" if above_one(nprog) else "rm"
    masks = [f"(s < {t.split})[:, None, None]"]
    if t.rmask:
        masks.append(f"{t.rmask}[None, :, None]")
    if t.cmask:
        masks.append(f"{t.cmask}[None, None, :]")
    s_expr = "s0 + tl.arange(0, BLOCK_S)"
    return [
        f"acc = tl.zeros((BLOCK_M, BLOCK_N), tl.{dtype})",
        f"at = ({rows})[:, None] * {t.text(sp.n)} + rn[None, :]",
        f"for s0 in tl.range(0, {t.split}, BLOCK_S, num_stages=2):",
        f"    s = ({s_expr}).to(tl.int64)" if t.big else f"    s = {s_expr}",
        f"    part = tl.load({ws} + s[:, None, None] * {t.text(nprog * sp.m * sp.n)} + at[None, :, :], "
        f"mask={' & '.join(masks)}, other=0)",
        "    acc += tl.sum(part, axis=0)",
    ]
