"""The reference semantics of scaled dot-product attention (NumPy, float64): the definition every
engine is tested against. docs/attention.md states the same formulas; keep the two in step.

Shapes: q [B, Hq, Sq, D], k [B, Hk, Skv, D], v [B, Hv, Skv, Dv]; query head h reads key head
h // (Hq / Hk) and value head h // (Hq / Hv) (GQA / MQA). Per batch b, with sq_b / skv_b the actual
lengths (seq_len_q[b] / seq_len_kv[b] under the padding mask, else Sq / Skv):

    s1[b,h,i,j] = attn_scale * q[b,h,i,:] . k[b,h',j,:]  + bias[b,h,i,j] + slope_h * (j - i) (ALiBi)
    s2          = score_mod(s1)                                     (identity without a modifier)
    s           = s2 where keep(b,i,j) else -inf
    keep(b,i,j) = (i < sq_b and j < skv_b               padding mask)
                  and (j <= i + delta_b                 causal, either alignment)
                  and (j >  i + delta_b - W             sliding window of length W)
                  delta_b = skv_b - sq_b for the bottom-right alignment, 0 for top-left
    P           = softmax_j(s); a row whose every s is -inf gives P = 0 (so O = 0)
    Stats       = log(sum_j exp(s)) (natural log, FP32); +inf for such an empty row
    O           = (P * Drop) @ v, Drop = keep_philox / (1 - p)  or  mask * scale  or 1

Backward (o, dO and stats as given; P = exp(s - stats), 0 where s is -inf or masked):
    dV = (P*Drop)^T @ dO    dP = (dO @ v^T) * Drop    delta_i = sum_d dO*o
    dS2 = P * (dP - delta)  dS1 = dS2 * d score_mod / d s1 (0 where masked)
    dQ = attn_scale * dS1 @ k    dK = attn_scale * dS1^T @ q    dBias = dS1 summed to bias's dims
(dK, dV summed over the query heads that share a key/value head.)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

# -- Philox 4x32-10, as Triton's tl.rand(seed, offset) ----------------------------------------------

_KEY_A, _KEY_B = np.uint64(0x9E3779B9), np.uint64(0xBB67AE85)
_ROUND_A, _ROUND_B = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_M32 = np.uint64(0xFFFFFFFF)
_UNIFORM_SCALE = np.float32(4.6566127342e-10)


def philox_uint32(seed: int, counter: np.ndarray) -> np.ndarray:
    """The first 32-bit word of Philox4x32 with 10 rounds: key (low, high word of the int64 seed),
    counter (low, high word of the int64 `counter`, 0, 0). Same as Triton's ``tl.randint(seed, offset)``
    for an int64 offset."""
    s = np.array(seed, dtype=np.int64).view(np.uint64)
    k0, k1 = s & _M32, s >> np.uint64(32)
    c = np.asarray(counter, dtype=np.int64)
    c0 = c.view(np.uint64) & _M32
    c1 = (c >> np.int64(32)).view(np.uint64) & _M32
    c2 = np.zeros_like(c0)
    c3 = np.zeros_like(c0)
    for _ in range(10):
        p0, p2 = _ROUND_A * c0, _ROUND_B * c2  # exact: both factors < 2**32
        c0, c1, c2, c3 = ((p2 >> np.uint64(32)) ^ c1 ^ k0, p2 & _M32, (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & _M32)
        k0, k1 = (k0 + _KEY_A) & _M32, (k1 + _KEY_B) & _M32
    return c0.astype(np.uint32)


def philox_uniform(seed: int, counter: np.ndarray) -> np.ndarray:
    """Triton's ``tl.rand(seed, offset)``: the word as int32, x -> ~x when negative, times
    4.6566127342e-10 in float32: a float32 in [0, 1)."""
    x = philox_uint32(seed, counter).view(np.int32)
    x = np.where(x < 0, ~x, x)
    return x.astype(np.float32) * _UNIFORM_SCALE


def dropout_keep(p: float, seed: int, offset: int, shape: Sequence[int]) -> np.ndarray:
    """The Philox dropout mask over [B, Hq, Sq, Skv]: element (b, h, i, j) is kept when
    tl.rand(seed, offset + ((b*Hq + h)*Sq + i)*Skv + j) >= float32(p)."""
    n = math.prod(shape)
    counter = np.int64(offset) + np.arange(n, dtype=np.int64).reshape(shape)
    return philox_uniform(seed, counter) >= np.float32(p)


# -- masks and biases ---------------------------------------------------------------------------------


def alibi_slopes(heads: int) -> np.ndarray:
    """ALiBi slopes of heads 0..H-1 (Press et al.; cuDNN's): 2^(-8(h+1)/n) for the n = largest power
    of two <= H heads first, then 2^(-4(2m+1)/n) for the remaining ones."""
    n = 2 ** math.floor(math.log2(heads))
    slopes = [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]
    slopes += [2.0 ** (-4.0 * (2 * m + 1) / n) for m in range(heads - n)]
    return np.array(slopes, dtype=np.float64)


@dataclass(frozen=True)
class Masking:
    """The built-in masks of one attention op."""

    padding: bool = False
    causal: bool = False
    bottom_right: bool = False  # causal with the bottom-right alignment
    window: int | None = None

    def keep(self, b: int, sq: int, skv: int, seq_q: np.ndarray | None, seq_kv: np.ndarray | None
             ) -> np.ndarray | None:
        """Boolean [B, 1, Sq, Skv] (None: every position kept)."""
        if not (self.padding or self.causal or self.bottom_right or self.window is not None):
            return None
        if self.padding:
            lq = np.asarray(seq_q, dtype=np.float64).reshape(b, 1, 1, 1)
            lkv = np.asarray(seq_kv, dtype=np.float64).reshape(b, 1, 1, 1)
        else:
            lq = np.full((b, 1, 1, 1), float(sq))
            lkv = np.full((b, 1, 1, 1), float(skv))
        i = np.arange(sq, dtype=np.float64).reshape(1, 1, sq, 1)
        j = np.arange(skv, dtype=np.float64).reshape(1, 1, 1, skv)
        keep = np.ones((b, 1, sq, skv), dtype=bool)
        if self.padding:
            keep &= (i < lq) & (j < lkv)
        delta = (lkv - lq) if self.bottom_right else np.zeros_like(lq)
        if self.causal or self.bottom_right:
            keep &= j <= i + delta
        if self.window is not None:
            keep &= j > i + delta - self.window
        return keep


def _expand_heads(x: np.ndarray, hq: int) -> np.ndarray:
    return np.repeat(x, hq // x.shape[1], axis=1) if x.shape[1] != hq else x


def _group_sum(x: np.ndarray, heads: int) -> np.ndarray:
    """[B, Hq, S, D] summed over the query heads sharing each of `heads` heads."""
    b, hq, s, d = x.shape
    return x.reshape(b, heads, hq // heads, s, d).sum(axis=2) if heads != hq else x


def _scalar(v: np.ndarray | None, default: float) -> float:
    return default if v is None else float(np.asarray(v).reshape(-1)[0])


@dataclass
class Scores:
    """What the forward and backward share: s1 (pre-modifier), s (modified and masked), keep."""

    s1: np.ndarray
    s: np.ndarray
    keep: np.ndarray | None
    scale: float


def scores(q, k, scale, bias, alibi: bool, masking: Masking, seq_q, seq_kv,
           modifier: Callable[[np.ndarray], np.ndarray] | None) -> Scores:
    b, hq, sq, _ = q.shape
    skv = k.shape[2]
    sc = _scalar(scale, 1.0)
    s1 = np.einsum("bhid,bhjd->bhij", q, _expand_heads(k, hq)) * sc
    if bias is not None:
        s1 = s1 + bias
    if alibi:
        dist = np.arange(skv, dtype=np.float64)[None, :] - np.arange(sq, dtype=np.float64)[:, None]
        s1 = s1 + alibi_slopes(hq).reshape(1, hq, 1, 1) * dist
    s2 = modifier(s1) if modifier is not None else s1
    keep = masking.keep(b, sq, skv, seq_q, seq_kv)
    s = np.where(keep, s2, -np.inf) if keep is not None else np.array(s2, dtype=np.float64)
    return Scores(s1, s, keep, sc)


def dropout_factor(shape, p: float | None, seed, offset, mask, mask_scale) -> np.ndarray | None:
    """The multiplier of P: keep / (1 - p) (Philox), mask * scale (explicit mask) or None."""
    if p is not None:
        keep = dropout_keep(p, int(_scalar(seed, 0)), int(_scalar(offset, 0)), shape)
        return keep / (1.0 - p)
    if mask is not None:
        return np.broadcast_to(mask * _scalar(mask_scale, 1.0), shape)
    return None


def forward(sc: Scores, v: np.ndarray, drop: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """O and Stats from the scores."""
    s = sc.s
    with np.errstate(invalid="ignore", over="ignore"):
        m = s.max(axis=-1, keepdims=True)
        empty = m == -np.inf
        m = np.where(empty, 0.0, m)
        e = np.where(s == -np.inf, 0.0, np.exp(s - m))
        total = e.sum(axis=-1, keepdims=True)
        p = e / np.where(total == 0, 1.0, total)
        stats = np.where(empty, np.inf, m + np.log(np.where(total == 0, 1.0, total)))
    if drop is not None:
        p = p * drop
    o = np.einsum("bhij,bhjd->bhid", p, _expand_heads(v, s.shape[1]))
    return o, stats


def backward(sc: Scores, q, k, v, o, do, stats, drop: np.ndarray | None,
             modifier_grad: Callable[[np.ndarray, np.ndarray], np.ndarray] | None,
             bias_dims: tuple[int, ...] | None):
    """dQ, dK, dV and dBias (None without a bias)."""
    hq = q.shape[1]
    s = sc.s
    with np.errstate(invalid="ignore", over="ignore"):
        p = np.where(s == -np.inf, 0.0, np.exp(s - stats))
    pd = p if drop is None else p * drop
    ve = _expand_heads(v, hq)
    dv = _group_sum(np.einsum("bhij,bhid->bhjd", pd, do), v.shape[1])
    dp = np.einsum("bhid,bhjd->bhij", do, ve)
    if drop is not None:
        dp = dp * drop
    delta = (do * o).sum(axis=-1, keepdims=True)
    ds = p * (dp - delta)
    if modifier_grad is not None:
        with np.errstate(all="ignore"):
            ds = modifier_grad(sc.s1, ds)
    if sc.keep is not None:
        ds = np.where(sc.keep, ds, 0.0)
    dq = sc.scale * np.einsum("bhij,bhjd->bhid", ds, _expand_heads(k, hq))
    dk = _group_sum(sc.scale * np.einsum("bhij,bhid->bhjd", ds, q), k.shape[1])
    dbias = None
    if bias_dims is not None:
        axes = tuple(a for a, d in enumerate(bias_dims) if d == 1 and ds.shape[a] != 1)
        dbias = ds.sum(axis=axes, keepdims=True)
    return dq, dk, dv, dbias
