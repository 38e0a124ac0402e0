"""Gluon (triton.experimental.gluon, Triton >= 3.5) warp-specialised attention forward for Hopper: the
FlashAttention-3 split written out, where Triton 3.6's `tl.range(warp_specialize=True)` hangs on an
H200 (bench/results/constants.md, "Warp-specialised attention") but Gluon's explicit partitions ran the
lab's GEMM at cuBLAS's level (2026-11-29-h200-hopper-lab-gemm.md, gluon_ws).

One program per (2 x BLOCK_M query rows, batch x head), three partitions:
- a 1-warp loader: Q's two row blocks once, then K and V blocks through a ring of STAGES shared-memory
  slots by TMA (mbarriers: `ready` when a slot's bytes landed, `empty` when both consumers are done);
- two consumer warpgroups (the default partition and a worker), BLOCK_M rows each: S = Q K^T by async
  wgmma from shared memory, the online softmax in exp2 in the wgmma accumulator's registers, O += P V
  with P as the register operand; they run independently, so one's softmax overlaps the other's MMAs
  (FA3's ping-pong without explicit scheduling barriers).
The causal case loads the key blocks up to the tile's last row and masks in every block (a first version:
FA3 splits off the unmasked blocks). O leaves through Q's shared memory (each consumer's own slot, Q is
no longer read) by a TMA store; the statistics (row log-sum-exp, base 2) by plain stores.

Layout: q, k, v, o contiguous [B, H, S, D] (bf16 or fp16), S a multiple of 2 x BLOCK_M and of BLOCK_N,
D 64 or 128. Not used by the library: attn_sweep.py checks it against cuDNN and times it beside the
Triton kernels (`--variants gluon_ws`); compile it for sm_90 without a GPU with `--compile-check`.
"""

from __future__ import annotations

import math

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

LOG2E = 1.4426950408889634
CONSUMERS = 2
CONFIGS = [  # (BLOCK_M a consumer, BLOCK_N, STAGES): shared memory 2*BM*D + 2*STAGES*BN*D elements
    dict(BM=64, BN=128, STAGES=2),
    dict(BM=64, BN=128, STAGES=3),
    dict(BM=64, BN=64, STAGES=3),
    dict(BM=64, BN=64, STAGES=4),
]


@gluon.constexpr_function
def _mma_layout(bits, BM, N, num_warps):
    """A warpgroup's wgmma accumulator layout: its 4 warps stacked along the rows, N columns an instruction."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, N, 256 // bits])


@gluon.jit
def _loader(
    desc_q,
    desc_k,
    desc_v,
    ring,
    row_q,
    row_kv,
    n_blocks,
    BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr,
):
    BM: gl.constexpr = desc_q.block_type.shape[0]
    q_smem, k_bufs, v_bufs, q_bar, ready, empty = ring
    mbarrier.expect(q_bar, 2 * desc_q.block_type.nbytes)
    tma.async_copy_global_to_shared(desc_q, [row_q, 0], q_bar, q_smem.index(0))
    tma.async_copy_global_to_shared(desc_q, [row_q + BM, 0], q_bar, q_smem.index(1))
    for j in range(n_blocks):
        s = j % STAGES
        # a slot is free once both consumers arrived on its `empty` barrier (the first round passes:
        # a fresh barrier's previous phase counts as complete)
        mbarrier.wait(empty.index(s), ((j // STAGES) & 1) ^ 1)
        bar = ready.index(s)
        mbarrier.expect(bar, desc_k.block_type.nbytes + desc_v.block_type.nbytes)
        tma.async_copy_global_to_shared(desc_k, [row_kv + j * BLOCK_N, 0], bar, k_bufs.index(s))
        tma.async_copy_global_to_shared(desc_v, [row_kv + j * BLOCK_N, 0], bar, v_bufs.index(s))


@gluon.jit
def _consumer(
    desc_o,
    lse_ptr,
    ring,
    row_q,
    q_pos,
    n_blocks,
    qk_scale,
    CID: gl.constexpr,
    CAUSAL: gl.constexpr,
    BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr,
    num_warps: gl.constexpr,
):
    BM: gl.constexpr = desc_o.block_type.shape[0]
    D: gl.constexpr = desc_o.block_type.shape[1]
    dtype: gl.constexpr = desc_o.dtype
    qk_layout: gl.constexpr = _mma_layout(dtype.primitive_bitwidth, BM, BLOCK_N, num_warps)
    o_layout: gl.constexpr = _mma_layout(dtype.primitive_bitwidth, BM, D, num_warps)
    p_layout: gl.constexpr = gl.DotOperandLayout(
        operand_index=0, parent=o_layout, k_width=32 // dtype.primitive_bitwidth
    )
    rows_qk: gl.constexpr = gl.SliceLayout(1, qk_layout)
    cols_qk: gl.constexpr = gl.SliceLayout(0, qk_layout)
    rows_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    q_smem, k_bufs, v_bufs, q_bar, ready, empty = ring

    m_i = gl.full([BM], float("-inf"), gl.float32, layout=rows_qk)
    l_i = gl.full([BM], 0.0, gl.float32, layout=rows_qk)
    acc = gl.zeros([BM, D], gl.float32, layout=o_layout)
    rows = q_pos + CID * BM + gl.arange(0, BM, layout=rows_qk)  # the query positions of this warpgroup
    q = q_smem.index(CID)
    mbarrier.wait(q_bar, 0)
    for j in range(n_blocks):
        s = j % STAGES
        mbarrier.wait(ready.index(s), (j // STAGES) & 1)
        qk = gl.zeros([BM, BLOCK_N], gl.float32, layout=qk_layout)
        qk = warpgroup_mma(q, k_bufs.index(s).permute((1, 0)), qk, use_acc=False, is_async=True)
        qk = warpgroup_mma_wait(num_outstanding=0, deps=(qk,))
        qk = qk * qk_scale
        if CAUSAL:
            cols = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=cols_qk)
            qk = gl.where(cols[None, :] <= rows[:, None], qk, float("-inf"))
        # (block 0 holds key 0, which every row sees: m_ij is finite from the first block on)
        m_ij = gl.maximum(m_i, gl.max(qk, axis=1))
        p = gl.exp2(qk - m_ij[:, None])
        alpha = gl.exp2(m_i - m_ij)
        l_i = l_i * alpha + gl.sum(p, axis=1)
        acc = acc * gl.convert_layout(alpha, rows_o)[:, None]
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        acc = warpgroup_mma(p_op, v_bufs.index(s), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        gl.thread_barrier()  # every warp of the group is past its MMAs on slot s
        mbarrier.arrive(empty.index(s), count=1)
        m_i = m_ij
    acc = acc / gl.convert_layout(l_i, rows_o)[:, None]
    q.store(acc.to(dtype))  # O through Q's slot: this group alone reads it, and no longer
    fence_async_shared()
    tma.async_copy_shared_to_global(desc_o, [row_q + CID * BM, 0], q)
    gl.store(lse_ptr + row_q + CID * BM + gl.arange(0, BM, layout=rows_qk), m_i + gl.log2(l_i))
    tma.store_wait(pendings=0)


@gluon.jit
def gl_attn_fwd(
    desc_q,
    desc_k,
    desc_v,
    desc_o,
    lse_ptr,
    S,
    qk_scale,
    CAUSAL: gl.constexpr,
    BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr,
    num_warps: gl.constexpr,
):
    BM: gl.constexpr = desc_q.block_type.shape[0]
    dtype: gl.constexpr = desc_q.dtype
    q_pos = gl.program_id(0) * (2 * BM)
    row_kv = gl.program_id(1) * S
    row_q = row_kv + q_pos
    hi = S
    if CAUSAL:
        hi = q_pos + 2 * BM
    n_blocks = gl.cdiv(hi, BLOCK_N)
    q_smem = gl.allocate_shared_memory(dtype, [2] + desc_q.block_type.shape, desc_q.layout)
    k_bufs = gl.allocate_shared_memory(dtype, [STAGES] + desc_k.block_type.shape, desc_k.layout)
    v_bufs = gl.allocate_shared_memory(dtype, [STAGES] + desc_v.block_type.shape, desc_v.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)  # (both consumers)
    ring = (q_smem, k_bufs, v_bufs, q_bar, ready, empty)  # the shared memory and barriers all partitions use
    gl.warp_specialize(
        [
            (
                _consumer,
                (desc_o, lse_ptr, ring, row_q, q_pos, n_blocks, qk_scale, 0, CAUSAL, BLOCK_N, STAGES, num_warps),
            ),
            (
                _consumer,
                (desc_o, lse_ptr, ring, row_q, q_pos, n_blocks, qk_scale, 1, CAUSAL, BLOCK_N, STAGES, num_warps),
            ),
            (_loader, (desc_q, desc_k, desc_v, ring, row_q, row_kv, n_blocks, BLOCK_N, STAGES)),
        ],
        [num_warps, 1],
        [232, 24],
    )


def descriptors(q2, k2, v2, o2, BM: int, BN: int, D: int, gl_dtype):
    """Host-side descriptors of the [B*H*S, D] views (block shapes and shared-memory layouts)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    def desc(t, block):
        return TensorDescriptor(t, list(t.shape), [D, 1], block, gl.NVMMASharedLayout.get_default_for(block, gl_dtype))

    return desc(q2, [BM, D]), desc(k2, [BN, D]), desc(v2, [BN, D]), desc(o2, [BM, D])


def attention(q, k, v, causal: bool, cfg: dict, sm_scale: float | None = None):
    """O and the base-2 row log-sum-exp [B, H, S] of softmax(q k^T * sm_scale) v (contiguous BHSD)."""
    import torch

    B, H, S, D = q.shape
    BM, BN, stages = cfg["BM"], cfg["BN"], cfg["STAGES"]
    if S % (CONSUMERS * BM) or S % BN or D not in (64, 128) or q.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"attn_gluon: S {S} must be a multiple of {CONSUMERS * BM} and {BN}, D 64 or 128, fp16/bf16")
    gl_dtype = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
    o = torch.empty_like(q)
    lse = torch.empty(B * H * S, device=q.device, dtype=torch.float32)
    flat = [t.reshape(B * H * S, D) for t in (q, k, v, o)]
    dq, dk, dv, do = descriptors(*flat, BM, BN, D, gl_dtype)
    scale = (sm_scale if sm_scale is not None else 1 / math.sqrt(D)) * LOG2E
    grid = (S // (CONSUMERS * BM), B * H)
    gl_attn_fwd[grid](dq, dk, dv, do, lse, S, scale, CAUSAL=causal, BLOCK_N=BN, STAGES=stages, num_warps=4)
    return o, lse.reshape(B, H, S)


def compile_check() -> list[dict]:
    """Compile every config (causal and not, bf16, D 128) for sm_90 without a GPU: registers, spills and
    shared memory from ptxas (compile_check.py's stand-in driver and analysis)."""
    import os

    import torch
    from compile_check import _fake_driver, analyze

    os.environ.pop("TRITON_INTERPRET", None)
    _fake_driver()
    out = []
    S, D = 1024, 128
    for cfg in CONFIGS:
        for causal in (False, True):
            t = [torch.empty(S, D, dtype=torch.bfloat16) for _ in range(4)]
            dq, dk, dv, do = descriptors(*t, cfg["BM"], cfg["BN"], D, gl.bfloat16)
            lse = torch.empty(S)
            row = dict(cfg, causal=causal)
            try:
                ck = gl_attn_fwd.warmup(
                    dq,
                    dk,
                    dv,
                    do,
                    lse,
                    S,
                    0.1,
                    CAUSAL=causal,
                    BLOCK_N=cfg["BN"],
                    STAGES=cfg["STAGES"],
                    num_warps=4,
                    grid=(S // (CONSUMERS * cfg["BM"]), 1),
                )
                row.update(ok=True, **analyze(ck))
            except Exception as e:  # noqa: BLE001 - every compiler error is a finding
                text = str(e).strip()
                row.update(ok=False, error=f"{type(e).__name__}: {text[-600:]}")
            print(row, flush=True)
            out.append(row)
    return out


if __name__ == "__main__":
    import sys

    if "--compile-check" in sys.argv:
        compile_check()
