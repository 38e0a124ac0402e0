"""The reference semantics of scaled dot-product attention (NumPy, float64): the definition every
engine is tested against. docs/attention.md states the same formulas; keep the two in step.

Shapes (dense): q [B, Hq, Sq, D], k [B, Hk, Skv, D], v [B, Hv, Skv, Dv]; query head h reads key head
h // (Hq / Hk) and value head h // (Hq / Hv) (GQA / MQA). Packed (ragged) and paged tensors are
first gathered into these dense forms (`unpack`, `unpage`), and packed outputs scattered back
(`pack`). Per batch b, with sq_b / skv_b the actual lengths (seq_len_q[b] / seq_len_kv[b] under the
padding mask, else Sq / Skv):

    s1[b,h,i,j] = attn_scale * q[b,h,i,:] . k[b,h',j,:]  + bias[b,h,i,j] + slope_h * (j - i) (ALiBi)
    s2          = score_mod(s1)                                     (identity without a modifier)
    s           = s2 where keep(b,h,i,j) else -inf
    keep        = (i < sq_b and j < skv_b               padding mask)
                  and (j <= i + delta_b + R             right bound R of the diagonal band; causal: R = 0)
                  and (j >  i + delta_b - L             left bound L (the sliding window of length L))
                  and block_mask bit of tile (i // 128, j // 128)
                  delta_b = skv_b - sq_b for the bottom-right alignment, 0 for top-left
    m           = max(max_j s, sink_h)          (sink_h = -inf without a sink token or on a padded row)
    Z           = sum_j exp(s - m) + exp(sink_h - m)
    P           = exp(s - m) / Z; a row with m = -inf (every s -inf, no sink) gives P = 0 (so O = 0)
    Stats       = m + log(Z) (natural log); a row with m = -inf: +inf (opgraph), -inf (cuDNN's form)
    score_max   = m, score_sum_exp = Z          (-inf and 0 on such a row)
    O           = (P * Drop) @ v, Drop = keep_philox / (1 - p)  or  mask * scale  or 1

Backward (o, dO and stats as given; P = exp(s - stats), 0 where s is -inf or masked):
    dV = (P*Drop)^T @ dO    dP = (dO @ v^T) * Drop    delta_i = sum_d dO*o
    dS2 = P * (dP - delta)  dS1 = dS2 * d score_mod / d s1 (0 where masked)
    dQ = attn_scale * dS1 @ k    dK = attn_scale * dS1^T @ q    dBias = dS1 summed to bias's dims
    dSink_h = -sum_{b,i} exp(sink_h - stats) * delta        (rows i < sq_b with finite stats)
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

BLOCK_MASK_TILE = 128  # rows and columns of the score tile one bit of a block mask covers


def alibi_slopes(heads: int) -> np.ndarray:
    """ALiBi slopes of heads 0..H-1 (Press et al.; cuDNN's): 2^(-8(h+1)/n) for the n = largest power
    of two <= H heads first, then 2^(-4(2m+1)/n) for the remaining ones."""
    n = 2 ** math.floor(math.log2(heads))
    slopes = [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]
    slopes += [2.0 ** (-4.0 * (2 * m + 1) / n) for m in range(heads - n)]
    return np.array(slopes, dtype=np.float64)


def block_mask_bits(mask: np.ndarray, sq: int, skv: int) -> np.ndarray:
    """A block mask [B, H, ceil(Sq/128), ceil(ceil(Skv/128)/8)] of bytes expanded to boolean
    [B, H, Sq, Skv]: score (i, j) is kept when bit (j//128) % 8 of byte [.., i//128, (j//128)//8] is set."""
    m = np.asarray(mask).astype(np.int64)
    tiles_j = -(-skv // BLOCK_MASK_TILE)
    bits = (m[..., :, :, None] >> np.arange(8)) & 1  # [B, H, Ti, bytes, 8]
    bits = bits.reshape(*m.shape[:3], -1)[..., :tiles_j].astype(bool)  # [B, H, Ti, Tj]
    rows = np.minimum(np.arange(sq) // BLOCK_MASK_TILE, bits.shape[2] - 1)
    cols = np.arange(skv) // BLOCK_MASK_TILE
    return bits[:, :, rows][:, :, :, cols]


@dataclass(frozen=True)
class Masking:
    """The built-in masks of one attention op: padding, and the diagonal band [delta - left, delta +
    right] around the diagonal (None: unbounded on that side), top-left or bottom-right aligned."""

    padding: bool = False
    bottom_right: bool = False
    left: int | None = None
    right: int | None = None

    @property
    def any(self) -> bool:
        return self.padding or self.left is not None or self.right is not None

    def keep(self, b: int, sq: int, skv: int, seq_q: np.ndarray | None, seq_kv: np.ndarray | None) -> np.ndarray | None:
        """Boolean [B, 1, Sq, Skv] (None: every position kept)."""
        if not self.any:
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
        if self.right is not None:
            keep &= j <= i + delta + self.right
        if self.left is not None:
            keep &= j > i + delta - self.left
        return keep


# -- packed (ragged) and paged tensors -------------------------------------------------------------------


def _ints(x: np.ndarray | None, n: int) -> np.ndarray:
    return np.asarray(x, dtype=np.float64).reshape(-1)[:n].astype(np.int64)


def unpack(x: np.ndarray, offsets: np.ndarray, lens: np.ndarray | None, b: int, s: int) -> np.ndarray:
    """A packed tensor [1, H, T, D] as dense [B, H, S, D]: row i of sequence b is token offsets[b] + i
    of x for i < lens[b] (all S rows without lengths); rows past the sequence or outside [0, T) are 0."""
    t = x.shape[2]
    off = _ints(offsets, b)[:, None]
    i = np.arange(s)[None, :]
    tok = off + i
    ok = (tok >= 0) & (tok < t)
    if lens is not None:
        ok &= i < _ints(lens, b)[:, None]
    g = x[0][:, np.clip(tok, 0, max(t - 1, 0))]  # [H, B, S, D]
    g = np.where(ok[None, :, :, None], g, 0.0)
    return np.moveaxis(g, 0, 1)


def pack(dense: np.ndarray, offsets: np.ndarray, lens: np.ndarray | None, t: int) -> np.ndarray:
    """The inverse of `unpack` for an output: dense [B, H, S, D] into a zero [1, H, T, D], rows of
    sequences that overlap summed (tokens no sequence covers stay 0)."""
    b, h, s, d = dense.shape
    out = np.zeros((1, h, t, d), dtype=np.float64)
    off = _ints(offsets, b)[:, None]
    i = np.arange(s)[None, :]
    tok = off + i
    ok = (tok >= 0) & (tok < t)
    if lens is not None:
        ok &= i < _ints(lens, b)[:, None]
    bi, ii = np.nonzero(ok)
    np.add.at(out[0].transpose(1, 0, 2), tok[bi, ii], dense[bi, :, ii])  # rows of [T, H, w]
    return out


def unpage(container: np.ndarray, table: np.ndarray, s: int) -> np.ndarray:
    """A paged cache as dense [B, H, S, D]: key j of batch b is row j % bs of page table[b, j // bs] of
    the container [pages, H, bs, D]; a page index outside [0, pages) or past the table reads 0."""
    pages, _, bs, _ = container.shape
    tab = np.asarray(table, dtype=np.float64).astype(np.int64)  # [B, P]
    j = np.arange(s)
    slot = j // bs
    inside = slot < tab.shape[1]
    page = tab[:, np.minimum(slot, tab.shape[1] - 1)]  # [B, S]
    ok = inside[None, :] & (page >= 0) & (page < pages)
    g = container[np.clip(page, 0, pages - 1), :, (j % bs)[None, :], :]  # [B, S, H, D]
    g = np.where(ok[:, :, None, None], g, 0.0)
    return np.moveaxis(g, 2, 1)


# -- scores, forward, backward ---------------------------------------------------------------------------


def _expand_heads(x: np.ndarray, hq: int) -> np.ndarray:
    return np.repeat(x, hq // x.shape[1], axis=1) if x.shape[1] != hq else x


def _group_sum(x: np.ndarray, heads: int) -> np.ndarray:
    """[B, Hq, S, D] summed over the query heads sharing each of `heads` heads."""
    b, hq, s, d = x.shape
    return x.reshape(b, heads, hq // heads, s, d).sum(axis=2) if heads != hq else x


def _scalar(v: np.ndarray | None, default: float) -> float:
    return default if v is None else float(np.asarray(v).reshape(-1)[0])


def _integer(v: np.ndarray | None) -> int:
    """A seed or offset, exact (the engines read them as int64: Op.integer_inputs)."""
    return 0 if v is None else int(np.asarray(v).reshape(-1)[0])


@dataclass
class Scores:
    """What the forward and backward share: s1 (pre-modifier), s (modified and masked), keep, the
    valid rows (i < sq_b under the padding mask, else None) and the sink logits [1, Hq, 1, 1]."""

    s1: np.ndarray
    s: np.ndarray
    keep: np.ndarray | None
    scale: float
    rows: np.ndarray | None = None
    sink: np.ndarray | None = None


def scores(
    q,
    k,
    scale,
    bias,
    alibi: bool,
    masking: Masking,
    seq_q,
    seq_kv,
    modifier: Callable[[np.ndarray], np.ndarray] | None,
    block_mask: np.ndarray | None = None,
    sink: np.ndarray | None = None,
) -> Scores:
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
    if block_mask is not None:
        bits = block_mask_bits(block_mask, sq, skv)
        keep = bits if keep is None else keep & bits
    s = np.where(keep, s2, -np.inf) if keep is not None else np.array(s2, dtype=np.float64)
    rows = None
    if masking.padding:
        rows = np.arange(sq).reshape(1, 1, sq, 1) < np.asarray(seq_q, dtype=np.float64).reshape(b, 1, 1, 1)
    sink_logits = None if sink is None else np.asarray(sink, dtype=np.float64).reshape(1, -1, 1, 1)
    return Scores(s1, s, keep, sc, rows, sink_logits)


def dropout_factor(shape, p: float | None, seed, offset, mask, mask_scale) -> np.ndarray | None:
    """The multiplier of P: keep / (1 - p) (Philox), mask * scale (explicit mask) or None."""
    if p is not None:
        keep = dropout_keep(p, _integer(seed), _integer(offset), shape)
        return keep / (1.0 - p)
    if mask is not None:
        return np.broadcast_to(mask * _scalar(mask_scale, 1.0), shape)
    return None


@dataclass
class Softmax:
    """The forward's row statistics and probabilities."""

    p: np.ndarray
    stats: np.ndarray
    score_max: np.ndarray
    score_sum_exp: np.ndarray


def softmax(sc: Scores, empty_stats: float = math.inf) -> Softmax:
    """P, Stats (`empty_stats` on a row with nothing kept and no sink, and on a padded row), score_max
    and score_sum_exp. A padded row (i >= seq_len_q[b]) is not part of its sequence: the sink does not
    join it, so it is empty whatever the sink."""
    s = sc.s
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        m = s.max(axis=-1, keepdims=True)
        sink = sc.sink
        if sink is not None:
            sink = np.broadcast_to(sink, m.shape)
            if sc.rows is not None:
                sink = np.where(sc.rows, sink, -np.inf)
            m = np.maximum(m, sink)
        empty = m == -np.inf
        m0 = np.where(empty, 0.0, m)
        e = np.where(s == -np.inf, 0.0, np.exp(s - m0))
        total = e.sum(axis=-1, keepdims=True)
        if sink is not None:
            total = total + np.where(empty, 0.0, np.exp(sink - m0))
        safe = np.where(total == 0, 1.0, total)
        p = e / safe
        stats = np.where(empty, empty_stats, m0 + np.log(safe))
    return Softmax(p, stats, m, np.where(empty, 0.0, total))


def forward(
    sc: Scores, v: np.ndarray, drop: np.ndarray | None, empty_stats: float = math.inf
) -> tuple[np.ndarray, Softmax]:
    """O and the row statistics from the scores."""
    sm = softmax(sc, empty_stats)
    p = sm.p if drop is None else sm.p * drop
    o = np.einsum("bhij,bhjd->bhid", p, _expand_heads(v, sc.s.shape[1]))
    return o, sm


def backward(
    sc: Scores,
    q,
    k,
    v,
    o,
    do,
    stats,
    drop: np.ndarray | None,
    modifier_grad: Callable[[np.ndarray, np.ndarray], np.ndarray] | None,
    bias_dims: tuple[int, ...] | None,
):
    """dQ, dK, dV, dBias (None without a bias) and dSink ([1, Hq, 1, 1]; None without a sink)."""
    hq = q.shape[1]
    s = sc.s
    with np.errstate(invalid="ignore", over="ignore"):
        p = np.where(s == -np.inf, 0.0, np.exp(s - stats))
    p = np.nan_to_num(p, nan=0.0, posinf=0.0)
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
    dsink = None
    if sc.sink is not None:
        with np.errstate(invalid="ignore", over="ignore"):
            p_sink = np.exp(sc.sink - stats)
        ok = np.isfinite(stats) & np.isfinite(p_sink)
        if sc.rows is not None:
            ok &= sc.rows
        dsink = -np.where(ok, p_sink * delta, 0.0).sum(axis=(0, 2), keepdims=True)
    return dq, dk, dv, dbias, dsink
