"""Standalone Triton GEMM kernels for the Hopper lab (no opgraph import, no torch import).

C[M, N] = epilogue(A[M, K] @ B) with B either [K, N] row-major ("kn") or [N, K] row-major ("nk": an
nn.Linear weight, K contiguous; fp8 needs it). The epilogue is an optional per-tensor scale (fp8),
an optional bias over N and an optional GELU (erf or tanh form), then the cast to C's type.

Kernels (each written for Triton 3.6, the GPU image's, and checked to compile with it for sm_90):
  gemm_plain       one tile per program, pointer loads with masks (what opgraph generates today)
  gemm_tma         one tile per program, TMA loads/stores through tensor descriptors, host-side
                   (triton.tools.tensor_descriptor.TensorDescriptor) or device-side (tl.make_tensor_descriptor)
  gemm_persistent  NUM_SMS programs loop over grouped tiles; TMA descriptors (host or device side) or
                   pointer loads; knobs WS (tl.range warp_specialize), FLATTEN (tl.range flatten),
                   SUBTILE (epilogue on two column halves), C_TMA (TMA store of C, else pointer store)

VARIANTS maps a variant name to its kernel, fixed knobs and config space; the sweep, the selftest
and the compile check all enumerate it.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import triton
import triton.language as tl

SMEM_LIMIT = 232448  # bytes of shared memory a Hopper block can take (227 KB)
# Triton's interpreter multiplies bf16 tiles wrongly (numpy has no bf16): under it, and only there,
# bf16 products are taken in fp32 (exact for bf16 inputs)
_INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


# --------------------------------------------------------------------------------------------
# shared device functions
# --------------------------------------------------------------------------------------------
@triton.jit
def _grouped(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """Tile id -> (pid_m, pid_n), GROUP_M row tiles at a time (L2 reuse of B's column tiles)."""
    in_group = GROUP_M * num_pid_n
    first_m = (tile_id // in_group) * GROUP_M
    size_m = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile_id % in_group) % size_m
    pid_n = (tile_id % in_group) // size_m
    return pid_m, pid_n


@triton.jit
def _epilogue(acc, bias_ptr, offs_n, N, scale, HAS_BIAS: tl.constexpr, ACT: tl.constexpr, SCALED: tl.constexpr):
    """fp32 tile -> scale, + bias[n], GELU (ACT 1: erf, 2: tanh form as cuBLASLt's GELU_BIAS)."""
    if SCALED:
        acc = acc * scale
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)
        acc = acc + bias[None, :]
    if ACT == 1:
        acc = 0.5 * acc * (1.0 + tl.math.erf(acc * 0.7071067811865476))
    elif ACT == 2:
        # 0.5 x (1 + tanh(y)) = x * sigmoid(2y), y = sqrt(2/pi) (x + 0.044715 x^3)
        y2 = 1.5957691216057308 * (acc + 0.044715 * acc * acc * acc)
        acc = acc / (1.0 + tl.exp(-y2))
    return acc


@triton.jit
def _scale(sa_ptr, sb_ptr, SCALED: tl.constexpr):
    if SCALED:
        return tl.load(sa_ptr) * tl.load(sb_ptr)
    else:
        return 1.0


@triton.jit
def _dot(a, b, acc, FP8_PROMOTE: tl.constexpr):
    # FP8_PROMOTE > 0: fp8 products are added into the fp32 accumulator every FP8_PROMOTE K elements
    # (Triton 3.6's sm_90 default is never: wgmma's own reduced-precision accumulation, "fast accum")
    if _INTERPRETED:
        if a.dtype == tl.bfloat16:
            return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    if FP8_PROMOTE > 0:
        return tl.dot(a, b, acc, max_num_imprecise_acc=FP8_PROMOTE)
    else:
        return tl.dot(a, b, acc)


# --------------------------------------------------------------------------------------------
# (a) one tile per program, pointer loads
# --------------------------------------------------------------------------------------------
@triton.jit
def gemm_plain(
    a_ptr,
    b_ptr,
    c_ptr,
    bias_ptr,
    sa_ptr,
    sb_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    GROUP_M: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    SCALED: tl.constexpr,
    FP8_PROMOTE: tl.constexpr,
):
    num_pid_m = tl.cdiv(M, BM)
    num_pid_n = tl.cdiv(N, BN)
    pid_m, pid_n = _grouped(tl.program_id(0), num_pid_m, num_pid_n, GROUP_M)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    rm = tl.max_contiguous(tl.multiple_of(offs_m % M, BM), BM)  # wrapped: no row/col masks on loads
    rn = tl.max_contiguous(tl.multiple_of(offs_n % N, BN), BN)
    rk = tl.arange(0, BK)
    a_ptrs = a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak
    b_ptrs = b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        a = tl.load(a_ptrs, mask=rk[None, :] < K - k * BK, other=0.0)
        b = tl.load(b_ptrs, mask=rk[:, None] < K - k * BK, other=0.0)
        acc = _dot(a, b, acc, FP8_PROMOTE)
        a_ptrs += BK * stride_ak
        b_ptrs += BK * stride_bk
    acc = _epilogue(acc, bias_ptr, offs_n, N, _scale(sa_ptr, sb_ptr, SCALED), HAS_BIAS, ACT, SCALED)
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


# --------------------------------------------------------------------------------------------
# (b) one tile per program, TMA descriptors (host- or device-side)
# --------------------------------------------------------------------------------------------
@triton.jit
def _descriptors(
    a,
    b,
    c,
    M,
    N,
    K,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    C_BN: tl.constexpr,
    B_KMAJOR: tl.constexpr,
    DEV_DESC: tl.constexpr,
):
    """a, b, c are pointers (DEV_DESC: descriptors made here, in the kernel) or host descriptors."""
    if DEV_DESC:
        a_desc = tl.make_tensor_descriptor(a, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
        if B_KMAJOR:
            b_desc = tl.make_tensor_descriptor(b, shape=[N, K], strides=[K, 1], block_shape=[BN, BK])
        else:
            b_desc = tl.make_tensor_descriptor(b, shape=[K, N], strides=[N, 1], block_shape=[BK, BN])
        c_desc = tl.make_tensor_descriptor(c, shape=[M, N], strides=[N, 1], block_shape=[BM, C_BN])
    else:
        a_desc = a
        b_desc = b
        c_desc = c
    return a_desc, b_desc, c_desc


@triton.jit
def _tma_mainloop(
    a_desc,
    b_desc,
    off_m,
    off_n,
    k_tiles,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    B_KMAJOR: tl.constexpr,
    FP8_PROMOTE: tl.constexpr,
    WS: tl.constexpr,
):
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for ki in tl.range(k_tiles, warp_specialize=WS):
        a = a_desc.load([off_m, ki * BK])
        if B_KMAJOR:
            b = b_desc.load([off_n, ki * BK]).T
        else:
            b = b_desc.load([ki * BK, off_n])
        acc = _dot(a, b, acc, FP8_PROMOTE)
    return acc


# --------------------------------------------------------------------------------------------
# (c)-(f) persistent, grouped tile order; TMA (host/device descriptors) or pointer loads
# --------------------------------------------------------------------------------------------
@triton.jit
def _store_tile(
    c_desc,
    c_ptr,
    acc,
    bias_ptr,
    off_m,
    off_n,
    M,
    N,
    scale,
    BM: tl.constexpr,
    BN: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    SCALED: tl.constexpr,
    C_TMA: tl.constexpr,
):
    offs_n = off_n + tl.arange(0, BN)
    out = _epilogue(acc, bias_ptr, offs_n, N, scale, HAS_BIAS, ACT, SCALED).to(c_ptr.dtype.element_ty)
    if C_TMA:
        c_desc.store([off_m, off_n], out)
    else:
        offs_m = off_m + tl.arange(0, BM)
        tl.store(c_ptr + offs_m[:, None] * N + offs_n[None, :], out, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def gemm_tma(
    a,
    b,
    c,
    c_ptr,
    bias_ptr,
    sa_ptr,
    sb_ptr,
    M,
    N,
    K,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    GROUP_M: tl.constexpr,
    B_KMAJOR: tl.constexpr,
    DEV_DESC: tl.constexpr,
    WS: tl.constexpr,
    C_TMA: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    SCALED: tl.constexpr,
    FP8_PROMOTE: tl.constexpr,
):
    a_desc, b_desc, c_desc = _descriptors(a, b, c, M, N, K, BM, BN, BK, BN, B_KMAJOR, DEV_DESC)
    num_pid_m = tl.cdiv(M, BM)
    num_pid_n = tl.cdiv(N, BN)
    pid_m, pid_n = _grouped(tl.program_id(0), num_pid_m, num_pid_n, GROUP_M)
    off_m = pid_m * BM
    off_n = pid_n * BN
    acc = _tma_mainloop(a_desc, b_desc, off_m, off_n, tl.cdiv(K, BK), BM, BN, BK, B_KMAJOR, FP8_PROMOTE, WS)
    _store_tile(
        c_desc,
        c_ptr,
        acc,
        bias_ptr,
        off_m,
        off_n,
        M,
        N,
        _scale(sa_ptr, sb_ptr, SCALED),
        BM,
        BN,
        HAS_BIAS,
        ACT,
        SCALED,
        C_TMA,
    )


@triton.jit
def gemm_persistent(
    a,
    b,
    c,
    c_ptr,
    bias_ptr,
    sa_ptr,
    sb_ptr,
    M,
    N,
    K,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    GROUP_M: tl.constexpr,
    NUM_SMS: tl.constexpr,
    B_KMAJOR: tl.constexpr,
    DEV_DESC: tl.constexpr,
    WS: tl.constexpr,
    FLATTEN: tl.constexpr,
    SUBTILE: tl.constexpr,
    C_TMA: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    SCALED: tl.constexpr,
    FP8_PROMOTE: tl.constexpr,
):
    """a/b/c: host descriptors, or pointers with DEV_DESC; c_ptr: C as a pointer (C_TMA=0 stores)."""
    C_BN: tl.constexpr = BN // 2 if SUBTILE else BN
    a_desc, b_desc, c_desc = _descriptors(a, b, c, M, N, K, BM, BN, BK, C_BN, B_KMAJOR, DEV_DESC)
    start_pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BM)
    num_pid_n = tl.cdiv(N, BN)
    k_tiles = tl.cdiv(K, BK)
    num_tiles = num_pid_m * num_pid_n
    scale = _scale(sa_ptr, sb_ptr, SCALED)
    # the epilogue's tile counter is a second induction variable (as in Triton's tutorial 09: the
    # pipeliner may not use one value in both the prologue and the epilogue of a flattened loop)
    tile_id_c = start_pid - NUM_SMS
    for tile_id in tl.range(start_pid, num_tiles, NUM_SMS, flatten=FLATTEN, warp_specialize=WS):
        pid_m, pid_n = _grouped(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BM
        off_n = pid_n * BN
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for ki in range(k_tiles):
            a_t = a_desc.load([off_m, ki * BK])
            if B_KMAJOR:
                b_t = b_desc.load([off_n, ki * BK]).T
            else:
                b_t = b_desc.load([ki * BK, off_n])
            acc = _dot(a_t, b_t, acc, FP8_PROMOTE)
        tile_id_c += NUM_SMS
        pid_m, pid_n = _grouped(tile_id_c, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BM
        off_n = pid_n * BN
        if SUBTILE:
            halves = tl.permute(tl.reshape(acc, (BM, 2, BN // 2)), (0, 2, 1))
            acc0, acc1 = tl.split(halves)
            _store_tile(
                c_desc, c_ptr, acc0, bias_ptr, off_m, off_n, M, N, scale, BM, BN // 2, HAS_BIAS, ACT, SCALED, C_TMA
            )
            _store_tile(
                c_desc,
                c_ptr,
                acc1,
                bias_ptr,
                off_m,
                off_n + BN // 2,
                M,
                N,
                scale,
                BM,
                BN // 2,
                HAS_BIAS,
                ACT,
                SCALED,
                C_TMA,
            )
        else:
            _store_tile(c_desc, c_ptr, acc, bias_ptr, off_m, off_n, M, N, scale, BM, BN, HAS_BIAS, ACT, SCALED, C_TMA)


@triton.jit
def gemm_persistent_ptr(
    a_ptr,
    b_ptr,
    c_ptr,
    bias_ptr,
    sa_ptr,
    sb_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    GROUP_M: tl.constexpr,
    NUM_SMS: tl.constexpr,
    FLATTEN: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    SCALED: tl.constexpr,
    FP8_PROMOTE: tl.constexpr,
):
    """Persistent with pointer loads (opgraph's PERSISTENT without TMA; tutorial 09's
    matmul_kernel_persistent)."""
    start_pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BM)
    num_pid_n = tl.cdiv(N, BN)
    k_tiles = tl.cdiv(K, BK)
    num_tiles = num_pid_m * num_pid_n
    scale = _scale(sa_ptr, sb_ptr, SCALED)
    rk = tl.arange(0, BK)
    tile_id_c = start_pid - NUM_SMS
    for tile_id in tl.range(start_pid, num_tiles, NUM_SMS, flatten=FLATTEN):
        pid_m, pid_n = _grouped(tile_id, num_pid_m, num_pid_n, GROUP_M)
        rm = tl.max_contiguous(tl.multiple_of((pid_m * BM + tl.arange(0, BM)) % M, BM), BM)
        rn = tl.max_contiguous(tl.multiple_of((pid_n * BN + tl.arange(0, BN)) % N, BN), BN)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for ki in range(k_tiles):
            offs_k = ki * BK + rk
            a = tl.load(
                a_ptr + rm[:, None] * stride_am + offs_k[None, :] * stride_ak, mask=rk[None, :] < K - ki * BK, other=0.0
            )
            b = tl.load(
                b_ptr + offs_k[:, None] * stride_bk + rn[None, :] * stride_bn, mask=rk[:, None] < K - ki * BK, other=0.0
            )
            acc = _dot(a, b, acc, FP8_PROMOTE)
        tile_id_c += NUM_SMS
        pid_m, pid_n = _grouped(tile_id_c, num_pid_m, num_pid_n, GROUP_M)
        offs_m = pid_m * BM + tl.arange(0, BM)
        offs_n = pid_n * BN + tl.arange(0, BN)
        out = _epilogue(acc, bias_ptr, offs_n, N, scale, HAS_BIAS, ACT, SCALED)
        tl.store(
            c_ptr + offs_m[:, None] * N + offs_n[None, :],
            out.to(c_ptr.dtype.element_ty),
            mask=(offs_m[:, None] < M) & (offs_n[None, :] < N),
        )


# --------------------------------------------------------------------------------------------
# variants and their config spaces
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Variant:
    name: str
    kernel: str  # "plain" | "tma" | "persistent" | "persistent_ptr" | "gluon" | "gluon_ws"
    knobs: dict[str, int]  # fixed constexprs (DEV_DESC, WS, FLATTEN, SUBTILE, C_TMA)
    what: str
    needs: tuple[str, ...] = ()  # features (see features()) the variant needs
    default: bool = True  # in the sweep unless --variants names it (controls known to fail)
    configs: Callable[[int], list[dict[str, Any]]] = field(default=lambda elem: [], compare=False)

    @property
    def desc(self) -> str:  # how the operands are addressed: "ptr" | "host" | "dev"
        if self.kernel in ("plain", "persistent_ptr"):
            return "ptr"
        return "dev" if self.knobs.get("DEV_DESC") else "host"

    @property
    def persistent(self) -> bool:
        return self.kernel.startswith("persistent")


def smem_bytes(cfg: dict[str, Any], elem: int, out_elem: int = 2, c_tma: bool = True, subtile: bool = False) -> int:
    """Shared memory a config needs: its operand stages plus the TMA store's staging tile."""
    stages = cfg["num_stages"] * (cfg["BM"] + cfg["BN"]) * cfg["BK"] * elem
    c = cfg["BM"] * cfg["BN"] * out_elem // (2 if subtile else 1) if c_tma else 0
    return stages + c


def _space(
    shapes, warps, stages, elem: int, *, c_tma: bool, subtile: bool = False, group_m=(8,), ws: bool = False
) -> list[dict[str, Any]]:
    out = []
    for (bm, bn, bk), w, s, g in itertools.product(shapes, warps, stages, group_m):
        bk_eff = bk if elem == 2 else bk * 2  # fp8: twice the K elements for the same bytes
        cfg = {"BM": bm, "BN": bn, "BK": bk_eff, "GROUP_M": g, "num_warps": w, "num_stages": s}
        if bm * bn >= 128 * 256 and w < 8 and not ws:
            continue  # 128x256 fp32 accumulators in 128 threads: 256 registers each, spills
        if smem_bytes(cfg, elem, 2, c_tma, subtile) > SMEM_LIMIT - 1024:
            continue
        out.append(cfg)
    return out


_BIG = [(128, 256, 64), (256, 128, 64)]
_MID = [(128, 128, 64), (128, 128, 128)]


def _cfg_plain(elem: int) -> list[dict[str, Any]]:
    return _space(_BIG + _MID, (4, 8), (3, 4), elem, c_tma=False)


def _cfg_tma(elem: int) -> list[dict[str, Any]]:
    return _space(_BIG + _MID, (4, 8), (3, 4, 5), elem, c_tma=True)


def _cfg_persistent(elem: int, *, c_tma: bool = True, subtile: bool = False) -> list[dict[str, Any]]:
    return _space(_BIG + _MID, (4, 8), (3, 4, 5), elem, c_tma=c_tma, subtile=subtile)


def _cfg_small(elem: int, *, c_tma: bool = True, subtile: bool = False) -> list[dict[str, Any]]:
    """A control variant's smaller space: the shapes that matter, one or two depths."""
    return _space(_BIG + [(128, 128, 64)], (8,), (3, 4), elem, c_tma=c_tma, subtile=subtile) + _space(
        [(128, 128, 64)], (4,), (4,), elem, c_tma=c_tma, subtile=subtile
    )


def _cfg_gluon(elem: int) -> list[dict[str, Any]]:
    # num_stages is the kernel's NUM_BUFFERS (>= 3); C is staged in shared memory for its TMA store
    out = _space(_BIG, (8,), (3, 4), elem, c_tma=True) + _space([(128, 128, 64)], (4, 8), (4, 5, 6), elem, c_tma=True)
    return [c for c in out if c["num_stages"] >= 3]


def _cfg_gluon_ws(elem: int) -> list[dict[str, Any]]:
    # 8 consumer warps + the loader's warpgroup = 12 warps: maxnreg 168 lets the consumers take 240
    # registers each (the loader 24); 4 consumer warps: 8 warps, no cap needed
    out = [{**c, "maxnreg": 168} for c in _space(_BIG, (8,), (3, 4), elem, c_tma=True)]
    out += [
        {**c, "maxnreg": 168} if c["num_warps"] == 8 else c
        for c in _space([(128, 128, 64)], (4, 8), (4, 5, 6), elem, c_tma=True)
    ]
    return out


def _cfg_ws(elem: int, *, c_tma: bool = False, subtile: bool = False) -> list[dict[str, Any]]:
    # Triton 3.6's Hopper warp specialization (Meta's autoWS) applies at num_warps=4 only (at 8 it
    # compiled without partitions): one producer warpgroup + two consumer warpgroups that split
    # BM between them (12 warps, setmaxnreg), so 128x256 at 4 warps is 64x256 per consumer
    return _space(_BIG + _MID, (4,), (2, 3, 4), elem, c_tma=c_tma, subtile=subtile, ws=True)


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in [
        Variant(
            "plain",
            "plain",
            {},
            "(a) one tile per program, pointer loads with masks (opgraph today)",
            configs=_cfg_plain,
        ),
        Variant(
            "tma_host",
            "tma",
            {"DEV_DESC": 0},
            "(b) one tile per program, host-side TensorDescriptor loads + TMA store",
            needs=("host_desc",),
            configs=_cfg_tma,
        ),
        Variant(
            "tma_ws",
            "tma",
            {"DEV_DESC": 0, "WS": 1, "C_TMA": 0},
            "(d0) one tile per program, host descriptors, K loop tl.range(warp_specialize=True), pointer stores",
            needs=("host_desc", "range_ws"),
            configs=_cfg_ws,
        ),
        Variant(
            "tma_dev",
            "tma",
            {"DEV_DESC": 1},
            "(b') one tile per program, device-side tl.make_tensor_descriptor (opgraph's TMA=1)",
            needs=("dev_desc",),
            configs=lambda e: _cfg_small(e),
        ),
        Variant(
            "persist_ptr",
            "persistent_ptr",
            {"FLATTEN": 0},
            "(c0) persistent, grouped order, pointer loads",
            configs=lambda e: _cfg_small(e, c_tma=False),
        ),
        Variant(
            "persist_ptr_flat",
            "persistent_ptr",
            {"FLATTEN": 1},
            "(f0) persistent pointer loads, tile+K loops flattened (tutorial 09's persistent kernel)",
            needs=("range_flatten",),
            configs=lambda e: _cfg_small(e, c_tma=False),
        ),
        Variant(
            "persist",
            "persistent",
            {"DEV_DESC": 0, "WS": 0, "FLATTEN": 0, "SUBTILE": 0, "C_TMA": 1},
            "(c) persistent, grouped order, host descriptors, TMA store",
            needs=("host_desc",),
            configs=_cfg_persistent,
        ),
        Variant(
            "persist_dev",
            "persistent",
            {"DEV_DESC": 1, "WS": 0, "FLATTEN": 0, "SUBTILE": 0, "C_TMA": 1},
            "(c') as (c) with device-side descriptors (opgraph's TMA=1 PERSISTENT)",
            needs=("dev_desc",),
            configs=lambda e: _cfg_small(e),
        ),
        Variant(
            "persist_cptr",
            "persistent",
            {"DEV_DESC": 0, "WS": 0, "FLATTEN": 0, "SUBTILE": 0, "C_TMA": 0},
            "(c'') as (c), C stored by pointers (an epilogue with several outputs)",
            needs=("host_desc",),
            configs=lambda e: _cfg_small(e, c_tma=False),
        ),
        Variant(
            "persist_ws",
            "persistent",
            {"DEV_DESC": 0, "WS": 1, "FLATTEN": 0, "SUBTILE": 0, "C_TMA": 0},
            "(d) (c) + tl.range(warp_specialize=True); C by pointer stores (3.6's Hopper WS fails on a TMA store)",
            needs=("host_desc", "range_ws"),
            configs=_cfg_ws,
        ),
        Variant(
            "persist_ws_ctma",
            "persistent",
            {"DEV_DESC": 0, "WS": 1, "FLATTEN": 0, "SUBTILE": 0, "C_TMA": 1},
            "(d') (d) with a TMA store of C (failed to compile with 3.6 on CPU: a control)",
            needs=("host_desc", "range_ws"),
            configs=lambda e: _cfg_ws(e, c_tma=True)[:2],
            default=False,
        ),
        Variant(
            "persist_sub",
            "persistent",
            {"DEV_DESC": 0, "WS": 0, "FLATTEN": 0, "SUBTILE": 1, "C_TMA": 1},
            "(e) (c) + epilogue on two column halves",
            needs=("host_desc",),
            configs=lambda e: _cfg_persistent(e, subtile=True),
        ),
        Variant(
            "persist_ws_sub",
            "persistent",
            {"DEV_DESC": 0, "WS": 1, "FLATTEN": 0, "SUBTILE": 1, "C_TMA": 0},
            "(e') (d) + epilogue subtiling (pointer stores; failed to compile with 3.6 on CPU: a control)",
            needs=("host_desc", "range_ws"),
            configs=lambda e: _cfg_ws(e, c_tma=False, subtile=True)[:2],
            default=False,
        ),
        Variant(
            "persist_flat",
            "persistent",
            {"DEV_DESC": 0, "WS": 0, "FLATTEN": 1, "SUBTILE": 0, "C_TMA": 1},
            "(f) (c) + tl.range(flatten=True): next tile's loads under this tile's epilogue",
            needs=("host_desc", "range_flatten"),
            configs=_cfg_persistent,
        ),
        Variant(
            "gluon_persist",
            "gluon",
            {},
            "(g) Gluon: persistent, TMA ring + async wgmma pipelined across tiles, TMA store overlapped",
            needs=("gluon",),
            configs=_cfg_gluon,
        ),
        Variant(
            "gluon_ws",
            "gluon_ws",
            {},
            "(g') Gluon, warp-specialized: a 1-warp TMA loader partition + consumer warpgroups (wgmma, "
            "epilogue), persistent, TMA store overlapped",
            needs=("gluon",),
            configs=_cfg_gluon_ws,
        ),
        Variant(
            "persist_flat_sub",
            "persistent",
            {"DEV_DESC": 0, "WS": 0, "FLATTEN": 1, "SUBTILE": 1, "C_TMA": 1},
            "(f') (f) + epilogue subtiling",
            needs=("host_desc", "range_flatten"),
            configs=lambda e: _cfg_small(e, subtile=True),
        ),
    ]
}

# fp8 rows: the variants that matter, B K-major (wgmma's fp8 needs K-major operands)
FP8_VARIANTS = (
    "plain",
    "tma_host",
    "persist",
    "persist_ws",
    "persist_flat",
    "persist_sub",
    "persist_cptr",
    "gluon_persist",
    "gluon_ws",
)


def kernel_fn(variant: Variant):
    if variant.kernel in ("gluon", "gluon_ws"):
        import gemm_gluon

        return gemm_gluon.gl_persistent if variant.kernel == "gluon" else gemm_gluon.gl_ws
    return {"plain": gemm_plain, "tma": gemm_tma, "persistent": gemm_persistent, "persistent_ptr": gemm_persistent_ptr}[
        variant.kernel
    ]


def features() -> dict[str, str | None]:
    """Feature -> None when this Triton has it, else why not (checked from the API, no GPU)."""
    import inspect

    out: dict[str, str | None] = {}
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: F401

        out["host_desc"] = None
    except ImportError as e:
        out["host_desc"] = f"no triton.tools.tensor_descriptor ({e})"
    out["dev_desc"] = None if hasattr(tl, "make_tensor_descriptor") else "no tl.make_tensor_descriptor"
    params = inspect.signature(tl.range.__init__).parameters
    out["range_ws"] = None if "warp_specialize" in params else "tl.range has no warp_specialize"
    out["range_flatten"] = None if "flatten" in params else "tl.range has no flatten"
    out["allocator"] = None if hasattr(triton, "set_allocator") else "no triton.set_allocator"
    try:
        import gemm_gluon  # noqa: F401

        out["gluon"] = None
    except Exception as e:  # noqa: BLE001 - any import failure means no Gluon here
        out["gluon"] = f"no usable triton.experimental.gluon Hopper API ({type(e).__name__}: {e})"[:300]
    if out["dev_desc"] is None and out["allocator"] is not None:
        out["dev_desc"] = out["allocator"]
    return out


def constexprs(
    variant: Variant,
    cfg: dict[str, Any],
    *,
    b_kmajor: bool,
    has_bias: bool,
    act: int,
    scaled: bool,
    fp8_promote: int,
    num_sms: int,
) -> dict[str, Any]:
    """The kernel's constexpr arguments for a config (launch options num_warps/num_stages apart)."""
    kw: dict[str, Any] = {
        "BM": cfg["BM"],
        "BN": cfg["BN"],
        "BK": cfg["BK"],
        "GROUP_M": cfg["GROUP_M"],
        "HAS_BIAS": int(has_bias),
        "ACT": act,
        "SCALED": int(scaled),
        "FP8_PROMOTE": fp8_promote,
    }
    if variant.kernel == "tma":
        kw.update(
            B_KMAJOR=int(b_kmajor),
            DEV_DESC=variant.knobs["DEV_DESC"],
            WS=variant.knobs.get("WS", 0),
            C_TMA=variant.knobs.get("C_TMA", 1),
        )
    elif variant.kernel == "persistent":
        kw.update(NUM_SMS=num_sms, B_KMAJOR=int(b_kmajor), **variant.knobs)
    elif variant.kernel == "persistent_ptr":
        kw.update(NUM_SMS=num_sms, FLATTEN=variant.knobs["FLATTEN"])
    elif variant.kernel in ("gluon", "gluon_ws"):
        kw = {
            "GROUP_M": cfg["GROUP_M"],
            "NUM_BUFFERS": cfg["num_stages"],
            "B_KMAJOR": int(b_kmajor),
            "HAS_BIAS": int(has_bias),
            "ACT": act,
            "SCALED": int(scaled),
        }
    return kw


def options(cfg: dict[str, Any], variant: Variant | None = None) -> dict[str, Any]:
    if variant is not None and variant.kernel in ("gluon", "gluon_ws"):
        out = {"num_warps": cfg["num_warps"]}  # (its stages are the kernel's own NUM_BUFFERS)
        if cfg.get("maxnreg"):
            out["maxnreg"] = cfg["maxnreg"]
        return out
    out = {"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]}
    if cfg.get("maxnreg"):
        out["maxnreg"] = cfg["maxnreg"]
    return out


def cfg_name(cfg: dict[str, Any]) -> str:
    s = f"{cfg['BM']}x{cfg['BN']}x{cfg['BK']} w{cfg['num_warps']} s{cfg['num_stages']} g{cfg['GROUP_M']}"
    return s + (f" r{cfg['maxnreg']}" if cfg.get("maxnreg") else "")
