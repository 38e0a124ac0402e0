"""conv_fprop's cost model of 16-bit implicit-GEMM configs on a Hopper GPU (`conv_cost`), its fitted
constants in one named table (`HOPPER`); the measurements it was fitted to are in
bench/results/triton-preferences.md#conv-cost.

A program's K iteration (a BLOCK_M x BLOCK_K gathered image tile and a BLOCK_K x BLOCK_N filter tile,
cp.async through shared memory, one wgmma) takes the longest of: a fixed lag plus a time per MFLOP of its
tile at a prefetch distance of 3 stages; the SM's multiplies at its rate with pointer loads; its loads from
L2 for all the programs the SM holds, an image row (an address and bounds check per row and tap) counting
more than a filter row unless a 1x1 conv reads the pixel rows as they are; and, for channels that are not
a multiple of 8 (the stem's 3: no 16-byte vectors), element loads. An SM holds as many programs as its
shared memory (one stage when K takes one step: nothing to pipeline) and registers (the fp32 accumulator
plus a thread's own; ptxas: within ~40) allow. The epilogue moves the tile's output and full-size inputs (a
residual). The SMs' rounds, the L2 reads (the image tile re-read once per column of tiles, the filter once
per row) and DRAM (each tensor once, a strided 1x1 reading only the pixels it samples) overlap imperfectly:
a p-norm, so that configs near the DRAM floor still differ by their rounds. A full-size epilogue input
waits on DRAM after the main loop, hidden only by the other programs on the SM. Split-K fills the SMs when
the tiles are few (a 7x7 or 14x14 image with 256-512 channels) at the cost of writing and re-reading fp32
partials and a second launch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ....core.device import Device
from ...cost import rates
from ..gemm import GemmPiece
from ..knobs import TileKnobs


class ConvMatch(Protocol):
    """What the model reads of a conv_fprop match."""

    gp: GemmPiece
    device: Device

    @property
    def shape(self) -> tuple[int, int, int]: ...  # (channels per group, filter taps, groups)

    def steps(self, k: TileKnobs) -> int: ...  # the main loop's trip count


@dataclass(frozen=True)
class ConvCostFit:
    """The fitted constants of `conv_cost` (µs, bytes, elements)."""

    lag_us: float  # a K step's fixed latency at a prefetch distance of one stage (3 stages: lag * 3 / 2)
    us_per_mflop: float  # a K step's time per MFLOP of its tile (0.43 µs at 64x64x64, 0.61 at 128x128x64)
    sm_mflop_per_us: float  # an SM's multiply rate with pointer loads (4 TFLOP/s)
    l2_bytes_per_us_sm: float  # an SM's loads from L2
    gathered_row: float  # an image row's cost in filter rows (its address and bounds checks a tap)
    narrow_elems_per_us_sm: float  # an SM's element loads where channels are not a multiple of 8
    smem_bytes: int  # shared memory of an SM
    smem_slack: int  # shared memory a program takes besides its stages
    regs: int  # registers of an SM
    thread_regs: int  # registers a thread takes besides its accumulator
    epilogue_bytes_per_us: float  # a program's epilogue traffic
    program_us: float  # a program's fixed cost
    l2_bytes_per_us: float  # the device's L2 reads (6 TB/s)
    dram_share: float  # of the device's copy rate that the convs' DRAM traffic reaches
    norm: int  # the p of the p-norm that overlaps rounds, L2 and DRAM
    epilogue_wait_bytes_per_us: float  # an SM's DRAM reads of a full-size epilogue input after the loop
    partials_bytes_per_us: float  # split-K's partials written and read again
    split_us: float  # split-K's second launch
    launch_us: float  # a launch


HOPPER = ConvCostFit(lag_us=0.37, us_per_mflop=0.114, sm_mflop_per_us=4.0, l2_bytes_per_us_sm=60e3,
                     gathered_row=1.25, narrow_elems_per_us_sm=18e3, smem_bytes=228_000, smem_slack=2048,
                     regs=65536, thread_regs=64, epilogue_bytes_per_us=45e3, program_us=0.5, l2_bytes_per_us=6e6,
                     dram_share=0.85, norm=4, epilogue_wait_bytes_per_us=100e3, partials_bytes_per_us=5e6,
                     split_us=2.5, launch_us=1.0)


def conv_cost(match: ConvMatch, knobs: TileKnobs, fit: ConvCostFit = HOPPER) -> float:
    """Estimated microseconds of a 16-bit implicit-GEMM config of `match` (see the module docstring)."""
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
    regs = bm * bn // (32 * warps) + fit.thread_regs
    resident = max(1, min(fit.smem_bytes // (smem + fit.smem_slack), fit.regs // (32 * warps * regs)))
    busiest = -(-programs // sms)  # programs on the busiest SM
    rounds, together = -(-busiest // resident), min(busiest, resident)
    x = gp.operand("image")
    rows = (1.0 if taps == 1 and tuple(x.dim[2:]) == tuple(gp.space.dims[2:]) else fit.gathered_row) * bm + bn
    mflop = 2 * bm * bn * bk / 1e6
    lag = fit.lag_us * 3 / max(1, stages - 1)  # prefetch distance stages - 1
    t_it = max(lag + fit.us_per_mflop * mflop, together * mflop / fit.sm_mflop_per_us,
               together * rows * bk * 2 / fit.l2_bytes_per_us_sm)
    if cg % 8:
        t_it = max(t_it, together * (bm + bn) * bk / fit.narrow_elems_per_us_sm)
    piece = gp.piece
    size = m * n * groups
    extra = sum(piece.tensor(u).nbytes for u in {u for nd in gp.epilogue for u in nd.input_uids()}
                if u in piece.inputs and piece.tensor(u).numel * 2 > size) / size  # bytes per output element
    stored = sum(piece.tensor(u).nbytes for u in gp.stores) / size
    t_prog = per * t_it + min(stages - 1, per) * t_it / 2 + bm * bn * (stored + extra) / fit.epilogue_bytes_per_us \
        + fit.program_us
    traffic = groups * ((m * k * 2) * -(-n // bn) + (n * k * 2) * -(-m // bm))
    moved = gp.moved_bytes() - x.nbytes + min(x.nbytes, m * k * groups * 2)
    limits = (rounds * t_prog, traffic / fit.l2_bytes_per_us, moved / (fit.dram_share * rates(device)[0] / 1e6))
    t = sum(v ** fit.norm for v in limits) ** (1 / fit.norm) + \
        busiest * bm * bn * extra / (together * fit.epilogue_wait_bytes_per_us)
    if split > 1:
        t += split * m * n * groups * 4 * 2 / fit.partials_bytes_per_us + fit.split_us
    return t + fit.launch_us
