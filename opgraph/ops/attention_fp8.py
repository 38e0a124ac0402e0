"""`g.sdpa_fp8`: scaled dot-product attention on fp8 tensors, as cuDNN defines it (its frontend's
`SDPAFP8Node`), built from the graph's own ops: the scores by a matmul of fp8 Q and K (K read transposed
in place), the scales and the causal mask as pointwise ops, the softmax by reductions, P quantized to
fp8 before the second matmul, and the two amax outputs as reductions. Every engine runs it (the reference
engine its spec); the scores are materialized ([B, H, S_q, S_kv] in fp32), so it is the composite a fused
fp8 attention kernel would be checked against, not that kernel.

    S = (Q @ K^T) * attn_scale * descale_q * descale_k        (masked to the lowest float)
    P = softmax(S) along the keys;  Stats = max(S) + log(sum(exp(S - max(S))))
    amax_s = max |P|;  P8 = fp8(P * scale_s)                   (Q's fp8 type)
    O' = (P8 @ V) * descale_s * descale_v;  amax_o = max |O'|;  O = O' * scale_o
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.dtypes import DataType
from ..core.errors import AttributeValueError, UnsupportedGraphError
from ..core.op import graph_method
from .attention import DiagonalAlignment
from .attention_builders import band_fields

_FP8 = (DataType.FP8_E4M3, DataType.FP8_E5M2)
_LOWEST = float(np.finfo(np.float32).min)  # (cuDNN's masked score: exp() of it is 0 beside any kept one)


@graph_method
def sdpa_fp8(
    self,
    q: Any,
    k: Any,
    v: Any,
    descale_q: Any,
    descale_k: Any,
    descale_v: Any,
    descale_s: Any,
    scale_s: Any,
    scale_o: Any,
    generate_stats: bool = False,
    attn_scale: Any = None,
    use_causal_mask: bool = False,
    use_causal_mask_bottom_right: bool = False,
    sliding_window_length: Any = None,
    diagonal_alignment: Any = DiagonalAlignment.TOP_LEFT,
    diagonal_band_left_bound: Any = None,
    diagonal_band_right_bound: Any = None,
    compute_data_type: Any = None,
    amax: bool = True,
    name: str = "",
) -> list[Any]:
    """Scaled dot-product attention on fp8 Q, K, V with cuDNN's fp8 scaling: [O, Stats, amax_s, amax_o].

    Shapes: q [B, H, S_q, D], k [B, H_k, S_kv, D], v [B, H_k, S_kv, D_v] with H_k equal to H or 1; the
    descales and scales 1-element tensors (or Python numbers). O [B, H, S_q, D_v]; Stats [B, H, S_q, 1];
    amax_s and amax_o [1, 1, 1, 1].

    Layouts: any strides (K is read transposed in place); O packed [B, H, S_q, D_v] unless set.

    Types: q, k, v FP8_E4M3 or FP8_E5M2; the math in FLOAT; P quantized to q's type; O in the graph's io
    type unless set (an fp8 O is `O' * scale_o` cast); Stats, amax_s, amax_o FLOAT.

    Formula: the module docstring (cuDNN's SDPAFP8Node). Masks, as `g.sdpa`'s band: key j kept for query i
    when `i + delta - left < j <= i + delta + right`, delta = S_kv - S_q for the bottom-right alignment
    (else 0), right 0 for the causal flags or `diagonal_band_right_bound`, left `sliding_window_length` or
    `diagonal_band_left_bound` (either bound None: none). A band leaving a query row with no key is refused
    (cuDNN refuses those; `g.sdpa` runs them).

    Args:
        q: queries (fp8).
        k: keys (fp8).
        v: values (fp8).
        descale_q: Q's dequantization scale.
        descale_k: K's dequantization scale.
        descale_v: V's dequantization scale.
        descale_s: P8's dequantization scale (1 / scale_s, usually).
        scale_s: P's quantization scale.
        scale_o: O's quantization scale.
        generate_stats: also return Stats (the softmax's log-sum-exp of each query row).
        attn_scale: the scores' scale (default 1).
        use_causal_mask: causal, aligned top-left.
        use_causal_mask_bottom_right: causal, aligned bottom-right.
        sliding_window_length: the band's left bound W (keys i - W < j).
        diagonal_alignment: TOP_LEFT or BOTTOM_RIGHT, the band's diagonal.
        diagonal_band_left_bound: the left bound (sliding_window_length's other spelling).
        diagonal_band_right_bound: the right bound (0: causal).
        compute_data_type: the math's type (FLOAT).
        amax: also compute amax_s and amax_o (results to mark as outputs: an unread one is a dataflow error).
        name: a prefix of the ops' names.

    Returns:
        [O, Stats (None without generate_stats), amax_s, amax_o (None and None without amax)].

    Example:
        ```python
        g = og.Graph("attn", io_data_type=og.DataType.FP8_E4M3, intermediate_data_type=og.DataType.FLOAT)
        q, k, v = (g.tensor(dim=[2, 8, 512, 128], name=n) for n in "qkv")
        one = [g.tensor(dim=[1, 1, 1, 1], data_type=og.DataType.FLOAT, name=f"s{i}") for i in range(6)]
        o, stats, amax_s, amax_o = g.sdpa_fp8(q, k, v, *one, generate_stats=True, attn_scale=128**-0.5,
                                              use_causal_mask=True)
        ```
    """
    label = f"sdpa_fp8 '{name}'" if name else "sdpa_fp8"
    q_type = _check(self, q, k, v, compute_data_type, label)
    band = band_fields(
        label,
        use_causal_mask,
        use_causal_mask_bottom_right,
        sliding_window_length,
        diagonal_alignment,
        diagonal_band_left_bound,
        diagonal_band_right_bound,
    )
    if band["use_causal_mask"] and band["use_causal_mask_bottom_right"]:
        raise AttributeValueError(
            "use_causal_mask and use_causal_mask_bottom_right are both set",
            op=label,
            rule="sdpa_fp8.mask",
            hint="pick one alignment of the causal mask",
        )
    left, right, delta = _bounds(band, int(q.dim[2]), int(k.dim[2]), label)
    f32 = DataType.FLOAT

    def called(part: str) -> str:
        return f"{name}.{part}" if name else ""

    def scaled(x: Any, factor: Any, part: str) -> Any:
        return self.mul(x, factor, name=called(part)).set_data_type(f32)

    kt = self.transpose(k, [0, 1, 3, 2], name=called("k_t"))
    s = self.matmul(q, kt, compute_data_type=f32, name=called("bmm1")).set_data_type(f32)
    if attn_scale is not None:
        s = scaled(s, attn_scale, "attn_scale")
    s = scaled(scaled(s, descale_q, "descale_q"), descale_k, "descale_k")
    if left is not None or right is not None:
        i32, boolean = DataType.INT32, DataType.BOOLEAN
        row = self.gen_index(s, axis=2, name=called("row")).set_data_type(i32)
        col = self.gen_index(s, axis=3, name=called("col")).set_data_type(i32)
        keeps = []
        if right is not None:  # j <= i + delta + right
            last = self.add(row, delta + right, name=called("last_key")).set_data_type(i32)
            keeps.append(self.cmp_le(col, last, name=called("right_bound")).set_data_type(boolean))
        if left is not None:  # j > i + delta - left
            first = self.add(row, delta - left, name=called("first_key")).set_data_type(i32)
            keeps.append(self.cmp_gt(col, first, name=called("left_bound")).set_data_type(boolean))
        keep = keeps[0]
        if len(keeps) == 2:
            keep = self.logical_and(keeps[0], keeps[1], name=called("band")).set_data_type(boolean)
        s = self.binary_select(s, _LOWEST, keep, name=called("mask")).set_data_type(f32)
    rows = [int(d) for d in q.dim[:3]] + [1]
    peak = self.reduction(s, mode="MAX", name=called("max")).set_dim(rows).set_data_type(f32)
    e = self.exp(self.sub(s, peak, name=called("shift")).set_data_type(f32), name=called("exp")).set_data_type(f32)
    total = self.reduction(e, mode="ADD", name=called("sum")).set_dim(rows).set_data_type(f32)
    p = self.div(e, total, name=called("softmax")).set_data_type(f32)
    stats = None
    if generate_stats:
        lse = self.log(total, name=called("log_sum")).set_data_type(f32)
        stats = self.add(peak, lse, name=called("stats")).set_data_type(f32)
    one = [1, 1, 1, 1]
    amax_s = self.reduction(p, mode="AMAX", name=called("amax_s")).set_dim(one).set_data_type(f32) if amax else None
    p8 = self.identity(scaled(p, scale_s, "scale_s"), name=called("quantize_s")).set_data_type(q_type)
    o = self.matmul(p8, v, compute_data_type=f32, name=called("bmm2")).set_data_type(f32)
    o = scaled(scaled(o, descale_s, "descale_s"), descale_v, "descale_v")
    amax_o = self.reduction(o, mode="AMAX", name=called("amax_o")).set_dim(one).set_data_type(f32) if amax else None
    out = self.identity(scaled(o, scale_o, "scale_o"), name=called("o"))
    return [out, stats, amax_s, amax_o]


def _bounds(band: dict[str, Any], sq: int, skv: int, label: str) -> tuple[int | None, int | None, int]:
    """(left, right, delta) of the band (`band_fields`' normalized fields); a band that leaves a query row
    with no key is refused, as cuDNN refuses it."""
    bottom_right = (
        band["use_causal_mask_bottom_right"] or band.get("diagonal_alignment") is DiagonalAlignment.BOTTOM_RIGHT
    )
    right = (
        0 if band["use_causal_mask"] or band["use_causal_mask_bottom_right"] else band.get("diagonal_band_right_bound")
    )
    left = band["sliding_window_length"]
    delta = skv - sq if bottom_right else 0
    rows = np.arange(sq)
    first = np.maximum(rows + delta - left + 1, 0) if left is not None else np.zeros(sq, dtype=np.int64)
    last = np.minimum(rows + delta + right, skv - 1) if right is not None else np.full(sq, skv - 1)
    empty = np.flatnonzero(first > last)
    if empty.size:
        raise UnsupportedGraphError(
            f"the band leaves {empty.size} query row(s) with no key (the first: {int(empty[0])}; S_q={sq}, "
            f"S_kv={skv}): cuDNN refuses such bands in sdpa_fp8",
            op=label,
            rule="sdpa_fp8.rows_without_keys",
            hint="slice Q to the rows that see keys, or widen the band; g.sdpa runs such bands (O 0 on empty rows)",
        )
    return left, right, delta


def _check(g: Any, q: Any, k: Any, v: Any, compute: Any, label: str) -> DataType:
    """Typed refusals: 4-D fp8 tensors of declared dims, K and V heads equal to Q's or 1, FLOAT math.
    Returns Q's type (a tensor declared without one has the graph's io type)."""
    types = []
    for role, t in (("q", q), ("k", k), ("v", v)):
        dims = getattr(t, "dim", None)
        dt = getattr(t, "data_type", None) or g.io_data_type
        types.append(dt)
        if dims is None or len(dims) != 4:
            raise UnsupportedGraphError(
                f"{role} has dims {None if dims is None else list(dims)}; sdpa_fp8 takes 4-D [B, H, S, D] tensors "
                "with their dims declared",
                op=label,
                tensor=role,
                rule="sdpa_fp8.dims",
                hint=f"declare {role} with dim=[B, H, S, D]",
            )
        if dt not in _FP8:
            raise UnsupportedGraphError(
                f"{role} is {getattr(dt, 'name', dt)}; sdpa_fp8 takes FP8_E4M3 or FP8_E5M2 tensors",
                op=label,
                tensor=role,
                rule="sdpa_fp8.types",
                hint="use g.sdpa for 16- and 32-bit tensors, or quantize them to fp8 first",
            )
    if k.dim[1] not in (q.dim[1], 1) or v.dim[1] != k.dim[1]:
        raise UnsupportedGraphError(
            f"q has {q.dim[1]} heads, k {k.dim[1]} and v {v.dim[1]}; sdpa_fp8 takes K and V with Q's heads or one",
            op=label,
            rule="sdpa_fp8.heads",
            hint="repeat K and V's heads to Q's (grouped-query heads run in g.sdpa)",
        )
    if compute not in (None, DataType.FLOAT):
        raise AttributeValueError(
            f"compute_data_type={compute!r}: sdpa_fp8 computes in FLOAT",
            op=label,
            rule="sdpa_fp8.compute",
            hint="leave compute_data_type unset or FLOAT",
        )
    return types[0]
