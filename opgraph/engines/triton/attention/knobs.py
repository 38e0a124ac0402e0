"""Knob candidates of the attention kernels, the heuristic's choice first.

On the GPU the choice depends on the head dim (the register budget: a [BLOCK_M, D] fp32 accumulator
per program forward, two [BLOCK_N1, D] ones in the dK/dV kernel) and follows what Triton's
fused-attention tutorial and FlexAttention found on Hopper: 128-query tiles with 64- or 128-key
steps forward (8 warps for D >= 128), 2-3 pipeline stages; backward 128 keys per dK/dV program
stepping 32-64 query rows, 128 queries per dQ program stepping 32-64 keys. Under the interpreter,
16-row tiles, so small test shapes still cross several tiles, diagonals and ragged ends.
"""

from __future__ import annotations

from dataclasses import replace

from ..knobs import SMEM_LIMIT
from .spec import AttnSpec, BwdKnobs, FwdKnobs
from .tiles import table_fits, tiles_ok
from .warpspec import ws_refusal

_ISZ = {
    "tl.float32": 4,
    "tl.float16": 2,
    "tl.bfloat16": 2,
    "tl.float64": 8,
    "tl.int8": 1,
    "tl.uint8": 1,
    "tl.int1": 1,
    "tl.int32": 4,
    "tl.int64": 8,
}


def _pow2_dim(d: int) -> int:
    p = 16
    while p < d:
        p *= 2
    return p


def fwd_candidates(d: int, *, cuda: bool, dv: int | None = None, scored: bool = False) -> list[FwdKnobs]:
    """Forward knobs, the heuristic's choice first. GPU: one loop with run-time masks (ONELOOP: fewer
    registers than a loop per mask case, equal or faster in every measured row). `scored` (a score
    modifier in the tile loop) changes nothing here: with the modifier's tile-loop forms the heuristic's
    128x128 tiles compile without spills (D=128, sm_90)."""
    if not cuda:
        return [FwdKnobs(16, 16, 4, 1), FwdKnobs(32, 16, 4, 1)]
    width = max(_pow2_dim(d), _pow2_dim(dv or d))
    if width <= 64:
        c = [
            FwdKnobs(128, 64, 4, 3),
            FwdKnobs(128, 128, 8, 3),
            FwdKnobs(128, 64, 4, 4),
            FwdKnobs(64, 64, 4, 3),
            FwdKnobs(128, 32, 4, 3),
        ]
    elif width <= 128:
        # 128x128/w8s3 the fastest on an H100 but at 1k causal (64x64/w4s3 then), 128x64/w8s3 within 3-8%,
        # 2 stages and TMA reads slower (bench/results/triton-preferences.md#attention-forward)
        c = [
            FwdKnobs(128, 128, 8, 3),
            FwdKnobs(64, 64, 4, 3),
            FwdKnobs(128, 64, 8, 3),
            FwdKnobs(128, 64, 8, 4),
            FwdKnobs(128, 64, 4, 3),
            FwdKnobs(128, 32, 4, 3),
        ]
    else:
        c = [FwdKnobs(128, 64, 8, 2), FwdKnobs(64, 64, 4, 2), FwdKnobs(128, 32, 8, 2), FwdKnobs(64, 32, 4, 3)]
    return [replace(k, ONELOOP=1) for k in c] + [c[0]]


# split-KV candidates: the key splits offered where a forward has at most DECODE_MAX_SQ queries (a decode
# step: too few query blocks to fill the GPU); the build's policy (opgraph/build/split_kv.py) puts one first
DECODE_MAX_SQ = 16
SPLITS = (2, 4, 8, 16, 32)


def split_candidates(spec: AttnSpec, *, cuda: bool, skv: int | None = None) -> list[FwdKnobs]:
    """Split-KV knobs of a decode-shaped forward (at most DECODE_MAX_SQ queries), 16-query tiles, each
    split at least one key block of `skv` keys (default the spec's; a dynamic plan's bucket offers the
    splits of its largest KV length, which the build's policy chooses among per shape); [] otherwise."""
    if spec.Sq > DECODE_MAX_SQ:
        return []
    bn = 64 if cuda else 16
    base = FwdKnobs(16, bn, 4, 3 if cuda else 1, ONELOOP=1 if cuda else 0)
    return [replace(base, SPLIT=s) for s in SPLITS if -(-(skv or spec.Skv) // s) >= bn]


# GQA head packing (attention/gqa_pack.py): offered where a decode-shaped forward's queries times its group
# fill at most PACK_MAX_ROWS tile rows (the forward's largest tile); the build's policy
# (opgraph/build/gqa_pack.py) decides whether one goes first
PACK_MAX_ROWS = 128


def pack_candidates(spec: AttnSpec, *, cuda: bool, skv: int | None = None) -> list[FwdKnobs]:
    """GQA-packed knobs of a decode-shaped forward with query-head groups (Hq > Hk, one value head per
    key head): a tile of the group's heads times the queries (a power of two >= 16 rows), whole and with
    each split of split_candidates; [] otherwise."""
    rows = spec.Sq * spec.gk
    if spec.Sq > DECODE_MAX_SQ or spec.Hq <= spec.Hk or spec.Hk != spec.Hv or rows > PACK_MAX_ROWS:
        return []
    bm, bn = _pow2_dim(rows), 64 if cuda else 16
    whole = FwdKnobs(bm, bn, 8 if cuda and bm > 64 else 4, 3 if cuda else 1, ONELOOP=1 if cuda else 0, PACK_GQA=1)
    return [whole] + [replace(whole, SPLIT=s) for s in SPLITS if -(-(skv or spec.Skv) // s) >= bn]


def decode_candidates(spec: AttnSpec, *, cuda: bool, skv: int | None = None) -> list[FwdKnobs]:
    """The knobs the build's decode policies choose among: split_candidates' and pack_candidates'."""
    return split_candidates(spec, cuda=cuda, skv=skv) + pack_candidates(spec, cuda=cuda, skv=skv)


def tile_candidates(spec: AttnSpec, *, cuda: bool) -> list[FwdKnobs]:
    """The tile list (tiles.py) on the heuristic's first two forward knobs, where it applies (packed
    queries, every output packed); after the others until measured: an autotuned build times them."""
    if tiles_ok(spec) is not None:
        return []
    base = fwd_candidates(spec.D, cuda=cuda, dv=spec.Dv, scored=spec.score_mod is not None)[:2]
    return [replace(k, TILES=1) for k in base if table_fits(spec, k.BLOCK_M, -(-spec.Sq // k.BLOCK_M))]


def tile_bwd_candidates(spec: AttnSpec, *, cuda: bool, skv: int | None = None) -> list[BwdKnobs]:
    """The tile list (tiles.py) on the heuristic's first two unfused backward knob sets, where it applies
    (packed q, k, v and gradients, no dBias); after the others until measured."""
    if tiles_ok(spec, ("dq", "dk", "dv", "dbias"), ("q", "kv")) is not None:
        return []
    base = [k for k in bwd_candidates(spec.D, cuda=cuda, dv=spec.Dv, scored=spec.score_mod is not None) if not k.FUSED]
    return [
        replace(k, TILES=1)
        for k in base[:2]
        if table_fits(spec, k.BLOCK_N1, -(-spec.Skv // k.BLOCK_N1))
        and table_fits(spec, k.BLOCK_M2, -(-spec.Sq // k.BLOCK_M2))
    ]


def ws_candidates(spec: AttnSpec, *, hopper: bool) -> list[FwdKnobs]:
    """The warp-specialised forward (warpspec.py) on Hopper where its loop can be (fp16 / bf16, D and Dv
    <= 128): 4 warps (Triton adds the producer group: 12 in all), 128x128 tiles in 2 stages and 128x64 in
    3 (Triton 3.6 for sm_90, D 128 bf16 causal: 168 registers, no spills, 180 KB of shared memory). Not
    among the candidates: on an H200 with Triton 3.6 every one of them hangs, causal or not
    (scripts/attention_ws_check.py, bench/results/constants.md)."""
    halves = {spec.q.dtype, spec.k.dtype, spec.v.dtype} <= {"tl.float16", "tl.bfloat16"}
    if not hopper or not halves or max(spec.D, spec.Dv) > 128 or ws_refusal(spec) is not None:
        return []
    return [FwdKnobs(128, 128, 4, 2, TMA=1, ONELOOP=1, WS=1), FwdKnobs(128, 64, 4, 3, TMA=1, ONELOOP=1, WS=1)]


def more_fwd_candidates(spec: AttnSpec, *, cuda: bool, skv: int | None = None) -> list[FwdKnobs]:
    """The forward's knobs after the heuristic's own: decode_candidates', then tile_candidates' (not yet
    ws_candidates': the warp-specialised kernels hang on Hopper under Triton 3.6)."""
    return decode_candidates(spec, cuda=cuda, skv=skv) + tile_candidates(spec, cuda=cuda)


def bwd_candidates(d: int, *, cuda: bool, dv: int | None = None, scored: bool = False) -> list[BwdKnobs]:
    """Backward knobs, the heuristic's choice first (ONELOOP as in the forward). `scored`: the tile loop
    computes a score modifier and its derivative, whose values stay live beside the accumulators."""
    if not cuda:
        return [BwdKnobs(16, 32, 32, 16, 4, 1, 4, 1, 16), BwdKnobs(16, 16, 16, 16, 4, 1, 4, 1, 16)]
    width = max(_pow2_dim(d), _pow2_dim(dv or d))
    if width <= 64:
        c = [
            BwdKnobs(64, 128, 128, 64, 8, 3, 8, 3),
            BwdKnobs(64, 64, 64, 64, 4, 2, 4, 2, FUSED=1),
            BwdKnobs(32, 128, 128, 32, 4, 4, 4, 4),
            BwdKnobs(64, 64, 64, 64, 4, 3, 4, 3),
        ]
    elif width <= 128:
        # the split launches (128 keys a dK/dV program stepping 64 query rows, 128 queries a dQ program
        # stepping 64 keys, 8 warps, 3 stages) timed the fastest as plans run them in every measured row
        # (bench/results/triton-preferences.md#attention-backward); the fused 64x64 launch took 1.03-1.41x
        c = [
            BwdKnobs(64, 128, 128, 64, 8, 3, 8, 3),
            BwdKnobs(64, 128, 128, 64, 8, 4, 8, 4),
            BwdKnobs(64, 64, 64, 64, 4, 2, 4, 2, FUSED=1),
            BwdKnobs(64, 64, 128, 64, 4, 2, 8, 4),
            BwdKnobs(64, 64, 64, 64, 4, 2, 4, 2),
        ]
        if scored:
            # D=128 with tanh soft-capping and ALiBi (compiled for sm_90): the first config's dK/dV launch
            # spills ~130 bytes and still measured the fastest; the fused alternatives here do not spill
            # (4-warp fused or 64-key dK/dV launches spilled 92-230 bytes:
            # bench/results/triton-preferences.md#attention-backward)
            c = [
                c[0],
                c[1],
                BwdKnobs(32, 128, 128, 32, 8, 2, 8, 2, FUSED=1),
                BwdKnobs(64, 64, 64, 64, 8, 2, 8, 2, FUSED=1),
                BwdKnobs(32, 64, 64, 32, 4, 2, 4, 2, FUSED=1),
            ]
    else:
        # D=256 (compiled for sm_90, not timed): the dK/dV accumulators need 8 warps at 64 keys a
        # program (4 warps spilled 2 KiB)
        c = [
            BwdKnobs(32, 64, 64, 32, 8, 2, 4, 2),
            BwdKnobs(16, 64, 64, 32, 8, 2, 4, 2),
            BwdKnobs(32, 64, 64, 64, 8, 2, 8, 2),
        ]
    return [replace(k, ONELOOP=1) for k in c]


def _tile(spec: AttnSpec, rows: int, cols: int) -> int:
    """Bytes per pipeline stage of the [rows, cols] score-shaped tiles the loop loads (bias, dropout mask)."""
    n = 0
    if spec.bias is not None:
        n += rows * cols * _ISZ.get(spec.bias.dtype, 4)
    mask = getattr(spec.dropout, "mask", None)
    if mask is not None:
        n += rows * cols * _ISZ.get(mask.dtype, 4)
    return n


def _once(spec: AttnSpec, rows: int, cols: int) -> int:
    """Bytes of shared memory outside the pipeline stages for a [rows, cols] score tile: a block mask's
    bytes are gathered per score element (mask_expr) and Triton stages the tile through shared memory,
    int32-wide (sm_90: Triton 3.9 asked 4 bytes a score for most forward tiles, 2 for 128 x 128, 1 in the
    backward; Triton 3.6 less: 4 KiB at 128 x 128, which took the forward 1 KiB over an H200's 227 KiB)."""
    return 4 * rows * cols if spec.block_mask is not None else 0


def fwd_smem(spec: AttnSpec, k: FwdKnobs) -> int:
    """Shared memory the forward needs (an estimate that matched Triton's within a few KiB on Hopper,
    or above it): q once, then k, v (and bias / mask tiles) per pipeline stage, and a block mask's tile."""
    isz = _ISZ.get(spec.q.dtype, 4)
    dp, dvp = _pow2_dim(spec.D), _pow2_dim(spec.Dv)
    stage = k.BLOCK_N * (dp + dvp) * isz + _tile(spec, k.BLOCK_M, k.BLOCK_N)
    return k.BLOCK_M * dp * isz + max(1, k.num_stages) * stage + _once(spec, k.BLOCK_M, k.BLOCK_N)


def bwd_smem(spec: AttnSpec, k: BwdKnobs) -> tuple[int, int]:
    """Shared memory of the dK/dV and the dQ kernel (estimates, as fwd_smem)."""
    isz = _ISZ.get(spec.q.dtype, 4)
    dp, dvp = _pow2_dim(spec.D), _pow2_dim(spec.Dv)
    dkdv = (
        k.BLOCK_N1 * (dp + dvp) * isz
        + max(1, k.S1) * (k.BLOCK_M1 * (dp + dvp) * isz + 8 * k.BLOCK_M1 + _tile(spec, k.BLOCK_N1, k.BLOCK_M1))
        + _once(spec, k.BLOCK_N1, k.BLOCK_M1)
    )
    dq = (
        k.BLOCK_M2 * (dp + dvp) * isz
        + max(1, k.S2) * (k.BLOCK_N2 * (dp + dvp) * isz + _tile(spec, k.BLOCK_M2, k.BLOCK_N2))
        + _once(spec, k.BLOCK_M2, k.BLOCK_N2)
    )
    return dkdv, dq


# at most this many keys (static): steps of SHORT_KV_BLOCK_N keys. Triton 3.6's code for a loop of one
# 64-key step (the trip count constant, the loop gone) computed wrong outputs with 4 warps, D 56-64 and
# Dv 32 (bench/results/constants.md#short-kv)
SHORT_KV = 64
SHORT_KV_BLOCK_N = 32


def fit_fwd(spec: AttnSpec, k: FwdKnobs, skv: int | None = None) -> FwdKnobs | None:
    """`k` on the GPU: 32-key steps where there are at most SHORT_KV keys (`skv`: at the largest shape of a
    dynamic plan's bucket, whose kernel serves every shape of it; else the spec's), and fewer pipeline
    stages where its tiles would not fit shared memory; None if even one stage does not fit."""
    keys = spec.Skv if skv is None else skv
    if isinstance(keys, int) and keys <= SHORT_KV and k.BLOCK_N > SHORT_KV_BLOCK_N:
        k = replace(k, BLOCK_N=SHORT_KV_BLOCK_N)
    while fwd_smem(spec, k) > SMEM_LIMIT:
        if k.num_stages <= 1:
            return None
        k = replace(k, num_stages=k.num_stages - 1)
    return k


def fit_bwd(spec: AttnSpec, k: BwdKnobs, skv: int | None = None) -> BwdKnobs | None:
    """`k` with fewer pipeline stages where its tiles would not fit shared memory; None if even one stage
    does not fit (`skv` unused: fit_fwd's signature)."""
    while True:
        a, b = bwd_smem(spec, k)
        if k.FUSED:
            a = b = max(a, b)
        if a <= SMEM_LIMIT and b <= SMEM_LIMIT:
            return k
        if a > SMEM_LIMIT:
            if k.S1 <= 1:
                return None
            k = replace(k, S1=k.S1 - 1)
        if b > SMEM_LIMIT and not k.FUSED:
            if k.S2 <= 1:
                return None
            k = replace(k, S2=k.S2 - 1)
