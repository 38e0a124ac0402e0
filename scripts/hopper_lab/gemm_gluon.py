"""Gluon (triton.experimental.gluon, Triton >= 3.5) Hopper GEMM for the lab: the explicit path.

gl_persistent: a persistent kernel that owns its pipeline: a ring of NUM_BUFFERS shared-memory stages
filled by TMA (mbarrier completion), async wgmma with one group in flight, and the load stream running
NUM_BUFFERS - 2 stages ahead *across tiles* (the next tile's first K slices load during this tile's
last MMAs and its epilogue); the epilogue (scale, bias, GELU in the wgmma register layout) writes C
through a TMA store that overlaps the next tile's main loop. One warpgroup per 64 rows (num_warps 4
or 8), no warp specialization: Triton's Gluon tutorial 07 measured this design at cuBLAS's level on
an H100 for K >= 2048 (and ~0.92x at K = 512).

Same problem convention as gemm_kernels.py: A [M, K]; B [N, K] (B_KMAJOR) or [K, N]; C [M, N].
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)


@gluon.constexpr_function
def wgmma_layout(primitive_bits, BM, BN, num_warps):
    """The accumulator's register layout: warpgroups stacked along M (16-row atoms of 4 warps) until
    BM is covered, then along N; the widest wgmma N (<= 256, a multiple of 8) that tiles each share."""
    warps = [4, 1]
    while warps[0] * warps[1] != num_warps:
        if BM > 16 * warps[0]:
            warps[0] *= 2
        else:
            warps[1] *= 2
    n_share = max(BN // warps[1], 8)
    n = 256
    while n > n_share or BN % n != 0:
        n -= 8
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=warps, instr_shape=[16, n, 256 // primitive_bits])


@gluon.jit
def _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M: gl.constexpr):
    in_group = GROUP_M * num_pid_n
    first_m = (tile_id // in_group) * GROUP_M
    size_m = gl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile_id % in_group) % size_m
    pid_n = (tile_id % in_group) // size_m
    return pid_m, pid_n


@gluon.jit
def _issue_load(
    p,
    total,
    k_tiles,
    start,
    step,
    num_pid_m,
    num_pid_n,
    a_desc,
    b_desc,
    bars,
    a_bufs,
    b_bufs,
    BM: gl.constexpr,
    BN: gl.constexpr,
    BK: gl.constexpr,
    GROUP_M: gl.constexpr,
    NUM_BUFFERS: gl.constexpr,
    B_KMAJOR: gl.constexpr,
):
    """Load item p of this program's stream of (tile, k) slices into stage p % NUM_BUFFERS."""
    pred = p < total
    q = gl.minimum(p, total - 1)  # (items past the end are predicated off; keep their coordinates valid)
    t = q // k_tiles
    kk = (q % k_tiles) * BK
    pid_m, pid_n = _tile_coords(start + t * step, num_pid_m, num_pid_n, GROUP_M)
    s = p % NUM_BUFFERS
    bar = bars.index(s)
    mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(a_desc, [pid_m * BM, kk], bar, a_bufs.index(s), pred)
    if B_KMAJOR:
        tma.async_copy_global_to_shared(b_desc, [pid_n * BN, kk], bar, b_bufs.index(s), pred)
    else:
        tma.async_copy_global_to_shared(b_desc, [kk, pid_n * BN], bar, b_bufs.index(s), pred)
    return p + 1


@gluon.jit
def _epilogue(
    out,
    bias_ptr,
    sa_ptr,
    sb_ptr,
    pid_n,
    N,
    BN: gl.constexpr,
    acc_layout: gl.constexpr,
    HAS_BIAS: gl.constexpr,
    ACT: gl.constexpr,
    SCALED: gl.constexpr,
):
    """The fp32 tile in the wgmma layout: scale, + bias[n], GELU (1: erf, 2: tanh form)."""
    if SCALED:
        out = out * (gl.load(sa_ptr) * gl.load(sb_ptr))
    if HAS_BIAS:
        offs_n = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, acc_layout))
        bias = gl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(gl.float32)
        out = out + gl.expand_dims(bias, 0)
    if ACT == 1:
        out = 0.5 * out * (1.0 + gl.erf(out * 0.7071067811865476))
    elif ACT == 2:
        y2 = 1.5957691216057308 * (out + 0.044715 * out * out * out)
        out = out / (1.0 + gl.exp(-y2))
    return out


@gluon.jit
def gl_persistent(
    a_desc,
    b_desc,
    c_desc,
    bias_ptr,
    sa_ptr,
    sb_ptr,
    M,
    N,
    K,
    GROUP_M: gl.constexpr,
    NUM_BUFFERS: gl.constexpr,
    B_KMAJOR: gl.constexpr,
    HAS_BIAS: gl.constexpr,
    ACT: gl.constexpr,
    SCALED: gl.constexpr,
    num_warps: gl.constexpr,
):
    BM: gl.constexpr = c_desc.block_type.shape[0]
    BN: gl.constexpr = c_desc.block_type.shape[1]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    dtype: gl.constexpr = a_desc.dtype
    out_dtype: gl.constexpr = c_desc.dtype
    gl.static_assert(NUM_BUFFERS >= 3, "a stage is refilled two MMAs after it was read: 3 stages at least")
    acc_layout: gl.constexpr = wgmma_layout(dtype.primitive_bitwidth, BM, BN, num_warps)

    a_bufs = gl.allocate_shared_memory(dtype, [NUM_BUFFERS] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(dtype, [NUM_BUFFERS] + b_desc.block_type.shape, b_desc.layout)
    c_smem = gl.allocate_shared_memory(out_dtype, c_desc.block_type.shape, c_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [NUM_BUFFERS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_BUFFERS):
        mbarrier.init(bars.index(i), count=1)

    start = gl.program_id(axis=0)
    step = gl.num_programs(axis=0)
    num_pid_m = gl.cdiv(M, BM)
    num_pid_n = gl.cdiv(N, BN)
    k_tiles = gl.cdiv(K, BK)
    my_tiles = gl.cdiv(num_pid_m * num_pid_n - start, step)
    total = my_tiles * k_tiles
    p = 0  # next (tile, k) item to load
    c = 0  # next item to multiply
    for _ in gl.static_range(NUM_BUFFERS - 2):
        p = _issue_load(
            p,
            total,
            k_tiles,
            start,
            step,
            num_pid_m,
            num_pid_n,
            a_desc,
            b_desc,
            bars,
            a_bufs,
            b_bufs,
            BM,
            BN,
            BK,
            GROUP_M,
            NUM_BUFFERS,
            B_KMAJOR,
        )
    acc = gl.zeros((BM, BN), dtype=gl.float32, layout=acc_layout)
    for t in range(my_tiles):
        for ki in range(k_tiles):
            # the load goes to the stage item c - 2 read; that MMA finished (the wait below, last
            # iteration, left only item c - 1's in flight)
            p = _issue_load(
                p,
                total,
                k_tiles,
                start,
                step,
                num_pid_m,
                num_pid_n,
                a_desc,
                b_desc,
                bars,
                a_bufs,
                b_bufs,
                BM,
                BN,
                BK,
                GROUP_M,
                NUM_BUFFERS,
                B_KMAJOR,
            )
            s = c % NUM_BUFFERS
            mbarrier.wait(bars.index(s), (c // NUM_BUFFERS) & 1)
            if B_KMAJOR:
                b = b_bufs.index(s).permute((1, 0))
            else:
                b = b_bufs.index(s)
            tok = warpgroup_mma(a_bufs.index(s), b, acc, use_acc=ki > 0, is_async=True)
            acc = warpgroup_mma_wait(1, (tok,))  # item c - 1's MMA is done, item c's runs on
            c += 1
        out = warpgroup_mma_wait(0, (acc,))
        pid_m, pid_n = _tile_coords(start + t * step, num_pid_m, num_pid_n, GROUP_M)
        out = _epilogue(out, bias_ptr, sa_ptr, sb_ptr, pid_n, N, BN, acc_layout, HAS_BIAS, ACT, SCALED)
        tma.store_wait(pendings=0)  # the previous tile's store has left c_smem
        c_smem.store(out.to(out_dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(c_desc, [pid_m * BM, pid_n * BN], c_smem)
    tma.store_wait(pendings=0)
    for i in gl.static_range(NUM_BUFFERS):
        mbarrier.invalidate(bars.index(i))


GL_DTYPE = {"bf16": gl.bfloat16, "fp16": gl.float16, "fp8": gl.float8e4nv}


def descriptors(a, b, c, M: int, N: int, K: int, cfg: dict, b_kmajor: bool, in_dtype: str, out_dtype: str):
    """Host-side Gluon tensor descriptors (with their shared-memory layouts) of A, B and C."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    BM, BN, BK = cfg["BM"], cfg["BN"], cfg["BK"]
    dt, odt = GL_DTYPE[in_dtype], GL_DTYPE[out_dtype]
    a_blk = [BM, BK]
    b_blk = [BN, BK] if b_kmajor else [BK, BN]
    da = TensorDescriptor(a, [M, K], [K, 1], a_blk, gl.NVMMASharedLayout.get_default_for(a_blk, dt))
    db = TensorDescriptor(
        b,
        [N, K] if b_kmajor else [K, N],
        [K, 1] if b_kmajor else [N, 1],
        b_blk,
        gl.NVMMASharedLayout.get_default_for(b_blk, dt),
    )
    dc = TensorDescriptor(c, [M, N], [N, 1], [BM, BN], gl.NVMMASharedLayout.get_default_for([BM, BN], odt))
    return da, db, dc


# --------------------------------------------------------------------------------------------
# warp-specialized: a 1-warp TMA loader partition and the default partition's warpgroups doing
# wgmma + the epilogue (FA3 / CUTLASS "cooperative" split, written out in Gluon)
# --------------------------------------------------------------------------------------------
@gluon.jit
def _ws_loader(
    a_desc,
    b_desc,
    ready,
    empty,
    a_bufs,
    b_bufs,
    M,
    N,
    K,
    BN: gl.constexpr,
    GROUP_M: gl.constexpr,
    NUM_BUFFERS: gl.constexpr,
    B_KMAJOR: gl.constexpr,
):
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    start = gl.program_id(axis=0)
    step = gl.num_programs(axis=0)
    num_pid_m = gl.cdiv(M, BM)
    num_pid_n = gl.cdiv(N, BN)
    k_tiles = gl.cdiv(K, BK)
    my_tiles = gl.cdiv(num_pid_m * num_pid_n - start, step)
    p = 0
    for t in range(my_tiles):
        pid_m, pid_n = _tile_coords(start + t * step, num_pid_m, num_pid_n, GROUP_M)
        for ki in range(k_tiles):
            s = p % NUM_BUFFERS
            # a stage is free once the consumers arrived on its empty barrier (barriers start with
            # phase 1 complete: the first round does not wait)
            mbarrier.wait(empty.index(s), ((p // NUM_BUFFERS) & 1) ^ 1)
            bar = ready.index(s)
            mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(a_desc, [pid_m * BM, ki * BK], bar, a_bufs.index(s))
            if B_KMAJOR:
                tma.async_copy_global_to_shared(b_desc, [pid_n * BN, ki * BK], bar, b_bufs.index(s))
            else:
                tma.async_copy_global_to_shared(b_desc, [ki * BK, pid_n * BN], bar, b_bufs.index(s))
            p += 1


@gluon.jit
def _ws_consumer(
    a_desc,
    c_desc,
    bias_ptr,
    sa_ptr,
    sb_ptr,
    ready,
    empty,
    a_bufs,
    b_bufs,
    c_smem,
    M,
    N,
    K,
    GROUP_M: gl.constexpr,
    NUM_BUFFERS: gl.constexpr,
    B_KMAJOR: gl.constexpr,
    HAS_BIAS: gl.constexpr,
    ACT: gl.constexpr,
    SCALED: gl.constexpr,
    num_warps: gl.constexpr,
):
    BM: gl.constexpr = c_desc.block_type.shape[0]
    BN: gl.constexpr = c_desc.block_type.shape[1]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    dtype: gl.constexpr = a_desc.dtype
    out_dtype: gl.constexpr = c_desc.dtype
    acc_layout: gl.constexpr = wgmma_layout(dtype.primitive_bitwidth, BM, BN, num_warps)
    start = gl.program_id(axis=0)
    step = gl.num_programs(axis=0)
    num_pid_m = gl.cdiv(M, BM)
    num_pid_n = gl.cdiv(N, BN)
    k_tiles = gl.cdiv(K, BK)
    my_tiles = gl.cdiv(num_pid_m * num_pid_n - start, step)
    c = 0
    acc = gl.zeros((BM, BN), dtype=gl.float32, layout=acc_layout)
    for t in range(my_tiles):
        for ki in range(k_tiles):
            s = c % NUM_BUFFERS
            mbarrier.wait(ready.index(s), (c // NUM_BUFFERS) & 1)
            if B_KMAJOR:
                b = b_bufs.index(s).permute((1, 0))
            else:
                b = b_bufs.index(s)
            tok = warpgroup_mma(a_bufs.index(s), b, acc, use_acc=ki > 0, is_async=True)
            acc = warpgroup_mma_wait(1, (tok,))
            # item c - 1's MMA is done in every warpgroup (the barrier), so its stage goes back to
            # the loader; the tile's first item has no predecessor in this tile (the last tile's
            # final stage was released after its wait(0))
            gl.thread_barrier()
            mbarrier.arrive(empty.index((c + NUM_BUFFERS - 1) % NUM_BUFFERS), pred=ki > 0)
            c += 1
        out = warpgroup_mma_wait(0, (acc,))
        gl.thread_barrier()
        mbarrier.arrive(empty.index((c + NUM_BUFFERS - 1) % NUM_BUFFERS))
        pid_m, pid_n = _tile_coords(start + t * step, num_pid_m, num_pid_n, GROUP_M)
        out = _epilogue(out, bias_ptr, sa_ptr, sb_ptr, pid_n, N, BN, acc_layout, HAS_BIAS, ACT, SCALED)
        tma.store_wait(pendings=0)  # the previous tile's store has left c_smem
        c_smem.store(out.to(out_dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(c_desc, [pid_m * BM, pid_n * BN], c_smem)
    tma.store_wait(pendings=0)


@gluon.jit
def gl_ws(
    a_desc,
    b_desc,
    c_desc,
    bias_ptr,
    sa_ptr,
    sb_ptr,
    M,
    N,
    K,
    GROUP_M: gl.constexpr,
    NUM_BUFFERS: gl.constexpr,
    B_KMAJOR: gl.constexpr,
    HAS_BIAS: gl.constexpr,
    ACT: gl.constexpr,
    SCALED: gl.constexpr,
    num_warps: gl.constexpr,
):
    """Persistent, warp-specialized: the loader runs NUM_BUFFERS stages ahead across tiles while the
    consumers multiply; the consumers' epilogue TMA store overlaps the next tile's main loop."""
    BN: gl.constexpr = c_desc.block_type.shape[1]
    dtype: gl.constexpr = a_desc.dtype
    a_bufs = gl.allocate_shared_memory(dtype, [NUM_BUFFERS] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(dtype, [NUM_BUFFERS] + b_desc.block_type.shape, b_desc.layout)
    c_smem = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_type.shape, c_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [NUM_BUFFERS, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_BUFFERS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_BUFFERS):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    gl.warp_specialize(
        [
            (
                _ws_consumer,
                (
                    a_desc,
                    c_desc,
                    bias_ptr,
                    sa_ptr,
                    sb_ptr,
                    ready,
                    empty,
                    a_bufs,
                    b_bufs,
                    c_smem,
                    M,
                    N,
                    K,
                    GROUP_M,
                    NUM_BUFFERS,
                    B_KMAJOR,
                    HAS_BIAS,
                    ACT,
                    SCALED,
                    num_warps,
                ),
            ),
            (_ws_loader, (a_desc, b_desc, ready, empty, a_bufs, b_bufs, M, N, K, BN, GROUP_M, NUM_BUFFERS, B_KMAJOR)),
        ],
        [1],
        [24],
    )
