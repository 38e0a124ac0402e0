"""Knob heuristics: the tile-shape cost model and the ranked candidates of GEMM-class templates."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ....core.device import Device
from ..knobs import SMEM_LIMIT, TileKnobs
from ..templates.base import pow2_at_least, unique
from .analysis import GemmPiece

# Fraction of a Hopper SM's tensor-core rate a Triton tile of BM x BN reaches (pointer-load GEMMs
# reach ~530-550 TFLOP/s at 128x256 on an H200; smaller tiles move more operand bytes per flop).
_TILE_EFF = {
    (128, 256): 1.0,
    (256, 128): 0.95,
    (128, 128): 0.85,
    (256, 64): 0.8,
    (128, 64): 0.7,
    (64, 128): 0.65,
    (64, 64): 0.5,
    (128, 32): 0.4,
    (64, 32): 0.3,
}
_PEAK = {1: 1.5e15, 2: 0.75e15, 4: 0.37e15}  # realistic dense rates by operand bytes (int8, 16-bit, tf32)
BANDWIDTH = 3.0e12  # bytes/s an H100 streams (an H200 does ~4.2e12)
# bytes/s the L2 cache feeds the multiprocessors: every program loads its (BM + BN) x K operand tiles
# through it, which bounds small tiles with a long K (bench/results/constants.md#hopper-small-tiles)
L2_BANDWIDTH = 11.0e12
# seconds a main-loop iteration's loads take to arrive: a program with `num_stages - 1` iterations in flight
# runs one iteration per LOAD_LATENCY / (num_stages - 1) at best, which bounds few programs with a long K
# (bench/results/constants.md#load-latency)
LOAD_LATENCY = 0.7e-6


# Time of an fp8 product whose tensor-core sums join the fp32 accumulator every main-loop step (TileKnobs.FP8_ACC
# not 0) over the same config with fast accumulation: by the tile's width, <= 128 columns and wider (the
# warpgroup's second fp32 accumulator beside the first) (bench/results/constants.md#fp8-accumulation)
FP8_JOIN_COST = (1.25, 2.2)


def fp8_join_cost(knobs: TileKnobs) -> float:
    """`FP8_JOIN_COST`'s factor for a config of an fp8 product on the fp8 tensor cores."""
    if knobs.FP8_ACC == 0:
        return 1.0
    return FP8_JOIN_COST[0] if knobs.BLOCK_N <= 128 else FP8_JOIN_COST[1]


def _iters(k: int, k_step: int, bk: int) -> int:
    chunk = k_step or k
    return -(-chunk // bk) * max(1, k // chunk)


def estimate_us(
    m: int,
    n: int,
    k: int,
    knobs: TileKnobs,
    *,
    nprog: int,
    device: Device,
    elem_bytes: int = 2,
    k_step: int = 0,
    moved_bytes: int = 0,
    latency_floor: bool = False,
) -> float:
    """A rough time model of one config on a Hopper GPU: waves of programs x one tile's math at the
    tile's efficiency, bounded below by the bytes the piece moves (`moved_bytes`: its inputs and
    outputs) and by the operand tiles the programs load through the L2 cache, plus what the epilogue
    moves beyond a plain store (which overlaps no math), split-K's partials and its extra launch. With
    `latency_floor` (measured on the matmul template's loops, not the convs'), also by the latency of
    each program's serial main loop (LOAD_LATENCY)."""
    assert knobs.BLOCK_K is not None
    bm, bn, bk = knobs.BLOCK_M, knobs.BLOCK_N, knobs.BLOCK_K
    split, stages = knobs.split_k, knobs.num_stages or 3
    sms = max(device.sm_count, 1)
    iters = _iters(k, k_step, bk)
    programs = -(-m // bm) * -(-n // bn) * nprog * split
    smem = stages * (bm + bn) * bk * elem_bytes
    ctas = max(1, min(2, 220_000 // max(smem, 1)))
    eff = _TILE_EFF.get((bm, bn), 0.25)
    if bm * bn < 16384:
        eff = min(0.65, eff * (1 + 0.25 * (ctas - 1)))  # a second resident program hides some latency
    chunk = k_step or k
    eff *= chunk / (-(-chunk // bk) * bk)  # lanes wasted on a ragged channel chunk
    peak = _PEAK.get(elem_bytes, _PEAK[2]) / sms
    # The Hopper path's gains were measured on tiles of 16K elements and more (128 x 128, 256 x 64 and up); on
    # smaller ones (latency-bound at 4 warps) TMA and persistence gained nothing, and the persistent ones' gains
    # need a second tile per program (bench/results/constants.md#hopper-small-tiles)
    big = bm * bn >= 16384
    if knobs.tma and big:
        eff *= 1.2  # TMA copies: no address math or masks in the loop (measured 590-643 vs 531 TFLOP/s)
    rounds = -(-programs // (sms * ctas))  # (programs resident together wait on their loads together)
    waves: float = rounds * ctas
    if knobs.persistent:
        # the busiest program's tiles (64 tiles on 132 programs take one tile's time, not half of it), its
        # multiprocessor shared by persistent / sms programs
        busiest = rounds = -(-programs // knobs.persistent)
        waves = busiest * knobs.persistent / sms
        if big and busiest > 1:
            eff *= 1.08  # epilogue of one tile overlaps the next tile's loads (663-694 TFLOP/s)
            if knobs.tma_host:
                eff *= 1.08  # host descriptors, flattened loop (bench/results/constants.md#hopper-host-descriptors)
            if knobs.ws:
                eff *= 1.08  # a loader warp, the consumers' products in flight (constants.md#warp-specialized-gemm)
    t_math = waves * 2.0 * bm * bn * bk * -(-iters // split) / (peak * eff)
    plain = ((m + n) * k * elem_bytes + m * n * max(elem_bytes, 2)) * nprog
    moved = moved_bytes or plain
    tiles_loaded = programs * (bm + bn) * bk * -(-iters // split) * elem_bytes
    t = max(t_math, moved / BANDWIDTH, tiles_loaded / L2_BANDWIDTH)
    # What an epilogue moves beyond a plain product's store follows each program's main loop, and programs
    # that start together run their epilogues together: that traffic overlaps no math, but for a second
    # resident program a multiprocessor runs meanwhile (the Llama's weight gradients with AdamW's update
    # took 69-71 µs where a library GEMM and a separate update took 54; a residual add costs the output
    # projection 7-11 µs: bench/results/constants.md#exposed-epilogue)
    t += max(0, moved - plain) / BANDWIDTH / (1 if knobs.persistent else ctas)
    if latency_floor:
        t = max(t, rounds * -(-iters // split) * LOAD_LATENCY / max(stages - 1, 1))
    if split > 1:
        t += split * m * n * nprog * 8 / BANDWIDTH + 2e-6
    if knobs.tma and not knobs.tma_host:
        t += 7e-6  # the descriptors' scratch allocation at launch (CPU side; hidden by CUDA graphs)
    return t * 1e6 + 3.0


def gemm_candidates(
    m: int,
    n: int,
    k: int,
    *,
    nprog: int,
    device: Device,
    elem_bytes: int = 2,
    k_step: int = 0,
    moved_bytes: int = 0,
    extra: Mapping[str, Any] | None = None,
    latency_floor: bool = False,
) -> list[TileKnobs]:
    """Tile configs for an M x N x K product repeated `nprog` times, the heuristic's choice first.

    On the GPU (Hopper) a grid of tile shapes (128x256 down to 64x32, only as wide as N needs),
    BLOCK_K 64 (32 for fp32, 128 for int8), 3-4 stages, 4-8 warps, group-M 8 and split-K factors is
    ranked by `estimate_us`: big tiles when they fill the SMs, smaller tiles or a split of K when
    they do not (small images, deep channels). Under the interpreter: 16..32-wide tiles (few, small
    programs); a split of K when the tiles are fewer than the "SMs" and the loop is long, so the
    tests exercise it. The last candidate is the plain, smallest config (HeurMode.FALLBACK).
    `k_step` is the natural K chunk (channels per filter tap of a conv) when smaller than K;
    `latency_floor` as `estimate_us`'s."""
    extra = dict(extra or {})
    chunk = k_step or k
    if not device.is_cuda:
        bm = min(32, pow2_at_least(m, 16))
        bn = min(32, pow2_at_least(n, 16))
        bk = min(32, pow2_at_least(chunk, 16))
        tiles = -(-m // bm) * -(-n // bn) * nprog
        iters = _iters(k, k_step, bk)
        split = min(4, iters // 4) if tiles < device.sm_count and iters >= 16 else 1
        first = TileKnobs(
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=2, SPLIT_K=split, num_warps=4, num_stages=1, **extra
        )
        last = TileKnobs(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=1, SPLIT_K=1, num_warps=4, num_stages=1, **extra)
        return unique([first, last])
    bk = {1: 128, 2: 64}.get(elem_bytes, 32)
    bk = min(bk, pow2_at_least(chunk, 16))
    if elem_bytes == 1:
        bk = max(bk, 32)  # 8-bit tl.dot needs K >= 32 on the GPU
    shapes = [(128, 256), (128, 128), (256, 128), (128, 64), (256, 64), (64, 128), (64, 64), (128, 32), (64, 32)]
    widest = max(32, pow2_at_least(n, 32))
    out = []
    for bm, bn in shapes:
        if bn > widest or (elem_bytes >= 4 and bm * bn > 16384):
            continue
        stages = 3 if bm * bn >= 32768 or elem_bytes >= 4 else 4
        warps = 8 if bm * bn >= 16384 or (elem_bytes >= 4 and bm >= 128) else 4  # fp32 128-row tiles spill at 4
        iters = _iters(k, k_step, bk)
        for split in (1, 2, 4, 8):
            if split > 1 and iters // split < 4:
                break
            out.append(
                TileKnobs(
                    BLOCK_M=bm,
                    BLOCK_N=bn,
                    BLOCK_K=bk,
                    GROUP_M=8,
                    SPLIT_K=split,
                    num_warps=warps,
                    num_stages=stages,
                    **extra,
                )
            )
    out.sort(
        key=lambda c: estimate_us(
            m,
            n,
            k,
            c,
            nprog=nprog,
            device=device,
            elem_bytes=elem_bytes,
            k_step=k_step,
            moved_bytes=moved_bytes,
            latency_floor=latency_floor,
        )
    )
    out = out[:6]
    out.append(
        TileKnobs(
            BLOCK_M=64,
            BLOCK_N=min(64, widest),
            BLOCK_K=bk if elem_bytes == 1 else min(bk, 32),
            GROUP_M=8,
            SPLIT_K=1,
            num_warps=4,
            num_stages=2,
            **extra,
        )
    )
    return unique(out)


def finish_candidates(
    configs: list[TileKnobs], gp: GemmPiece, device: Device, extra: Mapping[str, Any]
) -> list[TileKnobs]:
    """A GEMM template's ranked configs, finished: epilogue subtiles for large tiles (`with_subtile`)
    and, for fp32 operands (`extra` from `fp32_knobs`), the first config in full fp32 as the second."""
    configs = fit_shared_memory(with_subtile(configs, gp, device), gp, device)
    if "fp32_precision" in extra:
        configs.insert(1, configs[0].replace(fp32_precision="ieee"))
    return configs


def staged_itemsizes(gp: GemmPiece) -> tuple[int, int]:
    """Bytes an element of the A and B tiles takes in shared memory: the type an operand is read in from
    memory, the widest of its prologue's inputs where it has one (a float32 weight cast to bf16 in the
    prologue is staged as float32; broadcast operands are vectors, not tiles)."""
    sizes = []
    for uid in gp.main.input_uids()[:2]:
        operand = gp.tensor(uid)
        chain = gp.prologue.get(uid, ())
        made = {u for n in chain for u in n.output_uids()}
        read = [gp.tensor(u) for n in chain for u in n.input_uids() if u not in made]
        tiles = [t for t in read if not t.is_pass_by_value and t.numel == operand.numel]
        sizes.append(max([t.data_type.itemsize for t in tiles] or [operand.data_type.itemsize]))
    return sizes[0], sizes[-1]


def fit_shared_memory(configs: list[TileKnobs], gp: GemmPiece, device: Device) -> list[TileKnobs]:
    """Configs with their pipeline stages cut (to 2 at least) until the staged operand tiles (and a row
    reduction's tile: `reduction_tile_bytes`) fit a block's shared memory (Triton keeps num_stages buffers
    of TMA loads, one fewer of pointer loads); those that do not fit at 2 are left out, but the last.
    The candidates' stages assume 16-bit tiles; a float32 weight cast in the prologue doubles B's:
    ViT-B/16's patch-embedding conv (128 x 256 tiles, 4 stages) asked 240 KiB, failed to launch, and the
    build fell back to a slower library conv (bench/results/constants.md#patch-convolutions)."""
    if not device.is_cuda:
        return configs
    a_item, b_item = staged_itemsizes(gp)
    fitted = []
    for c in configs:
        if c.BLOCK_K is None or c.num_stages is None:
            fitted.append(c)
            continue
        stage = (c.BLOCK_M * a_item + c.BLOCK_N * len(gp.mains) * b_item) * c.BLOCK_K
        stages, spare = c.num_stages, 0 if c.TMA else 1
        extra = reduction_tile_bytes(c, gp)
        while stages > 2 and (stages - spare) * stage + extra > SMEM_LIMIT:
            stages -= 1
        if (stages - spare) * stage + extra > SMEM_LIMIT and c is not configs[-1]:
            continue  # (too large even at 2 stages: it would not launch; the broadest config stays)
        fitted.append(c if stages == c.num_stages else c.replace(num_stages=stages))
    return unique(fitted)


def row_reduced(gp: GemmPiece) -> bool:
    """Whether the epilogue ends in a reduction along each row of the tile (RMSNorm's mean of squares
    after a residual add)."""
    return any(r.along == "cols" for r in gp.reductions)


def reduction_tile_bytes(config: TileKnobs, gp: GemmPiece) -> int:
    """Shared memory a row reduction in the epilogue adds to the staged tiles: Triton exchanges the float32
    (sub)tile it reduces through it, the whole tile or a column half of it under EPILOGUE_SUBTILE=2 (ptxas on
    sm_90: 128 x 256 tiles, 3 stages, whole: 278,552 bytes, the plain product's 147,456 staged plus 131,072;
    bench/results/triton-preferences.md#row-reduction-tiles)."""
    return config.BLOCK_M * config.BLOCK_N // config.subtile * 4 if row_reduced(gp) else 0


def with_subtile(configs: list[TileKnobs], gp: GemmPiece, device: Device) -> list[TileKnobs]:
    """EPILOGUE_SUBTILE=2 for large tiles with an epilogue beyond a store: on an H200-class GPU a
    128x256 fp32 accumulator already takes 128 registers per thread, and e.g. an erf-based GELU on
    the whole tile spills (seen in ptxas: 255 registers + spills; halves: none)."""
    if not device.is_cuda or not gp.epilogue:
        return configs
    width = len(gp.mains)  # (products side by side: their accumulators together)
    return [c.replace(EPILOGUE_SUBTILE=2) if c.BLOCK_M * c.BLOCK_N * width >= 32768 else c for c in configs]


def prologue_share(config: TileKnobs, taps: int = 1) -> float:
    """Image elements each thread of a program transforms per K step when a prologue (SBR's scale + bias
    + relu) runs on the image tile in registers: `taps` tiles of BLOCK_M x BLOCK_K over the program's
    threads. The templates with such a prologue prefer configs under a budget of it (preferences.py:
    SBR_CONV_LEAN, SBR_WGRAD_LEAN)."""
    assert config.BLOCK_K is not None
    return taps * config.BLOCK_M * config.BLOCK_K / (32 * config.warps)
