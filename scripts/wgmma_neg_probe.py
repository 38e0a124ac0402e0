"""Does negating a tl.dot accumulator go wrong on Hopper? A plain Triton GEMM (no opgraph) storing
-acc (or acc) over a few tile shapes, B layouts, loop lengths and pipeline depths, against PyTorch in
float64 (fuzz seed 20261125508880: a conv followed by NEG gave -0.0 everywhere on an H100, Triton 3.6).

    python scripts/wgmma_neg_probe.py
"""

from __future__ import annotations

import itertools

import torch
import triton
import triton.language as tl


@triton.jit
def gemm(a, b, c, M, N, K, sbk, sbn, NEG: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    acc = tl.zeros((BM, BN), tl.float32)
    for k0 in range(0, K, BK):
        rk = k0 + tl.arange(0, BK)
        x = tl.load(a + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0)
        y = tl.load(b + rk[:, None] * sbk + rn[None, :] * sbn, mask=(rk[:, None] < K) & (rn[None, :] < N), other=0)
        acc = tl.dot(x, y, acc)
    if NEG:
        acc = acc * -1.0
    tl.store(c + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def main() -> None:
    wrong = total = 0
    for (m, n, k), kmajor, stages, neg, (bm, bn, bk) in itertools.product(
        ((2, 2, 12), (2, 2, 48), (64, 32, 48), (200, 100, 96)),
        (True, False),
        (1, 3, 4),
        (True, False),
        ((64, 32, 16), (64, 64, 32), (128, 128, 64)),
    ):
        gen = torch.Generator().manual_seed(0)
        av = torch.randn(m, k, generator=gen).to(torch.bfloat16)
        bv = torch.randn(k, n, generator=gen).to(torch.bfloat16)
        want = (av.double() @ bv.double()) * (-1 if neg else 1)
        a = av.cuda()
        b = bv.t().contiguous().t().cuda() if kmajor else bv.cuda()
        c = torch.full((m, n), float("nan"), device="cuda")
        grid = (triton.cdiv(m, bm), triton.cdiv(n, bn))
        gemm[grid](
            a, b, c, m, n, k, b.stride(0), b.stride(1), NEG=neg, BM=bm, BN=bn, BK=bk, num_stages=stages, num_warps=4
        )
        torch.cuda.synchronize()
        got = c.double().cpu()
        ok = torch.allclose(got, want, rtol=2e-2, atol=2e-2)
        total += 1
        if not ok:
            wrong += 1
            zeros = " (all zeros)" if bool((got == 0).all()) else ""
            print(
                f"WRONG m{m} n{n} k{k} B {'k-major' if kmajor else 'n-major'} tiles {bm}x{bn}x{bk} "
                f"num_stages={stages} {'-acc' if neg else 'acc'}{zeros}"
            )
    print(f"{wrong} wrong of {total}")


if __name__ == "__main__":
    main()
