"""The constants of conv_fprop's cost model for 16-bit implicit GEMMs (`conv_fprop.conv_cost`), each named,
fitted to Hopper measurements: H200 ResNet-50 convs and an H100 benchmark that autotuned every candidate
(the numbers and dates: bench/results/constants.md#conv-cost-fit)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ImplicitGemmFit:
    """One GPU family's fitted constants of the implicit-GEMM cost model (units in the names)."""

    smem_per_sm: int  # bytes of shared memory an SM gives its programs
    smem_per_program: int  # bytes a program takes beyond its pipeline stages
    regs_per_sm: int  # 32-bit registers of an SM
    regs_per_thread: int  # registers a thread holds beyond its share of the fp32 accumulator (ptxas: within ~40)
    step_latency_us: float  # a K step's latency (a gathered image tile and a filter tile via cp.async, one wgmma)
    latency_stages: int  # ... at this prefetch distance, in stages; deeper pipelines hide it in proportion
    step_us_per_mflop: float  # a K step's time per MFLOP of its tile, beyond the latency
    sm_mflop_per_us: float  # an SM's multiply rate, with pointer loads (MFLOP/µs: 4 TFLOP/s)
    sm_l2_bytes_per_us: float  # an SM's loads from L2, for all the programs it holds
    image_row_weight: float  # a gathered image row (an address and bounds check per row and tap) in filter rows
    vector_channels: int  # channels per group that 16-byte vector loads need (a multiple of)
    sm_scalar_elems_per_us: float  # elements an SM loads without 16-byte vectors (the stem's 3 channels)
    epilogue_bytes_per_us: float  # a program's epilogue: the tile's output and full-size inputs (a residual)
    program_us: float  # a program's fixed cost
    l2_bytes_per_us: float  # the L2's rate (image tiles re-read per column of tiles, the filter per row)
    dram_share: float  # of the device's copy rate that a conv's DRAM traffic reaches (cost.DEVICE_RATES)
    overlap_norm: int  # the p-norm that overlaps the SMs' rounds, L2 and DRAM imperfectly
    sm_epilogue_dram_bytes_per_us: float  # an SM's wait for full-size epilogue inputs after its main loop
    split_bytes_per_us: float  # split-K: writing and re-reading the fp32 partials
    split_launch_us: float  # split-K: the combine launch
    base_us: float  # added to every estimate


HOPPER = ImplicitGemmFit(
    smem_per_sm=228_000,
    smem_per_program=2048,
    regs_per_sm=65536,
    regs_per_thread=64,
    step_latency_us=0.37,
    latency_stages=3,
    step_us_per_mflop=0.114,
    sm_mflop_per_us=4.0,
    sm_l2_bytes_per_us=60e3,
    image_row_weight=1.25,
    vector_channels=8,
    sm_scalar_elems_per_us=18e3,
    epilogue_bytes_per_us=45e3,
    program_us=0.5,
    l2_bytes_per_us=6e6,
    dram_share=0.85,
    overlap_norm=4,
    sm_epilogue_dram_bytes_per_us=100e3,
    split_bytes_per_us=5e6,
    split_launch_us=2.5,
    base_us=1.0,
)
