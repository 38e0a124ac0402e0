"""An independent PyTorch float64 formulation of attention (written from docs/attention.md, not from
the reference code), plus helpers to build and run sdpa graphs in tests."""

from __future__ import annotations

import math

import numpy as np
import torch

import opgraph as og
from opgraph.core.tensor import packed_strides
from opgraph.testing import empty_like_desc, poison

D = og.DataType
BSHD = (0, 2, 1, 3)


def strides(dims, layout: str):
    return packed_strides(dims, BSHD) if layout == "bshd" else packed_strides(dims)


def keep_mask(B, Sq, Skv, *, lens=None, causal=False, br=False, window=None) -> np.ndarray:
    """keep(b, i, j) of the documented table, by explicit loops."""
    keep = np.ones((B, 1, Sq, Skv), dtype=bool)
    for b in range(B):
        lq, lkv = (int(lens[0][b]), int(lens[1][b])) if lens is not None else (Sq, Skv)
        d = lkv - lq if br else 0
        for i in range(Sq):
            for j in range(Skv):
                ok = True
                if lens is not None:
                    ok = ok and i < lq and j < lkv
                if causal or br:
                    ok = ok and j <= i + d
                if window is not None:
                    ok = ok and j > i + d - window
                keep[b, 0, i, j] = ok
    return keep


def alibi_slopes(h: int) -> torch.Tensor:
    n = 2 ** int(math.log2(h))
    s = [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]
    s += [2.0 ** (-8.0 * (i + 1) / (2 * n)) for i in range(0, 2 * n, 2)][: h - n]
    return torch.tensor(s, dtype=torch.float64)


def attention(q, k, v, *, scale=1.0, bias=None, alibi=False, keep=None, mod=None, drop=None):
    """O and Stats (natural-log LSE, +inf on empty rows) in torch float64; differentiable."""
    hq, sq, skv = q.shape[1], q.shape[2], k.shape[2]
    k = k.repeat_interleave(hq // k.shape[1], 1)
    v = v.repeat_interleave(hq // v.shape[1], 1)
    s = (q @ k.transpose(-1, -2)) * scale
    if bias is not None:
        s = s + bias
    if alibi:
        dist = torch.arange(skv, dtype=torch.float64)[None, :] - torch.arange(sq, dtype=torch.float64)[:, None]
        s = s + alibi_slopes(hq).view(1, hq, 1, 1) * dist
    if mod is not None:
        s = mod(s)
    if keep is not None:
        s = s.masked_fill(~torch.as_tensor(keep), float("-inf"))
    empty = (s == float("-inf")).all(-1, keepdim=True)
    p = torch.softmax(s.masked_fill(empty, 0.0), -1).masked_fill(empty, 0.0)
    lse = torch.logsumexp(s.masked_fill(empty, 0.0), -1, keepdim=True).masked_fill(empty, float("inf"))
    if drop is not None:
        p = p * torch.as_tensor(drop)
    return p @ v, lse


def fill(desc, values: np.ndarray) -> np.ndarray:
    arr = empty_like_desc(desc)
    arr[...] = values.astype(desc.data_type.numpy)
    return arr


def run(g: og.Graph, feeds: dict, outs: list) -> list[np.ndarray]:
    """Run g on the reference engine: feeds {handle: array in logical dims (or number)}; outputs
    poisoned first, returned in logical dims as float64."""
    final = g.final
    pack = {}
    for h, val in feeds.items():
        desc = final.tensors[h.uid]
        pack[h] = fill(desc, np.asarray(val)) if isinstance(val, np.ndarray) else val
    bufs = [poison(empty_like_desc(final.tensors[h.uid])) for h in outs]
    pack.update(zip(outs, bufs))
    g.build(device="cpu").execute(pack)
    return [b.astype(np.float64) for b in bufs]


def fused_qkv_errors(x, dy, o, dqkv, heads: int) -> dict[str, float]:
    """Relative L2 errors of O and of the fused qkv input's gradient, for causal attention over the
    heads of x = [B, S, 3 * H * D] with dy = dO as [B, S, H * D], against PyTorch autograd in float32."""
    import torch.nn.functional as F

    b, s, width = x.shape
    d = width // (3 * heads)
    xf = x.float().requires_grad_()
    q, k, v = (t.reshape(b, s, heads, d).transpose(1, 2) for t in xf.split(heads * d, dim=2))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=d**-0.5)
    ref.backward(dy.float().reshape(b, s, heads, d).transpose(1, 2))

    def rel(a, r):
        return ((a.float() - r).norm() / r.norm()).item()

    return {"o": rel(o, ref), "dqkv": rel(dqkv, xf.grad)}
