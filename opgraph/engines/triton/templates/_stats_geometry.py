"""The geometry of a batchnorm / instancenorm piece for the norm_stats template (statistics over P
positions per channel, Q channels, its layout) and its knob heuristics (channel blocks, chunks of
positions, stages)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ....core.device import Device
from ....core.piece import Piece
from ..knobs import StatsKnobs
from ._norm_common import Fusion, memory_order, pow2_ceil
from .base import unique

FORWARD = ("batchnorm", "instancenorm")
BACKWARD = ("batchnorm_backward", "instancenorm_backward")
KINDS = (*FORWARD, *BACKWARD, "batchnorm_inference")


@dataclass(frozen=True)
class StatsGeometry:
    fusion: Fusion
    dims: tuple[int, ...]
    B: int  # samples with their own statistics (instancenorm), else 1
    C: int
    b_axes: tuple[int, ...]
    c_axes: tuple[int, ...]
    p_axes: tuple[int, ...]  # reduced axes outside C, memory order
    q_axes: tuple[int, ...]  # reduced axes inside C, memory order

    @property
    def kind(self) -> str:
        return self.fusion.norm.kind

    @property
    def P(self) -> int:
        return math.prod(self.dims[a] for a in self.p_axes)

    @property
    def Q(self) -> int:
        return math.prod(self.dims[a] for a in self.q_axes)

    @property
    def M(self) -> int:
        """Elements per statistic."""
        return self.P * self.Q

    @property
    def S(self) -> int:
        """Statistic slots (b * C + c)."""
        return self.B * self.C

    @property
    def channels_last(self) -> bool:
        return not self.q_axes


def geometry(fusion: Fusion) -> StatsGeometry:
    x = fusion.x
    dims = x.dim
    instance = fusion.norm.kind.startswith("instancenorm")
    kept = {0, 1} if instance else {1}
    b_axes = (0,) if instance and dims[0] > 1 else ()
    c_axes = (1,) if dims[1] > 1 else ()
    reduced = [a for a in range(len(dims)) if a not in kept and dims[a] > 1]
    if c_axes:
        sc = x.stride[1]
        p_axes = memory_order([a for a in reduced if x.stride[a] >= sc], x.stride)
        q_axes = memory_order([a for a in reduced if x.stride[a] < sc], x.stride)
    else:  # one channel: walk every reduced axis as the contiguous one
        p_axes, q_axes = (), memory_order(reduced, x.stride)
    return StatsGeometry(fusion, dims, dims[0] if b_axes else 1, dims[1], b_axes, c_axes, p_axes, q_axes)


# -- knobs ------------------------------------------------------------------------------------------


def _best_q_block(q: int, cap: int) -> int:
    """The largest power-of-2 block in [16, cap] whose ragged edge wastes at most ~6% of the Q axis."""
    best, b = 16, 32
    while b <= min(cap, pow2_ceil(q)):
        if -(-q // b) * b <= q * 1.0625:
            best = b
        b *= 2
    return min(best, pow2_ceil(q))


def stats_bytes(g: StatsGeometry, piece: Piece) -> int:
    """Bytes the stats pass reads per element of the space: its full-size inputs (x, dy, the
    prologue's inputs)."""
    fusion = g.fusion
    full = fusion.full_inputs()
    uids = {u for n in fusion.prologue_for(full) for u in n.input_uids()} | full
    return (
        sum(piece.tensor(u).data_type.itemsize for u in uids if u in piece.inputs and piece.tensor(u).dim == g.dims)
        or 2
    )


def pow2_floor(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def _stages(tile_bytes: int) -> int:
    """Pipeline depth of the stats loop: about 24 KiB in flight per program (2-4 tiles)."""
    return 1 + max(1, min(3, round(24576 / max(1, tile_bytes))))


def _knobs(
    g: StatsGeometry,
    device: Device,
    elt: int = 2,
    *,
    bc: int | None = None,
    q_cap: int = 1024,
    per_sm: int | None = None,
    order: int = 1,
    stages: int | None = None,
    prefetch: int = 0,
    tile: int = 4096,
) -> StatsKnobs:
    gpu = device.is_cuda
    cp = pow2_ceil(g.C)
    # tile accumulators of the stats loop: a backward without saved stats keeps 4, a forward 3 (the
    # shifted sums and the unshifted one, for the mean output), a backward with saved stats 2
    accumulators = 4 if g.kind in BACKWARD and g.fusion.norm.input("mean") is None else 3 if g.kind in FORWARD else 2
    # 16 warps an SM: 4 programs of 4 warps (2 accumulators, ~96-118 registers a thread), 3 of 4 (3
    # accumulators: 141-154 registers, sm_90), 2 of 8 (4 accumulators): what fits at once (one wave)
    per_sm = per_sm or {2: 4, 3: 3, 4: 2}[accumulators]
    if g.channels_last:
        if gpu:  # stats and apply tiles of 4096 elements; apply rows divide stats rows (ORDER)
            bc = min(cp, bc or 64)
            br, abc = max(1, tile // bc), min(cp, 128)
            abr = max(1, 4096 // abc)
        else:
            bc, br, abc, abr = min(cp, 4), 8, min(cp, 8), 8
        tiles = -(-g.P // br)
    else:
        if gpu:
            br = _best_q_block(g.Q, q_cap)
            bc = min(cp, max(1, tile // br))
        else:
            br, bc = min(pow2_ceil(g.Q), 8), min(cp, 4)
        abr, abc = br, min(cp, max(1, (4096 if gpu else 64) // br))
        tiles = g.P * -(-g.Q // br)
    cblocks = -(-g.C // bc)
    want = per_sm * device.sm_count if gpu else 8
    chunks = max(1, min(tiles, -(-want // (cblocks * g.B))))
    if stages is None:
        stages = _stages(br * bc * elt) if gpu and -(-tiles // chunks) > 1 else 0
    return StatsKnobs(
        BR=br,
        BC=bc,
        CHUNK=-(-tiles // chunks),
        W=max(4, pow2_floor(br * bc // 1024 * accumulators // 2)) if gpu else 4,
        ST=0 if prefetch else stages,
        PF=prefetch,
        ABR=abr,
        ABC=abc,
        AW=8 if gpu and abr * abc >= 4096 else 4,
        BS=min(pow2_ceil(g.S), 8 if gpu else 4),
        CW=4,
        ORDER=order,
    )


def candidate_knobs(g: StatsGeometry, device: Device, elt: int = 2) -> list[StatsKnobs]:
    """Knob settings, the heuristic's first. Stats pass: tiles of ~4096 elements (channel blocks of 64
    contiguous channels, or Q blocks that waste < 6% in their ragged edge), 4 warps per 2 fp32
    accumulators (32 elements a thread), 16 warps per SM (4 programs of 4 warps; 3 for a forward's 3
    accumulators; 2 of 8 when a backward recomputes the mean: 4 accumulators), the row loop software-pipelined
    (ST: `tl.range(num_stages=ST)`, cp.async into shared memory: ST - 1 tiles, ~24 KiB, in flight per
    program, ~96 KiB per SM, where the plain loop had one 8 KiB tile per program and waited for it
    every iteration); combine: 8 slots a program, every partial loaded once; apply: 4096-element
    tiles, 8 warps (>= 8 elements a thread), read in L2-friendly order (ORDER 1). The alternatives:
    the other orders, the plain loop (ST 0), register double buffering instead of cp.async (PF 1:
    the next tile's loads issued before this one is used), other pipeline depths, tile shapes and
    program counts. On the CPU interpreter small tiles, several chunks and channel blocks, so every
    code path runs (register prefetch included)."""
    variants: list[dict[str, Any]] = [{}, {"order": 0}, {"order": 2}]
    if device.is_cuda:
        st = _knobs(g, device, elt).ST or 0
        variants += [
            {"stages": 0},
            {"prefetch": 1},
            *([{"stages": st - 1}, {"stages": st + 1}] if st > 1 else []),
            {"tile": 8192},
            {"bc": 32},
            {"bc": 128},
            {"bc": 256},
            {"q_cap": 256},
            {"per_sm": 8},
            {"per_sm": 8, "prefetch": 1},
            {"per_sm": 2},
        ]
    else:
        variants += [{"prefetch": 1}, {"stages": 2}]
    return unique([_knobs(g, device, elt, **v) for v in variants])
