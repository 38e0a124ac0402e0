"""Knob candidates of the attention kernels, the heuristic's choice first.

On the GPU the choice depends on the head dim (the register budget: a [BLOCK_M, D] fp32 accumulator
per program forward, two [BLOCK_N1, D] ones in the dK/dV kernel) and follows what Triton's
fused-attention tutorial and FlexAttention found on Hopper: 128-query tiles with 64- or 128-key
steps forward (8 warps for D >= 128), 2-3 pipeline stages; backward 128 keys per dK/dV program
stepping 32-64 query rows, 128 queries per dQ program stepping 32-64 keys. Under the interpreter,
16-row tiles, so small test shapes still cross several tiles, diagonals and ragged ends.
"""

from __future__ import annotations

from .spec import BwdKnobs, FwdKnobs


def _pow2_dim(d: int) -> int:
    p = 16
    while p < d:
        p *= 2
    return p


def fwd_candidates(d: int, *, cuda: bool, dv: int | None = None) -> list[FwdKnobs]:
    if not cuda:
        return [FwdKnobs(16, 16, 4, 1), FwdKnobs(32, 16, 4, 1)]
    width = max(_pow2_dim(d), _pow2_dim(dv or d))
    if width <= 64:
        c = [FwdKnobs(128, 64, 4, 3), FwdKnobs(128, 128, 8, 3), FwdKnobs(128, 64, 4, 4), FwdKnobs(64, 64, 4, 3),
             FwdKnobs(128, 32, 4, 3)]
    elif width <= 128:
        # H100, bf16 B=4 H=16 (2026-11-25): 128x128/w8s3 best at 4k-16k (495-545 TFLOP/s), 128x64/w8s3
        # within 3% (best at 1k causal); 2 stages lost 10-25%, TMA reads 5-10%
        c = [FwdKnobs(128, 128, 8, 3), FwdKnobs(128, 64, 8, 3), FwdKnobs(128, 64, 8, 4), FwdKnobs(64, 64, 4, 3),
             FwdKnobs(128, 64, 4, 3), FwdKnobs(128, 32, 4, 3)]
    else:
        c = [FwdKnobs(128, 64, 8, 2), FwdKnobs(64, 64, 4, 2), FwdKnobs(128, 32, 8, 2), FwdKnobs(64, 32, 4, 3)]
    return c


def bwd_candidates(d: int, *, cuda: bool, dv: int | None = None) -> list[BwdKnobs]:
    if not cuda:
        return [BwdKnobs(16, 32, 32, 16, 4, 1, 4, 1, 16), BwdKnobs(16, 16, 16, 16, 4, 1, 4, 1, 16)]
    width = max(_pow2_dim(d), _pow2_dim(dv or d))
    if width <= 64:
        c = [BwdKnobs(64, 128, 128, 64, 8, 3, 8, 3), BwdKnobs(32, 128, 128, 32, 4, 4, 4, 4),
             BwdKnobs(64, 64, 64, 64, 4, 3, 4, 3)]
    elif width <= 128:
        c = [BwdKnobs(64, 128, 128, 64, 8, 2, 8, 2), BwdKnobs(32, 128, 128, 32, 4, 3, 4, 3),
             BwdKnobs(64, 64, 64, 64, 4, 2, 4, 2), BwdKnobs(32, 64, 64, 32, 4, 3, 4, 3)]
    else:
        c = [BwdKnobs(32, 64, 64, 32, 4, 2, 4, 2), BwdKnobs(64, 64, 64, 64, 8, 1, 8, 1),
             BwdKnobs(16, 64, 64, 16, 4, 2, 4, 2)]
    return c
