"""Builders of the attention ops (`g.sdpa`, `g.sdpa_backward`: cuDNN frontend's names and keywords) and
the normalization of their arguments (the band's two spellings, dropout tuples, declared outputs).
The ops, their rules and semantics: attention.py."""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from ..core.errors import AttributeValueError, ShapeError
from ..core.op import graph_method
from ..core.symbolic import Expr
from ..core.tensor import Tensor
from .attention import DiagonalAlignment, Sdpa, SdpaBackward
from .score_mod import ScoreMod, record


def _dropout(dropout: Any, label: str, backward: bool) -> tuple[float | None, list[Any]]:
    """(p, [seed, offset, mask, scale, scale_inv]) from the cuDNN-style dropout tuple."""
    none = [None] * 5
    if dropout is None:
        return None, none
    forms = "(p, seed, offset) or (mask, scale)" + (" or (mask, scale, scale_inv)" if backward else "")
    if not isinstance(dropout, (tuple, list)) or len(dropout) not in (2, 3):
        raise AttributeValueError(
            f"dropout={dropout!r} is not {forms}",
            op=label,
            rule="sdpa.dropout",
            hint=f"pass dropout as a tuple {forms}",
        )
    first = dropout[0]
    if len(dropout) == 3 and isinstance(first, numbers.Real) and not isinstance(first, bool):
        p = float(first)
        if not 0.0 <= p < 1.0:
            raise AttributeValueError(
                f"dropout probability {p} is outside [0, 1)",
                op=label,
                rule="sdpa.dropout",
                hint="pass 0 <= p < 1 (the probability of dropping an element)",
            )
        return p, [dropout[1], dropout[2], None, None, None]
    if isinstance(first, Tensor) and (len(dropout) == 2 or backward):
        return None, [None, None, first, dropout[1], dropout[2] if len(dropout) == 3 else None]
    raise AttributeValueError(
        f"dropout={dropout!r} is not {forms}",
        op=label,
        rule="sdpa.dropout",
        hint=f"pass dropout as a tuple {forms} (mask is a tensor)",
    )


def as_alignment(value: Any, label: str) -> DiagonalAlignment:
    """A DiagonalAlignment from itself, its name or value (any case), or cuDNN's 0 / 1."""
    if isinstance(value, DiagonalAlignment):
        return value
    if isinstance(value, str):
        for a in DiagonalAlignment:
            if value.lower() in (a.value, a.name.lower()):
                return a
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value in (0, 1):
        return (DiagonalAlignment.TOP_LEFT, DiagonalAlignment.BOTTOM_RIGHT)[int(value)]
    name = getattr(value, "name", None)
    if isinstance(name, str) and name in DiagonalAlignment.__members__:
        return DiagonalAlignment[name]
    raise AttributeValueError(
        f"diagonal_alignment={value!r} is not TOP_LEFT or BOTTOM_RIGHT",
        op=label,
        rule="sdpa.band",
        hint="pass opgraph.DiagonalAlignment.TOP_LEFT or BOTTOM_RIGHT",
    )


def _int_or_none(value: Any, what: str, label: str, low: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise AttributeValueError(
            f"{what}={value!r} is not an int >= {low}",
            op=label,
            rule="sdpa.band",
            hint=f"pass {what} as an int >= {low}, or None for no bound",
        )
    return int(value)


def band_fields(
    label: str,
    use_causal_mask: bool = False,
    use_causal_mask_bottom_right: bool = False,
    sliding_window_length: Any = None,
    diagonal_alignment: Any = DiagonalAlignment.TOP_LEFT,
    diagonal_band_left_bound: Any = None,
    diagonal_band_right_bound: Any = None,
) -> dict[str, Any]:
    """The op's band fields from either spelling (cuDNN's deprecated causal flags and sliding window,
    or the band), normalized: what the causal flags and sliding_window_length can say is said there."""
    if sliding_window_length is not None and diagonal_band_left_bound is not None:
        raise AttributeValueError(
            "sliding_window_length and diagonal_band_left_bound are both set",
            op=label,
            rule="sdpa.band",
            hint="they are one bound: pass one of them",
        )
    right = _int_or_none(diagonal_band_right_bound, "diagonal_band_right_bound", label, 0)
    if (use_causal_mask or use_causal_mask_bottom_right) and right is not None:
        raise AttributeValueError(
            "a causal flag and diagonal_band_right_bound are both set",
            op=label,
            rule="sdpa.band",
            hint="a causal mask is right bound 0: pass one of the two",
        )
    left_name = "sliding_window_length" if sliding_window_length is not None else "diagonal_band_left_bound"
    left = sliding_window_length if sliding_window_length is not None else diagonal_band_left_bound
    if left is not None and (isinstance(left, bool) or not isinstance(left, (int, np.integer)) or left < 1):
        raise AttributeValueError(
            f"{left_name}={left!r} is not a positive int",
            op=label,
            rule="sdpa.sliding_window",
            hint="pass the window length W >= 1 (keys i-W < j <= i)",
        )
    align = as_alignment(diagonal_alignment, label)
    if use_causal_mask and use_causal_mask_bottom_right:  # (the op's check names it)
        return {
            "use_causal_mask": True,
            "use_causal_mask_bottom_right": True,
            "sliding_window_length": None if left is None else int(left),
        }
    if use_causal_mask:
        align, right = DiagonalAlignment.TOP_LEFT, 0
    elif use_causal_mask_bottom_right:
        align, right = DiagonalAlignment.BOTTOM_RIGHT, 0
    bottom_right = align is DiagonalAlignment.BOTTOM_RIGHT
    flag_br = right == 0 and bottom_right
    keep_align = bottom_right and not flag_br and (left is not None or right is not None)
    return {
        "use_causal_mask": right == 0 and not bottom_right,
        "use_causal_mask_bottom_right": flag_br,
        "sliding_window_length": None if left is None else int(left),
        "diagonal_alignment": DiagonalAlignment.BOTTOM_RIGHT if keep_align else DiagonalAlignment.TOP_LEFT,
        "diagonal_band_right_bound": None if right in (None, 0) else right,
    }


def _score_mod(g: Any, score_mod: Any, label: str, dims: tuple[int, ...] | None) -> tuple[ScoreMod | None, list[Any]]:
    """A user's modifier function recorded, or an already recorded (ScoreMod, inputs) pair."""
    if score_mod is None:
        return None, []
    if isinstance(score_mod, tuple) and len(score_mod) == 2 and isinstance(score_mod[0], ScoreMod):
        return score_mod[0], list(score_mod[1])
    return record(g, score_mod, label, dims)


def _known(t: Any) -> tuple[int, ...] | None:
    return tuple(t.dim) if isinstance(t, Tensor) and t.dim is not None else None


def _score_dims(q, k, seq_len_q, q_off, k_off, table, max_q, max_kv) -> tuple[int, ...] | None:
    """The scores' dims [B, Hq, Sq, Skv] from the handles, where their dims are known (for recording a
    score modifier; the op's inference is the authority)."""
    qd, kd = _known(q), _known(k)
    if qd is None or kd is None or len(qd) != 4 or len(kd) != 4:
        return None
    if q_off is not None:
        ld = _known(seq_len_q)
        if ld is None or max_q is None:
            return None
        b, sq = ld[0], int(max_q)
    else:
        b, sq = qd[0], qd[2]
    if table is not None:
        td = _known(table)
        skv = max_kv if max_kv is not None else (td[2] * kd[2] if td is not None else None)
    else:
        skv = max_kv if k_off is not None else kd[2]
    if skv is None:
        return None
    return (b, qd[1], sq, skv if isinstance(skv, Expr) else int(skv))  # type: ignore[return-value]


def _declared(g: Any, value: Any, role: str, label: str) -> Tensor | None:
    """An output tensor the caller declared (dBias, score_max, ...)."""
    if value is not None and not (isinstance(value, Tensor) and value.graph is g):
        raise ShapeError(
            f"{role} must be a tensor of this graph, got {type(value).__name__}",
            op=label,
            rule="sdpa_backward.dbias" if role == "dBias" else f"sdpa.{role}",
            hint=f"declare {role} with g.tensor(dim=...) and pass it",
        )
    return value


def stats_flag(generate_stats: Any, is_inference: Any, label: str) -> bool:
    """generate_stats from itself or cuDNN's deprecated is_inference (its negation); default True."""
    if generate_stats is not None and is_inference is not None and bool(generate_stats) == bool(is_inference):
        raise AttributeValueError(
            f"generate_stats={generate_stats} and is_inference={is_inference} disagree",
            op=label,
            rule="sdpa.generate_stats",
            hint="pass generate_stats only (is_inference is its deprecated negation)",
        )
    if generate_stats is not None:
        return bool(generate_stats)
    return True if is_inference is None else not bool(is_inference)


def _new_output(g: Any, name: str) -> Tensor:
    t = Tensor(g, name=name, is_virtual=True)
    g._tensors.append(t)
    return t


@graph_method
def sdpa(
    self,
    q,
    k,
    v,
    attn_scale=None,
    generate_stats=None,
    bias=None,
    use_alibi_mask=False,
    use_padding_mask=False,
    seq_len_q=None,
    seq_len_kv=None,
    use_causal_mask=False,
    use_causal_mask_bottom_right=False,
    sliding_window_length=None,
    dropout=None,
    score_mod=None,
    compute_data_type=None,
    name="",
    *,
    is_inference=None,
    diagonal_alignment=DiagonalAlignment.TOP_LEFT,
    diagonal_band_left_bound=None,
    diagonal_band_right_bound=None,
    rng_dump=None,
    q_ragged_offset=None,
    k_ragged_offset=None,
    v_ragged_offset=None,
    o_ragged_offset=None,
    stats_ragged_offset=None,
    max_seq_len_q=None,
    max_seq_len_kv=None,
    paged_attention_k_table=None,
    paged_attention_v_table=None,
    paged_attention_k_table_ragged_offset=None,
    paged_attention_v_table_ragged_offset=None,
    paged_attention_max_seq_len_kv=None,
    sink_token=None,
    score_max=None,
    score_sum_exp=None,
    block_mask=None,
    empty_row_stats="+inf",
):
    """Scaled dot-product attention (cuDNN frontend's `sdpa`): [O, Stats].

    Shapes: q [B, Hq, Sq, D], k [B, Hk, Skv, D], v [B, Hv, Skv, Dv] (dims logical); GQA/MQA when Hk and
    Hv divide Hq; O [B, Hq, Sq, Dv]; Stats [B, Hq, Sq, 1]. Packed (THD) tensors are [1, H, T, D] with a
    ragged offset; paged k/v are containers [pages, H, block, D] with a page table (below).

    Layouts: any strides with the last one 1, so BSHD and BHSD tensors both work; O takes q's axis order.

    Types: q, k, v HALF, BFLOAT16, FLOAT or DOUBLE; softmax and accumulation in `compute_data_type`
    (default FLOAT); Stats FLOAT (DOUBLE for DOUBLE inputs).

    Formula: `S = attn_scale * q @ k^T + bias (+ alibi)`, `S = score_mod(S)`, masked positions -inf,
    `P = softmax(S)` over keys and the sink logit (then dropout), `O = P @ v`; `Stats = logsumexp(S)` per
    row (natural log). A row with every key masked and no sink gives O = 0 and Stats = `empty_row_stats`
    (+inf), not NaN. docs/attention.md has the exact definitions of every mask and of the dropout stream.

    Args:
        q: queries.
        k: keys (a paged cache's container when paged_attention_k_table is given).
        v: values (likewise).
        attn_scale: a number, a pass-by-value or a 1-element tensor read at run time (default 1.0, as cuDNN).
        generate_stats: also output Stats (what the backward needs); False for inference (default True).
        bias: an additive bias broadcastable to [B, Hq, Sq, Skv] (optional).
        use_alibi_mask: add ALiBi's per-head linear position bias.
        use_padding_mask: keep only i < seq_len_q[b] and j < seq_len_kv[b].
        seq_len_q: INT32 (or INT64) [B, 1, 1, 1], the valid query length per batch (with use_padding_mask).
        seq_len_kv: INT32 (or INT64) [B, 1, 1, 1], the valid key length per batch (with use_padding_mask).
        use_causal_mask: keep j <= i (top-left aligned): the band with right bound 0.
        use_causal_mask_bottom_right: keep j <= i + (Skv - Sq) (bottom-right aligned, with actual lengths).
        sliding_window_length: W, keep j > i + delta - W as well (the band's left bound).
        dropout: (p, seed, offset) with seed and offset non-negative integers: 1-element INT64 (or INT32)
            tensors read at run time, pass-by-value INT64 tensors (host values, cuDNN's
            is_pass_by_value) or Python ints (Philox; docs/attention.md defines the stream), or
            (mask, scale) with an explicit mask tensor.
        score_mod: a function `score_mod(g, score) -> tensor` building pointwise ops on the virtual score
            [B, H, Sq, Skv] (g.gen_index gives positions; other graph tensors broadcast in); fused into
            the kernel and allowed with every mask.
        compute_data_type: the softmax's type.
        name: the op's name.
        is_inference: cuDNN's deprecated negation of generate_stats (give one of the two).
        diagonal_alignment: TOP_LEFT (delta 0) or BOTTOM_RIGHT (delta = skv_b - sq_b) for the band.
        diagonal_band_left_bound: L >= 1: keep j > i + delta - L (sliding_window_length's other name).
        diagonal_band_right_bound: R >= 0: keep j <= i + delta + R (0 is causal).
        rng_dump: a FLOAT [B, Hq, Sq, Skv] tensor you declare; the Philox dropout's keep mask (1 or 0).
        q_ragged_offset: integer [B(+1), 1, 1, 1]: q is packed [1, Hq, T, D], sequence b in rows
            q_ragged_offset[b] .. + seq_len_q[b] - 1 of axis 2 (needs use_padding_mask and max_seq_len_q).
        k_ragged_offset: the same for a packed k (needs max_seq_len_kv).
        v_ragged_offset: the same for a packed v.
        o_ragged_offset: write O packed, [1, Hq, T, Dv] (rows no sequence covers are 0).
        stats_ragged_offset: write Stats (and score_max, score_sum_exp) packed, [1, Hq, T, 1].
        max_seq_len_q: Sq of packed queries (the padded dims of the scores).
        max_seq_len_kv: Skv of packed or paged keys (paged default: pages per sequence * block).
        paged_attention_k_table: integer page table [B, 1, P, 1]: key j of sequence b is row j % block of
            page table[b, 0, j // block, 0] of the container k [pages, Hk, block, D].
        paged_attention_v_table: the same for v.
        paged_attention_k_table_ragged_offset: a packed k page table [1, 1, T, 1]: sequence b's pages
            start at this row.
        paged_attention_v_table_ragged_offset: the same for v's table.
        paged_attention_max_seq_len_kv: cuDNN's name for max_seq_len_kv of paged caches.
        sink_token: FLOAT [1, Hq, 1, 1]: a logit per head that joins every row's softmax without a value.
        score_max: a FLOAT tensor you declare (Stats' dims): the row max m of the softmax (with the sink).
        score_sum_exp: a FLOAT tensor you declare: the row sum of exp(s - m) (with the sink).
        block_mask: UINT8 [B, Hq, ceil(Sq/128), ceil(ceil(Skv/128)/8)]: bit (j//128) % 8 of byte
            [b, h, i//128, j//1024] keeps the 128x128 score tile of (i, j).
        empty_row_stats: "+inf" (opgraph's) or "-inf" (cuDNN's since 9.14): Stats of a row with nothing kept.

    Returns:
        [O, Stats]; Stats is None when generate_stats is False.

    Example:
        ```python
        q = g.tensor(dim=[4, 16, 1024, 128], name="q", data_type=og.DataType.BFLOAT16)
        k = g.tensor(dim=[4, 16, 1024, 128], name="k", data_type=og.DataType.BFLOAT16)
        v = g.tensor(dim=[4, 16, 1024, 128], name="v", data_type=og.DataType.BFLOAT16)
        o, stats = g.sdpa(q, k, v, attn_scale=128 ** -0.5, use_causal_mask=True,
                          score_mod=lambda g, s: g.mul(g.tanh(g.mul(s, 1 / 30.0)), 30.0))
        ```
    """
    label = f"sdpa '{name or 'sdpa'}'"
    wants_stats = stats_flag(generate_stats, is_inference, label)
    opts = band_fields(
        label,
        use_causal_mask,
        use_causal_mask_bottom_right,
        sliding_window_length,
        diagonal_alignment,
        diagonal_band_left_bound,
        diagonal_band_right_bound,
    )
    max_kv = _paged_max(max_seq_len_kv, paged_attention_max_seq_len_kv, label)
    p, (seed, offset, mask, scale, _) = _dropout(dropout, label, backward=False)
    dims = _score_dims(
        q, k, seq_len_q, q_ragged_offset, k_ragged_offset, paged_attention_k_table, max_seq_len_q, max_kv
    )
    mod, extra = _score_mod(self, score_mod, label, dims)
    op = Sdpa(
        **opts,
        use_alibi_mask=bool(use_alibi_mask),
        use_padding_mask=bool(use_padding_mask),
        dropout_probability=p,
        score_mod=mod,
        max_seq_len_q=_opt_int(max_seq_len_q),
        max_seq_len_kv=max_kv,
        empty_row_stats=str(empty_row_stats),
    )
    inputs = [
        q,
        k,
        v,
        attn_scale,
        bias,
        seq_len_q,
        seq_len_kv,
        seed,
        offset,
        mask,
        scale,
        q_ragged_offset,
        k_ragged_offset,
        v_ragged_offset,
        o_ragged_offset,
        stats_ragged_offset,
        paged_attention_k_table,
        paged_attention_v_table,
        paged_attention_k_table_ragged_offset,
        paged_attention_v_table_ragged_offset,
        sink_token,
        block_mask,
        *extra,
    ]
    nm = name or f"sdpa_{len(self._records)}"
    o = _new_output(self, f"{nm}::o")
    stats = _new_output(self, f"{nm}::stats") if wants_stats else None
    declared = [
        _declared(self, t, r, label)
        for t, r in ((score_max, "score_max"), (score_sum_exp, "score_sum_exp"), (rng_dump, "rng_dump"))
    ]
    self._add_op(op, inputs, name=nm, compute_data_type=compute_data_type, out_handles=[o, stats, *declared])
    return [o, stats]


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _paged_max(max_seq_len_kv: Any, paged: Any, label: str) -> int | None:
    if max_seq_len_kv is not None and paged is not None and int(max_seq_len_kv) != int(paged):
        raise AttributeValueError(
            f"max_seq_len_kv={max_seq_len_kv} and paged_attention_max_seq_len_kv={paged} differ",
            op=label,
            rule="sdpa.max_seq_len",
            hint="they are one attribute: pass one",
        )
    value = max_seq_len_kv if max_seq_len_kv is not None else paged
    return _opt_int(value)


@graph_method
def sdpa_backward(
    self,
    q,
    k,
    v,
    o,
    dO,
    stats,
    attn_scale=None,
    bias=None,
    dBias=None,
    use_alibi_mask=False,
    use_padding_mask=False,
    seq_len_q=None,
    seq_len_kv=None,
    use_causal_mask=False,
    use_causal_mask_bottom_right=False,
    sliding_window_length=None,
    dropout=None,
    score_mod=None,
    use_deterministic_algorithm=False,
    compute_data_type=None,
    name="",
    *,
    diagonal_alignment=DiagonalAlignment.TOP_LEFT,
    diagonal_band_left_bound=None,
    diagonal_band_right_bound=None,
    q_ragged_offset=None,
    k_ragged_offset=None,
    v_ragged_offset=None,
    o_ragged_offset=None,
    dO_ragged_offset=None,
    stats_ragged_offset=None,
    dQ_ragged_offset=None,
    dK_ragged_offset=None,
    dV_ragged_offset=None,
    max_seq_len_q=None,
    max_seq_len_kv=None,
    sink_token=None,
    dSink_token=None,
    block_mask=None,
):
    """The backward of `sdpa` (cuDNN frontend's `sdpa_backward`): [dQ, dK, dV], and dBias / dSink_token
    when given.

    Shapes: as sdpa; o and dO [B, Hq, Sq, Dv], stats [B, Hq, Sq, 1]; dQ, dK, dV take the dims of q, k, v;
    dBias the dims of bias; dSink_token [1, Hq, 1, 1]. Packed tensors as in sdpa (paged caches are
    for the forward only).

    Layouts: any strides with the last one 1; the gradients take their inputs' axis order.

    Types: as sdpa; accumulation in FLOAT.

    Formula: with P recomputed from q, k and stats, `dV = P^T @ dO`, `dP = dO @ v^T`,
    `dS = P * (dP - rowsum(dO * o))`, times d score_mod / d S when a modifier is given (derived from the
    pointwise ops' backward rules), `dQ = attn_scale * dS @ k`, `dK = attn_scale * dS^T @ q` (summed over
    the query heads of a group), `dBias = dS` reduced to bias's dims,
    `dSink = -sum over rows of exp(sink - stats) * rowsum(dO * o)`.

    Args:
        q: queries of the forward.
        k: keys of the forward.
        v: values of the forward.
        o: the forward's output.
        dO: the gradient arriving at o.
        stats: the forward's Stats.
        attn_scale: as in sdpa.
        dBias: a tensor you declare with the bias's dims; the op writes the bias's gradient into it.
        bias: an additive bias broadcastable to [B, Hq, Sq, Skv] (optional).
        use_alibi_mask: add ALiBi's per-head linear position bias.
        use_padding_mask: keep only i < seq_len_q[b] and j < seq_len_kv[b].
        seq_len_q: INT32 (or INT64) [B, 1, 1, 1], the valid query length per batch (with use_padding_mask).
        seq_len_kv: INT32 (or INT64) [B, 1, 1, 1], the valid key length per batch (with use_padding_mask).
        use_causal_mask: keep j <= i (top-left aligned).
        use_causal_mask_bottom_right: keep j <= i + (Skv - Sq) (bottom-right aligned, with actual lengths).
        sliding_window_length: W, keep j > i + delta - W as well (delta 0 top-left, Skv - Sq bottom-right).
        dropout: (p, seed, offset) with seed and offset non-negative integers: 1-element INT64 (or INT32)
            tensors read at run time, pass-by-value INT64 tensors (host values, cuDNN's
            is_pass_by_value) or Python ints (Philox; docs/attention.md defines the stream), or
            (mask, scale) with an explicit mask tensor.
        score_mod: a function `score_mod(g, score) -> tensor` building pointwise ops on the virtual score
            [B, H, Sq, Skv] (g.gen_index gives positions; other graph tensors broadcast in); fused into
            the kernel and allowed with every mask.
        use_deterministic_algorithm: accepted for cuDNN compatibility; the generated kernels are always
            deterministic (no atomics).
        compute_data_type: the accumulation type.
        name: the op's name.
        diagonal_alignment: as in sdpa.
        diagonal_band_left_bound: as in sdpa.
        diagonal_band_right_bound: as in sdpa.
        q_ragged_offset: as in sdpa (packed q); dQ is then packed the same way unless dQ_ragged_offset says.
        k_ragged_offset: as in sdpa (packed k; dK likewise).
        v_ragged_offset: as in sdpa (packed v; dV likewise).
        o_ragged_offset: packed o (dO likewise unless dO_ragged_offset says).
        dO_ragged_offset: packed dO.
        stats_ragged_offset: packed stats.
        dQ_ragged_offset: write dQ packed at these rows.
        dK_ragged_offset: write dK packed.
        dV_ragged_offset: write dV packed.
        max_seq_len_q: Sq of packed queries.
        max_seq_len_kv: Skv of packed keys.
        sink_token: the forward's sink logits [1, Hq, 1, 1].
        dSink_token: a FLOAT [1, Hq, 1, 1] tensor you declare; the op writes the sink's gradient.
        block_mask: as in sdpa.

    Returns:
        [dQ, dK, dV].

    Example:
        ```python
        o, stats = g.sdpa(q, k, v, attn_scale=0.125, use_causal_mask=True)
        do = g.tensor(dim=[4, 16, 1024, 128], name="dO", data_type=og.DataType.BFLOAT16)
        dq, dk, dv = g.sdpa_backward(q, k, v, o, do, stats, attn_scale=0.125, use_causal_mask=True)
        ```
    """
    label = f"sdpa_backward '{name or 'sdpa_backward'}'"
    opts = band_fields(
        label,
        use_causal_mask,
        use_causal_mask_bottom_right,
        sliding_window_length,
        diagonal_alignment,
        diagonal_band_left_bound,
        diagonal_band_right_bound,
    )
    p, (seed, offset, mask, scale, scale_inv) = _dropout(dropout, label, backward=True)
    dims = _score_dims(q, k, seq_len_q, q_ragged_offset, k_ragged_offset, None, max_seq_len_q, max_seq_len_kv)
    mod, extra = _score_mod(self, score_mod, label, dims)
    mod_grad = None
    if mod is not None:
        from ..autodiff.score_mod import derivative  # lazy: autodiff is a layer above ops

        mod_grad = derivative(mod, label)
    op = SdpaBackward(
        **opts,
        use_alibi_mask=bool(use_alibi_mask),
        use_padding_mask=bool(use_padding_mask),
        dropout_probability=p,
        score_mod=mod,
        score_mod_grad=mod_grad,
        use_deterministic_algorithm=bool(use_deterministic_algorithm),
        max_seq_len_q=_opt_int(max_seq_len_q),
        max_seq_len_kv=_opt_int(max_seq_len_kv),
    )
    offsets = [
        q_ragged_offset,
        k_ragged_offset,
        v_ragged_offset,
        o_ragged_offset,
        o_ragged_offset if dO_ragged_offset is None else dO_ragged_offset,
        stats_ragged_offset,
        q_ragged_offset if dQ_ragged_offset is None else dQ_ragged_offset,
        k_ragged_offset if dK_ragged_offset is None else dK_ragged_offset,
        v_ragged_offset if dV_ragged_offset is None else dV_ragged_offset,
    ]
    inputs = [
        q,
        k,
        v,
        o,
        dO,
        stats,
        attn_scale,
        bias,
        seq_len_q,
        seq_len_kv,
        seed,
        offset,
        mask,
        scale,
        scale_inv,
        *offsets,
        sink_token,
        block_mask,
        *extra,
    ]
    dBias = _declared(self, dBias, "dBias", label)
    dSink_token = _declared(self, dSink_token, "dSink_token", label)
    nm = name or f"sdpa_backward_{len(self._records)}"
    handles = [_new_output(self, f"{nm}::{role}") for role in ("dQ", "dK", "dV")]
    self._add_op(op, inputs, name=nm, compute_data_type=compute_data_type, out_handles=[*handles, dBias, dSink_token])
    return handles
