"""Scaled dot-product attention: `sdpa` (forward) and `sdpa_backward`, with cuDNN frontend's names.

    O, Stats = g.sdpa(q, k, v, attn_scale=None, generate_stats=True, bias=None, use_alibi_mask=False,
                      use_padding_mask=False, seq_len_q=None, seq_len_kv=None, use_causal_mask=False,
                      use_causal_mask_bottom_right=False, sliding_window_length=None,
                      diagonal_alignment=TOP_LEFT, diagonal_band_left_bound=None,
                      diagonal_band_right_bound=None, dropout=None, rng_dump=None, score_mod=None,
                      q_ragged_offset=None, ..., paged_attention_k_table=None, ..., sink_token=None,
                      score_max=None, score_sum_exp=None, block_mask=None, compute_data_type=None, name="")
    dQ, dK, dV = g.sdpa_backward(q, k, v, o, dO, stats, attn_scale=None, bias=None, dBias=None,
                                 <the same masks, ragged offsets, sink_token>, dSink_token=None,
                                 dropout=None, score_mod=None, use_deterministic_algorithm=False,
                                 compute_data_type=None, name="")

Dense tensors: q [B, Hq, Sq, D], k [B, Hk, Skv, D], v [B, Hv, Skv, Dv] (logical dims; the layout is the
strides, so BSHD and BHSD both work); Hk and Hv divide Hq (GQA / MQA). O [B, Hq, Sq, Dv] keeps q's layout;
Stats FP32 [B, Hq, Sq, 1].

Packed (ragged, THD) tensors: [1, H, T, D] with a ragged offset [B(+1), 1, 1, 1] (integer): sequence b is
the rows (tokens) offset[b] .. offset[b] + seq_len[b] - 1 of axis 2; Sq / Skv are then the attributes
max_seq_len_q / max_seq_len_kv and B the lengths' batch. Paged caches: k (or v) is a container
[pages, H, block, D] read through a page table [B, 1, P, 1] (or a packed one [1, 1, T, 1] with its ragged
offset). The formulas are in attention_ref.py and docs/attention.md.

dropout: ``(p, seed, offset)`` (Philox; seed and offset non-negative integers: 1-element INT64 or INT32
tensors read at run time, pass-by-value INT64 or INT32 tensors (host values, exact: `integer_inputs`)
or Python ints) or ``(mask, scale)`` (an explicit mask broadcast to [B, Hq, Sq, Skv], times scale);
the backward also takes cuDNN's ``(mask, scale, scale_inv)``. score_mod: see score_mod.py. dBias,
dSink_token, score_max, score_sum_exp and rng_dump are tensors the caller declares and the op writes,
as in cuDNN.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ..core.dtypes import DataType
from ..core.errors import AttributeValueError, DataTypeError, ShapeError, expect
from ..core.op import NodeContext, Op, TensorSpec, register_op
from ..core.tensor import TensorDesc, packed_strides
from . import attention_checks as checks
from . import attention_layout as layout
from . import attention_ref as ref
from .attention_layout import BWD_RAGGED, FWD_RAGGED, KV_SIDE, Feature, Geometry, extensions, features, ragged_role
from .base import strides_like
from .score_mod import ScoreMod, evaluate


class DiagonalAlignment(enum.Enum):
    """Where the diagonal of the band mask runs: through (0, 0) (TOP_LEFT) or through the last query
    and the last key of each sequence (BOTTOM_RIGHT: delta = skv_b - sq_b)."""

    TOP_LEFT = "top_left"
    BOTTOM_RIGHT = "bottom_right"


EMPTY_ROW_STATS = {"+inf": math.inf, "-inf": -math.inf}  # the Stats of a row with no key kept

_MASK_IN = (
    "attn_scale",
    "bias",
    "seq_len_q",
    "seq_len_kv",
    "dropout_seed",
    "dropout_offset",
    "dropout_mask",
    "dropout_scale",
)
_PAGED = (
    "paged_attention_k_table",
    "paged_attention_v_table",
    "paged_attention_k_table_ragged_offset",
    "paged_attention_v_table_ragged_offset",
)
_EXTRA = ("sink_token", "block_mask")
_FWD_IN = ("q", "k", "v", *_MASK_IN, *(f"{r}_ragged_offset" for r in FWD_RAGGED), *_PAGED, *_EXTRA)
_BWD_IN = (
    "q",
    "k",
    "v",
    "o",
    "dO",
    "stats",
    *_MASK_IN,
    "dropout_scale_inv",
    *(f"{r}_ragged_offset" for r in BWD_RAGGED),
    *_EXTRA,
)
_SCALARS = frozenset({"attn_scale", "dropout_seed", "dropout_offset", "dropout_scale", "dropout_scale_inv"})
_PHILOX = frozenset({"dropout_seed", "dropout_offset"})
_ATTN_TYPES = (DataType.FLOAT, DataType.HALF, DataType.BFLOAT16, DataType.DOUBLE)
_LEN_TYPES = (DataType.INT32, DataType.INT64)


@dataclass(frozen=True, kw_only=True)
class _Attention(Op):
    """Attributes and checks shared by the forward and the backward op.

    The band mask is stored in the fields older files know where they say it (use_causal_mask is a
    top-left band with right bound 0, use_causal_mask_bottom_right a bottom-right one, and
    sliding_window_length the left bound); `diagonal_alignment` and `diagonal_band_right_bound` hold
    only what those cannot (the builders normalize to this form). `band` is the mask in one form."""

    use_alibi_mask: bool = False
    use_padding_mask: bool = False
    use_causal_mask: bool = False
    use_causal_mask_bottom_right: bool = False
    sliding_window_length: int | None = None
    diagonal_alignment: DiagonalAlignment = DiagonalAlignment.TOP_LEFT
    diagonal_band_right_bound: int | None = None
    dropout_probability: float | None = None  # the Philox form; the mask form has no attribute
    score_mod: ScoreMod | None = None
    max_seq_len_q: int | None = None  # Sq of packed queries
    max_seq_len_kv: int | None = None  # Skv of packed or paged keys and values
    # (role, n): the ragged offset of `role` counts elements, n a row (cuDNN's); without: rows
    ragged_offset_strides: tuple[tuple[str, int], ...] = ()

    BASE_INPUTS: ClassVar[tuple[str, ...]] = ()
    REQUIRED: ClassVar[frozenset[str]] = frozenset()

    def input_roles(self) -> tuple[str, ...]:
        return self.BASE_INPUTS + (self.score_mod.input_roles() if self.score_mod is not None else ())

    def optional_inputs(self) -> frozenset[str]:
        return frozenset(self.input_roles()) - self.REQUIRED

    def scalar_inputs(self) -> frozenset[str]:
        return _SCALARS

    def literal_inputs(self) -> frozenset[str]:
        """The scalars, and a score modifier's inputs, may be pass-by-value tensors (a soft-cap or a -inf
        a modifier reads, as cuDNN's flexible graphs pass them)."""
        return _SCALARS | frozenset(self.score_mod.input_roles() if self.score_mod is not None else ())

    def integer_inputs(self) -> frozenset[str]:
        """The Philox seed and offset: int64 values, exact over their whole range."""
        return _PHILOX

    def check_scalar(self, role: str, value: float) -> tuple[str, str, str] | None:
        return checks.philox_problem(role, int(value)) if role in _PHILOX else None

    def tuning_inputs(self, tensors: Mapping[str, TensorDesc]) -> dict[str, np.ndarray]:
        return layout.tuning_inputs(tensors, self.max_seq_len_q, self.max_seq_len_kv, self.offset_divisor)

    @property
    def bottom_right(self) -> bool:
        return self.use_causal_mask_bottom_right or self.diagonal_alignment is DiagonalAlignment.BOTTOM_RIGHT

    @property
    def right_bound(self) -> int | None:
        return 0 if (self.use_causal_mask or self.use_causal_mask_bottom_right) else self.diagonal_band_right_bound

    @property
    def masking(self) -> ref.Masking:
        return ref.Masking(self.use_padding_mask, self.bottom_right, self.sliding_window_length, self.right_bound)

    def offset_divisor(self, role: str) -> int:
        """What the ragged offset of `role` is divided by to give rows (see ragged_offset_strides)."""
        return dict(self.ragged_offset_strides).get(role, 1)

    # -- geometry ---------------------------------------------------------------------------------------
    def qkv(self, ctx: NodeContext) -> tuple[TensorDesc, TensorDesc, TensorDesc]:
        self.geometry(ctx)
        return ctx.tensor("q"), ctx.tensor("k"), ctx.tensor("v")

    def geometry(self, ctx: NodeContext) -> Geometry:
        """B, heads, Sq, Skv, head dims from q, k, v (packed, paged or dense) with their checks."""
        q, k, v = ctx.tensor("q"), ctx.tensor("k"), ctx.tensor("v")
        for role, t in (("q", q), ("k", k), ("v", v)):
            if len(t.dim) != 4:
                ctx.error(
                    ShapeError,
                    f"input '{role}' has rank {len(t.dim)} (dims {list(t.dim)}); attention takes rank-4 tensors",
                    tensor=role,
                    rule="sdpa.rank",
                    hint="give q [B, Hq, Sq, D], k [B, Hk, Skv, D], v [B, Hv, Skv, Dv] (logical dims; "
                    "a BSHD buffer is these dims with BSHD strides; packed tensors are [1, H, T, D])",
                )
        for role, t in (("q", q), ("k", k), ("v", v)):
            if t.data_type not in _ATTN_TYPES:
                ctx.error(
                    DataTypeError,
                    f"input '{role}' has data type {t.data_type.name}",
                    tensor=role,
                    rule="sdpa.dtype",
                    hint="attention takes HALF, BFLOAT16, FLOAT or DOUBLE q, k, v",
                )
        for role, t in (("k", k), ("v", v)):
            if t.data_type != q.data_type:
                ctx.error(
                    DataTypeError,
                    f"input '{role}' is {t.data_type.name} but q is {q.data_type.name}",
                    tensor=role,
                    rule="sdpa.dtype",
                    hint="give q, k and v one data type (a q, k or v computed in the graph is virtual and takes "
                    "the graph's intermediate_data_type unless you call set_data_type on it)",
                )
        packed = frozenset(r for r in ("q", "k", "v") if ctx.has(ragged_role(r)))
        paged = frozenset(r for r in ("k", "v") if ctx.has(f"paged_attention_{r}_table"))
        if packed & paged:
            role = sorted(packed & paged)[0]
            ctx.error(
                AttributeValueError,
                f"'{role}' is both packed and paged",
                tensor=role,
                rule="sdpa.paged",
                hint="give a paged cache its page table only (a page table may be packed itself)",
            )
        if "q" in packed:
            b = layout.packed_batch(ctx)
            sq = layout.max_len(ctx, "max_seq_len_q", self.max_seq_len_q, "q")
            layout.check_packed_dims(ctx, "q", q)
        else:
            b, sq = q.dim[0], q.dim[2]
            if self.max_seq_len_q is not None and self.max_seq_len_q != sq:
                ctx.error(
                    ShapeError,
                    f"max_seq_len_q={self.max_seq_len_q} but q (not packed) has {sq} queries",
                    rule="sdpa.max_seq_len",
                    hint="drop max_seq_len_q for a dense q",
                )
        lengths = {}
        for role, t in (("k", k), ("v", v)):
            if role in paged:
                lengths[role] = layout.paged_length(self.max_seq_len_kv, ctx, role, t, b)
            elif role in packed:
                layout.check_packed_dims(ctx, role, t)
                lengths[role] = layout.max_len(ctx, "max_seq_len_kv", self.max_seq_len_kv, role)
            else:
                if t.dim[0] != b:
                    ctx.error(
                        ShapeError,
                        f"input '{role}' has batch {t.dim[0]} but q has {b}",
                        tensor=role,
                        rule="sdpa.batch",
                        hint="q, k and v share the batch axis 0",
                    )
                lengths[role] = t.dim[2]
        if k.dim[3] != q.dim[3]:
            ctx.error(
                ShapeError,
                f"k has head dim {k.dim[3]} but q has {q.dim[3]}",
                tensor="k",
                rule="sdpa.head_dim",
                hint="q and k share the head dim D (axis 3); v's may differ",
            )
        if lengths["v"] != lengths["k"]:
            ctx.error(
                ShapeError,
                f"v has {lengths['v']} keys (axis 2) but k has {lengths['k']}",
                tensor="v",
                rule="sdpa.kv_length",
                hint="k and v share the sequence axis Skv (axis 2)",
            )
        for role, t in (("k", k), ("v", v)):
            if q.dim[1] % t.dim[1]:
                ctx.error(
                    ShapeError,
                    f"input '{role}' has {t.dim[1]} heads, which does not divide q's {q.dim[1]}",
                    tensor=role,
                    rule="sdpa.gqa",
                    hint="for grouped-query attention, give k and v a number of heads that divides q's "
                    "(query head h reads key head h // (Hq / Hk))",
                )
        return Geometry(b, q.dim[1], k.dim[1], v.dim[1], sq, lengths["k"], q.dim[3], v.dim[3], packed, paged)

    def score_dims(self, ctx: NodeContext) -> tuple[int, int, int, int]:
        return self.geometry(ctx).scores

    def row_dims(self, ctx: NodeContext, g: Geometry, role: str, width: int) -> tuple[int, ...]:
        """Dims of a query- or key-side tensor under `role` with `width` features: packed [1, H, T, w]
        when its ragged offset is given (T: the draft's, else q's or k's, else B * S), else dense."""
        heads = {"k": g.hk, "dK": g.hk, "v": g.hv, "dV": g.hv}.get(role, g.hq)
        if not ctx.has(ragged_role(role)):
            return (g.b, heads, g.rows(role), width)
        src = "k" if role in ("k", "dK") else "v" if role in ("v", "dV") else "q"
        t = ctx.tensor(src)
        tokens = t.dim[2] if src in g.packed else g.b * g.rows(role)
        return (1, heads, tokens, width)

    def check_rows(self, ctx: NodeContext, g: Geometry, role: str, width: int, layout: str | None = None) -> None:
        """An input or output under `role` lies as `row_dims` of `layout` (default: itself) says (a packed
        one with any T)."""
        layout = layout or role
        t = ctx.input(role) if role in self.input_roles() else ctx.output(role)
        dim = getattr(t, "dim", None)
        if dim is None:
            return
        want = self.row_dims(ctx, g, layout, width)
        packed = ctx.has(ragged_role(layout))
        ok = tuple(dim) == want or (packed and len(dim) == 4 and (dim[0], dim[1], dim[3]) == (1, want[1], want[3]))
        if not ok:
            shape = f"[1, {want[1]}, T, {want[3]}]" if packed else str(list(want))
            ctx.error(
                ShapeError,
                f"'{role}' has dims {list(dim)}, expected {shape}",
                tensor=role,
                rule="sdpa_backward.dims" if isinstance(self, SdpaBackward) else "sdpa.dims",
                hint="query-side tensors are [B, Hq, Sq, w] (packed: [1, Hq, T, w]), key-side [B, H, Skv, w]",
            )

    def check_broadcast(self, ctx: NodeContext, role: str, rule: str, what: str) -> None:
        t = ctx.input(role)
        if not isinstance(t, TensorDesc) or t.numel == 1 and role.startswith("score_mod"):
            return
        full = self.score_dims(ctx)
        if len(t.dim) != 4 or any(d not in (1, f) for d, f in zip(t.dim, full)):
            ctx.error(
                ShapeError,
                f"{what} '{role}' dims {list(t.dim)} do not broadcast to the scores [B, Hq, Sq, Skv] = {list(full)}",
                tensor=role,
                rule=rule,
                hint="give it rank 4 with each dim equal to the scores' or 1",
            )

    # -- checks -----------------------------------------------------------------------------------------
    def check_options(self, ctx: NodeContext) -> None:
        g = self.geometry(ctx)
        checks.check_band(self, ctx)
        if ctx.has("bias"):
            self.check_broadcast(ctx, "bias", "sdpa.bias_dims", "bias")
            if not ctx.tensor("bias").data_type.is_floating:
                ctx.error(
                    DataTypeError,
                    f"bias has data type {ctx.tensor('bias').data_type.name}",
                    tensor="bias",
                    rule="sdpa.dtype",
                    hint="give bias a floating-point type",
                )
        lens = [r for r in ("seq_len_q", "seq_len_kv") if ctx.has(r)]
        if self.use_padding_mask and len(lens) != 2:
            missing = [r for r in ("seq_len_q", "seq_len_kv") if r not in lens]
            ctx.error(
                ShapeError,
                f"use_padding_mask needs seq_len_q and seq_len_kv; {', '.join(missing)} missing",
                rule="sdpa.padding_mask",
                hint="pass both INT32 [B, 1, 1, 1] length tensors",
            )
        if lens and not self.use_padding_mask:
            ctx.error(
                AttributeValueError,
                f"{lens[0]} is given without use_padding_mask",
                tensor=lens[0],
                rule="sdpa.padding_mask",
                hint="set use_padding_mask=True, or drop the length tensors",
            )
        for role in lens:
            t = ctx.tensor(role)
            if t.dim != (g.b, 1, 1, 1) or t.data_type not in _LEN_TYPES:
                ctx.error(
                    ShapeError if t.dim != (g.b, 1, 1, 1) else DataTypeError,
                    f"{role} is {t.data_type.name} {list(t.dim)}, expected INT32 [{g.b}, 1, 1, 1]",
                    tensor=role,
                    rule="sdpa.seq_len",
                    hint="one INT32 (or INT64) length per batch entry, dims [B, 1, 1, 1]",
                )
        checks.check_packed(self, ctx, g)
        checks.check_extras(self, ctx, g)
        checks.check_dropout(self, ctx)
        checks.check_score_mod(self, ctx)

    # -- reference ------------------------------------------------------------------------------------
    def dense_geometry(self, a: dict[str, Any]) -> tuple[int, int, int]:
        """(B, Sq, Skv) at run time, from the arrays and the attributes (see `geometry`)."""
        q, k = a["q"], a["k"]
        b = np.asarray(a["seq_len_q"]).shape[0] if a.get("q_ragged_offset") is not None else q.shape[0]
        sq = (
            int(expect(self.max_seq_len_q, "max_seq_len_q of packed q"))
            if a.get("q_ragged_offset") is not None
            else q.shape[2]
        )
        table = a.get("paged_attention_k_table")
        if table is not None:
            skv = self.max_seq_len_kv if self.max_seq_len_kv is not None else table.shape[2] * k.shape[2]
        elif a.get("k_ragged_offset") is not None:
            skv = int(expect(self.max_seq_len_kv, "max_seq_len_kv of packed k"))
        else:
            skv = k.shape[2]
        return b, sq, int(skv)

    def dense_input(self, a: dict[str, Any], role: str, b: int, sq: int, skv: int) -> np.ndarray:
        """Input `role` in dense logical dims [B, H, S, w] (unpacked or unpaged)."""
        x = a[role]
        rows = skv if role in KV_SIDE else sq
        lens = a["seq_len_kv"] if role in KV_SIDE else a["seq_len_q"]
        table = a.get(f"paged_attention_{role}_table")
        if table is not None:
            toff = a.get(f"paged_attention_{role}_table_ragged_offset")
            pages = -(-rows // x.shape[2])
            tab = (
                ref.unpack(table, self._rows(toff, f"paged_attention_{role}_table"), None, b, pages)
                if toff is not None
                else table
            )
            return ref.unpage(x, tab.reshape(b, -1), rows)
        off = a.get(ragged_role(role))
        return ref.unpack(x, self._rows(off, role), lens, b, rows) if off is not None else x

    def dense_output(
        self, a: dict[str, Any], role: str, value: np.ndarray | None, out: TensorDesc | None
    ) -> np.ndarray | None:
        """A dense output in the dims of `out` (packed back when its ragged offset is given)."""
        if value is None or out is None:
            return None
        off = a.get(ragged_role(role))
        if off is None:
            return value
        lens = a["seq_len_kv"] if role in KV_SIDE else a["seq_len_q"]
        return ref.pack(value, self._rows(off, role), lens, out.dim[2])

    def _rows(self, offsets: np.ndarray, role: str) -> np.ndarray:
        div = self.offset_divisor(role)
        return offsets if div == 1 else np.floor_divide(np.asarray(offsets, dtype=np.float64), div)

    def scores(self, a: dict[str, Any], q: np.ndarray, k: np.ndarray) -> ref.Scores:
        modifier = None
        if self.score_mod is not None:
            extra = [a[r] for r in self.score_mod.input_roles()]
            modifier = lambda s: evaluate(self.score_mod, s, extra)
        return ref.scores(
            q,
            k,
            a["attn_scale"],
            a["bias"],
            self.use_alibi_mask,
            self.masking,
            a["seq_len_q"],
            a["seq_len_kv"],
            modifier,
            a.get("block_mask"),
            a.get("sink_token"),
        )

    def dropout(self, a: dict[str, Any], shape: tuple[int, ...]) -> np.ndarray | None:
        return ref.dropout_factor(
            shape,
            self.dropout_probability,
            a["dropout_seed"],
            a["dropout_offset"],
            a["dropout_mask"],
            a["dropout_scale"],
        )


@register_op
@dataclass(frozen=True, kw_only=True)
class Sdpa(_Attention):
    """O = softmax(mask(score_mod(attn_scale * q k^T + bias + alibi)), sink) (dropped out) @ v; Stats =
    the natural-log log-sum-exp of each row (`empty_row_stats` for a row with no key kept and no sink,
    whose O is 0); score_max / score_sum_exp the softmax's row max and sum; rng_dump the dropout mask."""

    kind = "sdpa"
    DYNAMIC = True
    BASE_INPUTS = _FWD_IN
    REQUIRED = frozenset({"q", "k", "v"})
    OUTPUTS = ("o", "stats", "score_max", "score_sum_exp", "rng_dump")
    empty_row_stats: str = "+inf"

    def infer(self, ctx: NodeContext) -> list[TensorSpec]:
        g = self.geometry(ctx)
        q = ctx.tensor("q")
        o = self.row_dims(ctx, g, "o", g.dv)
        draft = ctx.output("o")
        if ctx.has("o_ragged_offset") and draft is not None and draft.dim is not None:
            o = tuple(draft.dim)
        st_type = DataType.DOUBLE if q.data_type is DataType.DOUBLE else DataType.FLOAT
        stats = self.row_dims(ctx, g, "stats", 1)
        draft = ctx.output("stats")
        if ctx.has("stats_ragged_offset") and draft is not None and draft.dim is not None:
            stats = tuple(draft.dim)
        stats_stride = strides_like(stats, q) if ctx.has("stats_ragged_offset") else packed_strides(stats)
        return [
            TensorSpec(o, strides_like(o, q)),
            TensorSpec(stats, stats_stride, st_type),
            TensorSpec(stats, stats_stride, st_type),
            TensorSpec(stats, stats_stride, st_type),
            TensorSpec(g.scores, packed_strides(g.scores), DataType.FLOAT),
        ]

    def check(self, ctx: NodeContext) -> None:
        self.check_options(ctx)
        g = self.geometry(ctx)
        if self.empty_row_stats not in EMPTY_ROW_STATS:
            ctx.error(
                AttributeValueError,
                f"empty_row_stats={self.empty_row_stats!r}",
                rule="sdpa.empty_row_stats",
                hint="pass '+inf' (opgraph's, the default) or '-inf' (cuDNN's from 9.14)",
            )
        for role in ("o", "stats", "score_max", "score_sum_exp"):
            if ctx.output(role) is not None:
                self.check_rows(ctx, g, role, g.dv if role == "o" else 1, "o" if role == "o" else "stats")
        if ctx.output("rng_dump") is not None and self.dropout_probability is None:
            ctx.error(
                AttributeValueError,
                "rng_dump is requested without Philox dropout",
                tensor="rng_dump",
                rule="sdpa.rng_dump",
                hint="pass dropout=(p, seed, offset), or drop rng_dump",
            )

    def reference(self, ins, outs):
        a = dict(zip(self.input_roles(), ins))
        b, sq, skv = self.dense_geometry(a)
        q, k, v = (self.dense_input(a, r, b, sq, skv) for r in ("q", "k", "v"))
        sc = self.scores(a, q, k)
        drop = self.dropout(a, sc.s.shape)
        o, sm = ref.forward(sc, v, drop, EMPTY_ROW_STATS[self.empty_row_stats])
        rng = None
        if outs[4] is not None and drop is not None:
            rng = (drop != 0).astype(np.float64)
        return [
            self.dense_output(a, "o", o, outs[0]),
            self.dense_output(a, "stats", sm.stats, outs[1]),
            self.dense_output(a, "stats", sm.score_max, outs[2]),
            self.dense_output(a, "stats", sm.score_sum_exp, outs[3]),
            rng,
        ]


@register_op
@dataclass(frozen=True, kw_only=True)
class SdpaBackward(_Attention):
    """dQ, dK, dV (and dBias, dSink_token) of `sdpa` from q, k, v, its o and Stats, and dO
    (attention_ref.py). `score_mod_grad` is dS1 = dS2 * d score_mod / d s1, a sub-graph of the score
    (SCORE) and the incoming gradient (GRAD), derived from `score_mod` when the op is built."""

    kind = "sdpa_backward"
    DYNAMIC = True
    BASE_INPUTS = _BWD_IN
    REQUIRED = frozenset({"q", "k", "v", "o", "dO", "stats"})
    OUTPUTS = ("dQ", "dK", "dV", "dBias", "dSink_token")
    score_mod_grad: ScoreMod | None = None
    use_deterministic_algorithm: bool = False

    def infer(self, ctx: NodeContext) -> list[TensorSpec]:
        g = self.geometry(ctx)
        specs = []
        for role, src in (("dQ", "q"), ("dK", "k"), ("dV", "v")):
            t = ctx.tensor(src)
            dims = t.dim if ctx.has(ragged_role(role)) == (src in g.packed) else self.row_dims(ctx, g, role, t.dim[3])
            specs.append(TensorSpec(dims, strides_like(dims, t)))
        bias = ctx.input("bias")
        specs.append(
            TensorSpec(bias.dim, strides_like(bias.dim, bias)) if isinstance(bias, TensorDesc) else TensorSpec()
        )
        specs.append(TensorSpec((1, g.hq, 1, 1), packed_strides((1, g.hq, 1, 1)), DataType.FLOAT))
        return specs

    def check(self, ctx: NodeContext) -> None:
        g = self.geometry(ctx)
        if g.paged:
            ctx.error(
                AttributeValueError,
                "sdpa_backward reads no paged KV cache",
                rule="sdpa.paged",
                hint="paged caches are for inference; give the backward dense or packed k and v",
            )
        for role, width in (("o", g.dv), ("dO", g.dv), ("stats", 1)):
            self.check_rows(ctx, g, role, width)
            t = ctx.tensor(role)
            if not t.data_type.is_floating:
                ctx.error(
                    DataTypeError,
                    f"input '{role}' has data type {t.data_type.name}",
                    tensor=role,
                    rule="sdpa.dtype",
                    hint="o, dO and stats are floating point",
                )
        if ctx.output("dBias") is not None and not ctx.has("bias"):
            ctx.error(
                AttributeValueError,
                "dBias is requested without a bias",
                tensor="dBias",
                rule="sdpa_backward.dbias",
                hint="pass the forward's bias, or drop dBias",
            )
        if ctx.output("dSink_token") is not None and not ctx.has("sink_token"):
            ctx.error(
                AttributeValueError,
                "dSink_token is requested without a sink_token",
                tensor="dSink_token",
                rule="sdpa.sink",
                hint="pass the forward's sink_token, or drop dSink_token",
            )
        if (self.score_mod is None) != (self.score_mod_grad is None):
            ctx.error(
                AttributeValueError,
                "score_mod and score_mod_grad must be given together",
                rule="sdpa.score_mod",
                hint="build the op with g.sdpa_backward(..., score_mod=fn)",
            )
        for role, width in (("dQ", g.d), ("dK", g.d), ("dV", g.dv)):
            if ctx.output(role) is not None:
                self.check_rows(ctx, g, role, width)
        self.check_options(ctx)

    def reference(self, ins, outs):
        a = dict(zip(self.input_roles(), ins))
        b, sq, skv = self.dense_geometry(a)
        q, k, v, o, do, stats = (self.dense_input(a, r, b, sq, skv) for r in ("q", "k", "v", "o", "dO", "stats"))
        sc = self.scores(a, q, k)
        grad = None
        if self.score_mod_grad is not None:
            extra = [a[r] for r in expect(self.score_mod, "the score modifier of a score_mod_grad").input_roles()]
            grad = lambda s, g: evaluate(self.score_mod_grad, s, extra, g)
        bias_dims = outs[3].dim if outs[3] is not None else None
        dq, dk, dv, dbias, dsink = ref.backward(sc, q, k, v, o, do, stats, self.dropout(a, sc.s.shape), grad, bias_dims)
        return [
            self.dense_output(a, "dQ", dq, outs[0]),
            self.dense_output(a, "dK", dk, outs[1]),
            self.dense_output(a, "dV", dv, outs[2]),
            dbias,
            dsink if outs[4] is not None else None,
        ]


__all__ = [
    "BWD_RAGGED",
    "EMPTY_ROW_STATS",
    "FWD_RAGGED",
    "DiagonalAlignment",
    "Feature",
    "Geometry",
    "Sdpa",
    "SdpaBackward",
    "extensions",
    "features",
    "ragged_role",
]
