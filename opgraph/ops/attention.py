"""Scaled dot-product attention: `sdpa` (forward) and `sdpa_backward`, with cuDNN frontend's names.

    O, Stats = g.sdpa(q, k, v, attn_scale=None, generate_stats=True, bias=None, use_alibi_mask=False,
                      use_padding_mask=False, seq_len_q=None, seq_len_kv=None, use_causal_mask=False,
                      use_causal_mask_bottom_right=False, sliding_window_length=None, dropout=None,
                      score_mod=None, compute_data_type=None, name="")
    dQ, dK, dV = g.sdpa_backward(q, k, v, o, dO, stats, attn_scale=None, bias=None, dBias=None,
                                 <the same mask arguments>, dropout=None, score_mod=None,
                                 use_deterministic_algorithm=False, compute_data_type=None, name="")

q [B, Hq, Sq, D], k [B, Hk, Skv, D], v [B, Hv, Skv, Dv] (logical dims; the layout is the strides, so
BSHD and BHSD both work); Hk and Hv divide Hq (GQA / MQA). O [B, Hq, Sq, Dv] keeps q's layout;
Stats FP32 [B, Hq, Sq, 1]. The formulas are in attention_ref.py and docs/attention.md.

dropout: ``(p, seed, offset)`` (Philox; seed and offset 1-element INT64 or INT32 tensors read at run
time) or ``(mask, scale)`` (an explicit mask broadcast to [B, Hq, Sq, Skv], times scale); the backward
also takes cuDNN's ``(mask, scale, scale_inv)``. score_mod: see score_mod.py. dBias is a tensor the
caller declares (dims of bias) that the backward writes, as in cuDNN.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ..core.dtypes import DataType
from ..core.errors import AttributeValueError, DataTypeError, ShapeError, expect
from ..core.ir import Const
from ..core.op import NodeContext, Op, TensorSpec, graph_method, register_op
from ..core.tensor import Tensor, TensorDesc, packed_strides
from . import attention_ref as ref
from .base import strides_like
from .pointwise import Pointwise, PointwiseMode
from .score_mod import ScoreMod, Src, evaluate, record

_MASK_IN = ("attn_scale", "bias", "seq_len_q", "seq_len_kv", "dropout_seed", "dropout_offset", "dropout_mask",
            "dropout_scale")
_FWD_IN = ("q", "k", "v", *_MASK_IN)
_BWD_IN = ("q", "k", "v", "o", "dO", "stats", *_MASK_IN, "dropout_scale_inv")
_SCALARS = frozenset({"attn_scale", "dropout_seed", "dropout_offset", "dropout_scale", "dropout_scale_inv"})
_ATTN_TYPES = (DataType.FLOAT, DataType.HALF, DataType.BFLOAT16, DataType.DOUBLE)


@dataclass(frozen=True, kw_only=True)
class _Attention(Op):
    """Attributes and checks shared by the forward and the backward op."""

    use_alibi_mask: bool = False
    use_padding_mask: bool = False
    use_causal_mask: bool = False
    use_causal_mask_bottom_right: bool = False
    sliding_window_length: int | None = None
    dropout_probability: float | None = None  # the Philox form; the mask form has no attribute
    score_mod: ScoreMod | None = None

    BASE_INPUTS: ClassVar[tuple[str, ...]] = ()
    REQUIRED: ClassVar[frozenset[str]] = frozenset()

    def input_roles(self) -> tuple[str, ...]:
        return self.BASE_INPUTS + (self.score_mod.input_roles() if self.score_mod is not None else ())

    def optional_inputs(self) -> frozenset[str]:
        return frozenset(self.input_roles()) - self.REQUIRED

    def scalar_inputs(self) -> frozenset[str]:
        return _SCALARS

    @property
    def masking(self) -> ref.Masking:
        return ref.Masking(self.use_padding_mask, self.use_causal_mask, self.use_causal_mask_bottom_right,
                           self.sliding_window_length)

    # -- checks -------------------------------------------------------------------------------------
    def qkv(self, ctx: NodeContext) -> tuple[TensorDesc, TensorDesc, TensorDesc]:
        q, k, v = ctx.tensor("q"), ctx.tensor("k"), ctx.tensor("v")
        for role, t in (("q", q), ("k", k), ("v", v)):
            if len(t.dim) != 4:
                ctx.error(ShapeError, f"input '{role}' has rank {len(t.dim)} (dims {list(t.dim)}); attention "
                          "takes rank-4 tensors", tensor=role, rule="sdpa.rank",
                          hint="give q [B, Hq, Sq, D], k [B, Hk, Skv, D], v [B, Hv, Skv, Dv] (logical dims; "
                          "a BSHD buffer is these dims with BSHD strides)")
        for role, t in (("q", q), ("k", k), ("v", v)):
            if t.data_type not in _ATTN_TYPES:
                ctx.error(DataTypeError, f"input '{role}' has data type {t.data_type.name}", tensor=role,
                          rule="sdpa.dtype", hint="attention takes HALF, BFLOAT16, FLOAT or DOUBLE q, k, v")
        for role, t in (("k", k), ("v", v)):
            if t.data_type != q.data_type:
                ctx.error(DataTypeError, f"input '{role}' is {t.data_type.name} but q is {q.data_type.name}",
                          tensor=role, rule="sdpa.dtype",
                          hint="give q, k and v one data type (a q, k or v computed in the graph is virtual and takes "
                          "the graph's intermediate_data_type unless you call set_data_type on it)")
        for role, t in (("k", k), ("v", v)):
            if t.dim[0] != q.dim[0]:
                ctx.error(ShapeError, f"input '{role}' has batch {t.dim[0]} but q has {q.dim[0]}", tensor=role,
                          rule="sdpa.batch", hint="q, k and v share the batch axis 0")
        if k.dim[3] != q.dim[3]:
            ctx.error(ShapeError, f"k has head dim {k.dim[3]} but q has {q.dim[3]}", tensor="k",
                      rule="sdpa.head_dim", hint="q and k share the head dim D (axis 3); v's may differ")
        if v.dim[2] != k.dim[2]:
            ctx.error(ShapeError, f"v has {v.dim[2]} keys (axis 2) but k has {k.dim[2]}", tensor="v",
                      rule="sdpa.kv_length", hint="k and v share the sequence axis Skv (axis 2)")
        for role, t in (("k", k), ("v", v)):
            if q.dim[1] % t.dim[1]:
                ctx.error(ShapeError, f"input '{role}' has {t.dim[1]} heads, which does not divide q's {q.dim[1]}",
                          tensor=role, rule="sdpa.gqa",
                          hint="for grouped-query attention, give k and v a number of heads that divides q's "
                          "(query head h reads key head h // (Hq / Hk))")
        return q, k, v

    def score_dims(self, ctx: NodeContext) -> tuple[int, int, int, int]:
        q, k = ctx.tensor("q"), ctx.tensor("k")
        return (q.dim[0], q.dim[1], q.dim[2], k.dim[2])

    def check_broadcast(self, ctx: NodeContext, role: str, rule: str, what: str) -> None:
        t = ctx.input(role)
        if not isinstance(t, TensorDesc) or t.numel == 1 and role.startswith("score_mod"):
            return
        full = self.score_dims(ctx)
        if len(t.dim) != 4 or any(d not in (1, f) for d, f in zip(t.dim, full)):
            ctx.error(ShapeError, f"{what} '{role}' dims {list(t.dim)} do not broadcast to the scores "
                      f"[B, Hq, Sq, Skv] = {list(full)}", tensor=role, rule=rule,
                      hint="give it rank 4 with each dim equal to the scores' or 1")

    def check_options(self, ctx: NodeContext) -> None:
        b = ctx.tensor("q").dim[0]
        if self.use_causal_mask and self.use_causal_mask_bottom_right:
            ctx.error(AttributeValueError, "use_causal_mask and use_causal_mask_bottom_right are both set",
                      rule="sdpa.causal", hint="pick one alignment of the causal diagonal")
        w = self.sliding_window_length
        if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1):
            ctx.error(AttributeValueError, f"sliding_window_length={w!r} is not a positive int",
                      rule="sdpa.sliding_window", hint="pass the window length W >= 1 (keys i-W < j <= i)")
        if ctx.has("bias"):
            self.check_broadcast(ctx, "bias", "sdpa.bias_dims", "bias")
            if not ctx.tensor("bias").data_type.is_floating:
                ctx.error(DataTypeError, f"bias has data type {ctx.tensor('bias').data_type.name}", tensor="bias",
                          rule="sdpa.dtype", hint="give bias a floating-point type")
        lens = [r for r in ("seq_len_q", "seq_len_kv") if ctx.has(r)]
        if self.use_padding_mask and len(lens) != 2:
            missing = [r for r in ("seq_len_q", "seq_len_kv") if r not in lens]
            ctx.error(ShapeError, f"use_padding_mask needs seq_len_q and seq_len_kv; {', '.join(missing)} "
                      "missing", rule="sdpa.padding_mask", hint="pass both INT32 [B, 1, 1, 1] length tensors")
        if lens and not self.use_padding_mask:
            ctx.error(AttributeValueError, f"{lens[0]} is given without use_padding_mask", tensor=lens[0],
                      rule="sdpa.padding_mask", hint="set use_padding_mask=True, or drop the length tensors")
        for role in lens:
            t = ctx.tensor(role)
            if t.dim != (b, 1, 1, 1) or t.data_type is not DataType.INT32:
                ctx.error(ShapeError if t.dim != (b, 1, 1, 1) else DataTypeError,
                          f"{role} is {t.data_type.name} {list(t.dim)}, expected INT32 [{b}, 1, 1, 1]", tensor=role,
                          rule="sdpa.seq_len", hint="one INT32 length per batch entry, dims [B, 1, 1, 1]")
        self.check_dropout(ctx)
        self.check_score_mod(ctx)

    def check_dropout(self, ctx: NodeContext) -> None:
        p = self.dropout_probability
        philox = [r for r in ("dropout_seed", "dropout_offset") if ctx.has(r)]
        if p is not None:
            if not (isinstance(p, float) and 0.0 <= p < 1.0):
                ctx.error(AttributeValueError, f"dropout probability {p!r} is outside [0, 1)", rule="sdpa.dropout",
                          hint="pass dropout=(p, seed, offset) with 0 <= p < 1")
            if len(philox) != 2:
                ctx.error(AttributeValueError, "Philox dropout needs a seed and an offset", rule="sdpa.dropout",
                          hint="pass dropout=(p, seed, offset) with two 1-element INT64 tensors")
            if ctx.has("dropout_mask"):
                ctx.error(AttributeValueError, "dropout has both a probability and a mask", tensor="dropout_mask",
                          rule="sdpa.dropout", hint="pass (p, seed, offset) or (mask, scale), not both")
        elif philox:
            ctx.error(AttributeValueError, f"{philox[0]} is given without a dropout probability", tensor=philox[0],
                      rule="sdpa.dropout", hint="pass dropout=(p, seed, offset)")
        for role in philox:
            t = ctx.input(role)
            if isinstance(t, TensorDesc) and not t.data_type.is_integer:
                ctx.error(DataTypeError, f"{role} has data type {t.data_type.name}", tensor=role, rule="sdpa.dropout",
                          hint="give the Philox seed and offset an integer type (INT64)")
            if isinstance(t, Const) and (isinstance(t.value, float) and not float(t.value).is_integer()):
                ctx.error(AttributeValueError, f"{role}={t.value} is not an integer", rule="sdpa.dropout",
                          hint="seeds and offsets are integers")
        if ctx.has("dropout_mask"):
            self.check_broadcast(ctx, "dropout_mask", "sdpa.dropout", "dropout mask")
            if not ctx.has("dropout_scale"):
                ctx.error(AttributeValueError, "a dropout mask needs its scale", rule="sdpa.dropout",
                          hint="pass dropout=(mask, scale), scale usually 1 / (1 - p)")
        elif ctx.has("dropout_scale") or ctx.has("dropout_scale_inv"):
            ctx.error(AttributeValueError, "a dropout scale is given without a mask", rule="sdpa.dropout",
                      hint="pass dropout=(mask, scale)")

    def check_score_mod(self, ctx: NodeContext) -> None:
        mods = [("score_mod", self.score_mod), ("score_mod_grad", getattr(self, "score_mod_grad", None))]
        for what, mod in mods:
            if mod is None:
                continue
            n_in = self.score_mod.num_inputs if self.score_mod is not None else 0
            for i, node in enumerate(mod.nodes):
                bad = [r for r in node.operands if r is not None and (
                    (r.src is Src.NODE and r.index >= i) or (r.src is Src.INPUT and r.index >= n_in)
                    or (r.src is Src.GRAD and what == "score_mod"))]
                if bad or len(node.operands) != len(_pointwise_roles(node)):
                    ctx.error(AttributeValueError, f"{what} node %{i} ({node}) has operands that refer to no "
                              "earlier node, input or score", rule="sdpa.score_mod",
                              hint="rebuild the modifier through g.sdpa(..., score_mod=fn)")
                if node.mode is PointwiseMode.GEN_INDEX and node.axis not in (0, 1, 2, 3):
                    ctx.error(AttributeValueError, f"{what} node %{i} gen_index(axis={node.axis}) indexes no axis "
                              "of the scores [B, H, Sq, Skv]", rule="sdpa.score_mod_axis",
                              hint="use axis 2 for the query position i, 3 for the key position j")
            r = mod.result
            if (r.src is Src.NODE and r.index >= len(mod.nodes)) or (r.src is Src.INPUT and r.index >= n_in):
                ctx.error(AttributeValueError, f"{what} result {r} refers to nothing", rule="sdpa.score_mod",
                          hint="rebuild the modifier through g.sdpa(..., score_mod=fn)")
        for role in (self.score_mod.input_roles() if self.score_mod is not None else ()):
            self.check_broadcast(ctx, role, "sdpa.score_mod_input", "score_mod input")

    # -- reference ------------------------------------------------------------------------------------
    def scores(self, a: dict[str, Any]) -> ref.Scores:
        modifier = None
        if self.score_mod is not None:
            extra = [a[r] for r in self.score_mod.input_roles()]
            modifier = lambda s: evaluate(self.score_mod, s, extra)
        return ref.scores(a["q"], a["k"], a["attn_scale"], a["bias"], self.use_alibi_mask, self.masking,
                          a["seq_len_q"], a["seq_len_kv"], modifier)

    def dropout(self, a: dict[str, Any], shape: tuple[int, ...]) -> np.ndarray | None:
        return ref.dropout_factor(shape, self.dropout_probability, a["dropout_seed"], a["dropout_offset"],
                                  a["dropout_mask"], a["dropout_scale"])


def _pointwise_roles(node) -> tuple[str, ...]:
    return Pointwise(mode=node.mode, axis=node.axis).input_roles()


@register_op
@dataclass(frozen=True, kw_only=True)
class Sdpa(_Attention):
    """O = softmax(mask(score_mod(attn_scale * q k^T + bias + alibi))) (dropped out) @ v; Stats = the
    natural-log log-sum-exp of each row (+inf for a row with no key kept, whose O is 0)."""

    kind = "sdpa"
    BASE_INPUTS = _FWD_IN
    REQUIRED = frozenset({"q", "k", "v"})
    OUTPUTS = ("o", "stats")

    def infer(self, ctx: NodeContext) -> list[TensorSpec]:
        q, _k, v = self.qkv(ctx)
        o = (q.dim[0], q.dim[1], q.dim[2], v.dim[3])
        stats = (q.dim[0], q.dim[1], q.dim[2], 1)
        st_type = DataType.DOUBLE if q.data_type is DataType.DOUBLE else DataType.FLOAT
        return [TensorSpec(o, strides_like(o, q)), TensorSpec(stats, packed_strides(stats), st_type)]

    def check(self, ctx: NodeContext) -> None:
        self.check_options(ctx)

    def reference(self, ins, outs):
        a = dict(zip(self.input_roles(), ins))
        sc = self.scores(a)
        o, stats = ref.forward(sc, a["v"], self.dropout(a, sc.s.shape))
        return [o, stats if outs[1] is not None else None]


@register_op
@dataclass(frozen=True, kw_only=True)
class SdpaBackward(_Attention):
    """dQ, dK, dV (and dBias) of `sdpa` from q, k, v, its o and Stats, and dO (attention_ref.py).
    `score_mod_grad` is dS1 = dS2 * d score_mod / d s1, a sub-graph of the score (SCORE) and the
    incoming gradient (GRAD), derived from `score_mod` when the op is built."""

    kind = "sdpa_backward"
    BASE_INPUTS = _BWD_IN
    REQUIRED = frozenset({"q", "k", "v", "o", "dO", "stats"})
    OUTPUTS = ("dQ", "dK", "dV", "dBias")
    score_mod_grad: ScoreMod | None = None
    use_deterministic_algorithm: bool = False

    def infer(self, ctx: NodeContext) -> list[TensorSpec]:
        q, k, v = self.qkv(ctx)
        specs = [TensorSpec(t.dim, strides_like(t.dim, t)) for t in (q, k, v)]
        bias = ctx.input("bias")
        specs.append(TensorSpec(bias.dim, strides_like(bias.dim, bias)) if isinstance(bias, TensorDesc)
                     else TensorSpec())
        return specs

    def check(self, ctx: NodeContext) -> None:
        q, _k, v = self.qkv(ctx)
        want = {"o": (*q.dim[:3], v.dim[3]), "dO": (*q.dim[:3], v.dim[3]), "stats": (*q.dim[:3], 1)}
        for role, dims in want.items():
            t = ctx.tensor(role)
            if t.dim != dims:
                ctx.error(ShapeError, f"input '{role}' has dims {list(t.dim)}, expected {list(dims)}", tensor=role,
                          rule="sdpa_backward.dims",
                          hint="pass the forward's O and Stats and dO = dL/dO ([B, Hq, Sq, Dv]; Stats [B, Hq, Sq, 1])")
            if not t.data_type.is_floating:
                ctx.error(DataTypeError, f"input '{role}' has data type {t.data_type.name}", tensor=role,
                          rule="sdpa.dtype", hint="o, dO and stats are floating point")
        if ctx.output("dBias") is not None and not ctx.has("bias"):
            ctx.error(AttributeValueError, "dBias is requested without a bias", tensor="dBias",
                      rule="sdpa_backward.dbias", hint="pass the forward's bias, or drop dBias")
        if (self.score_mod is None) != (self.score_mod_grad is None):
            ctx.error(AttributeValueError, "score_mod and score_mod_grad must be given together",
                      rule="sdpa.score_mod", hint="build the op with g.sdpa_backward(..., score_mod=fn)")
        self.check_options(ctx)

    def reference(self, ins, outs):
        a = dict(zip(self.input_roles(), ins))
        sc = self.scores(a)
        grad = None
        if self.score_mod_grad is not None:
            extra = [a[r] for r in expect(self.score_mod, "the score modifier of a score_mod_grad").input_roles()]
            grad = lambda s, g: evaluate(self.score_mod_grad, s, extra, g)
        bias_dims = outs[3].dim if outs[3] is not None else None
        dq, dk, dv, dbias = ref.backward(sc, a["q"], a["k"], a["v"], a["o"], a["dO"], a["stats"],
                                         self.dropout(a, sc.s.shape), grad, bias_dims)
        return [dq, dk, dv, dbias]


# -- builders --------------------------------------------------------------------------------------------


def _dropout(dropout: Any, label: str, backward: bool) -> tuple[float | None, list[Any]]:
    """(p, [seed, offset, mask, scale, scale_inv]) from the cuDNN-style dropout tuple."""
    none = [None] * 5
    if dropout is None:
        return None, none
    forms = "(p, seed, offset) or (mask, scale)" + (" or (mask, scale, scale_inv)" if backward else "")
    if not isinstance(dropout, (tuple, list)) or len(dropout) not in (2, 3):
        raise AttributeValueError(f"dropout={dropout!r} is not {forms}", op=label, rule="sdpa.dropout",
                                  hint=f"pass dropout as a tuple {forms}")
    first = dropout[0]
    if len(dropout) == 3 and isinstance(first, numbers.Real) and not isinstance(first, bool):
        p = float(first)
        if not 0.0 <= p < 1.0:
            raise AttributeValueError(f"dropout probability {p} is outside [0, 1)", op=label, rule="sdpa.dropout",
                                      hint="pass 0 <= p < 1 (the probability of dropping an element)")
        return p, [dropout[1], dropout[2], None, None, None]
    if isinstance(first, Tensor) and (len(dropout) == 2 or backward):
        return None, [None, None, first, dropout[1], dropout[2] if len(dropout) == 3 else None]
    raise AttributeValueError(f"dropout={dropout!r} is not {forms}", op=label, rule="sdpa.dropout",
                              hint=f"pass dropout as a tuple {forms} (mask is a tensor)")


def _options(label: str, use_alibi_mask, use_padding_mask, use_causal_mask, use_causal_mask_bottom_right,
             sliding_window_length) -> dict[str, Any]:
    w = sliding_window_length
    if w is not None and (isinstance(w, bool) or not isinstance(w, (int, np.integer)) or w < 1):
        raise AttributeValueError(f"sliding_window_length={w!r} is not a positive int", op=label,
                                  rule="sdpa.sliding_window", hint="pass the window length W >= 1 (keys i-W < j <= i)")
    return {"use_alibi_mask": bool(use_alibi_mask), "use_padding_mask": bool(use_padding_mask),
                "use_causal_mask": bool(use_causal_mask), "use_causal_mask_bottom_right": bool(use_causal_mask_bottom_right),
                "sliding_window_length": None if w is None else int(w)}


def _score_mod(g: Any, score_mod: Any, label: str, q: Any, k: Any) -> tuple[ScoreMod | None, list[Any]]:
    """A user's modifier function recorded, or an already recorded (ScoreMod, inputs) pair."""
    if score_mod is None:
        return None, []
    if isinstance(score_mod, tuple) and len(score_mod) == 2 and isinstance(score_mod[0], ScoreMod):
        return score_mod[0], list(score_mod[1])
    dims = None
    if isinstance(q, Tensor) and isinstance(k, Tensor) and q.dim is not None and k.dim is not None \
            and len(q.dim) == 4 and len(k.dim) == 4:
        dims = (q.dim[0], q.dim[1], q.dim[2], k.dim[2])
    return record(g, score_mod, label, dims)


@graph_method
def sdpa(self, q, k, v, attn_scale=None, generate_stats=True, bias=None, use_alibi_mask=False,
         use_padding_mask=False, seq_len_q=None, seq_len_kv=None, use_causal_mask=False,
         use_causal_mask_bottom_right=False, sliding_window_length=None, dropout=None, score_mod=None,
         compute_data_type=None, name=""):
    """Scaled dot-product attention (cuDNN frontend's `sdpa`): [O, Stats].

    Shapes: q [B, Hq, Sq, D], k [B, Hk, Skv, D], v [B, Hv, Skv, Dv] (dims logical); GQA/MQA when Hk and
    Hv divide Hq; O [B, Hq, Sq, Dv]; Stats [B, Hq, Sq, 1].

    Layouts: any strides with the last one 1, so BSHD and BHSD tensors both work; O takes q's axis order.

    Types: q, k, v HALF, BFLOAT16, FLOAT or DOUBLE; softmax and accumulation in `compute_data_type`
    (default FLOAT); Stats FLOAT (DOUBLE for DOUBLE inputs).

    Formula: `S = attn_scale * q @ k^T + bias (+ alibi)`, `S = score_mod(S)`, masked positions -inf,
    `P = softmax(S)` over keys (then dropout), `O = P @ v`; `Stats = logsumexp(S)` per row (natural log).
    A row with every key masked gives O = 0 and Stats = +inf, not NaN. docs/attention.md has the exact
    definitions of every mask and of the dropout stream.

    Args:
        q: queries.
        k: keys.
        v: values.
        attn_scale: a number, a pass-by-value or a 1-element tensor read at run time (default 1.0, as cuDNN).
        generate_stats: also output Stats (what the backward needs); False for inference.
        bias: an additive bias broadcastable to [B, Hq, Sq, Skv] (optional).
        use_alibi_mask: add ALiBi's per-head linear position bias.
        use_padding_mask: keep only i < seq_len_q[b] and j < seq_len_kv[b].
        seq_len_q: INT32 [B, 1, 1, 1], the valid query length per batch (with use_padding_mask).
        seq_len_kv: INT32 [B, 1, 1, 1], the valid key length per batch (with use_padding_mask).
        use_causal_mask: keep j <= i (top-left aligned).
        use_causal_mask_bottom_right: keep j <= i + (Skv - Sq) (bottom-right aligned, with actual lengths).
        sliding_window_length: W, keep j > i + delta - W as well (delta 0 top-left, Skv - Sq bottom-right).
        dropout: (p, seed, offset) with seed and offset 1-element INT64 tensors read at run time (Philox;
            docs/attention.md defines the stream), or (mask, scale) with an explicit mask tensor.
        score_mod: a function `score_mod(g, score) -> tensor` building pointwise ops on the virtual score
            [B, H, Sq, Skv] (g.gen_index gives positions; other graph tensors broadcast in); fused into
            the kernel and allowed with every mask.
        compute_data_type: the softmax's type.
        name: the op's name.

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
    opts = _options(label, use_alibi_mask, use_padding_mask, use_causal_mask, use_causal_mask_bottom_right,
                    sliding_window_length)
    p, (seed, offset, mask, scale, _) = _dropout(dropout, label, backward=False)
    mod, extra = _score_mod(self, score_mod, label, q, k)
    op = Sdpa(**opts, dropout_probability=p, score_mod=mod)
    inputs = [q, k, v, attn_scale, bias, seq_len_q, seq_len_kv, seed, offset, mask, scale, *extra]
    o, stats = self._add_op(op, inputs, name=name, compute_data_type=compute_data_type,
                            outputs=["o", "stats"] if generate_stats else ["o"])
    return [o, stats]


@graph_method
def sdpa_backward(self, q, k, v, o, dO, stats, attn_scale=None, bias=None, dBias=None, use_alibi_mask=False,
                  use_padding_mask=False, seq_len_q=None, seq_len_kv=None, use_causal_mask=False,
                  use_causal_mask_bottom_right=False, sliding_window_length=None, dropout=None, score_mod=None,
                  use_deterministic_algorithm=False, compute_data_type=None, name=""):
    """The backward of `sdpa` (cuDNN frontend's `sdpa_backward`): [dQ, dK, dV], and dBias when given.

    Shapes: as sdpa; o and dO [B, Hq, Sq, Dv], stats [B, Hq, Sq, 1]; dQ, dK, dV take the dims of q, k, v;
    dBias the dims of bias.

    Layouts: any strides with the last one 1; the gradients take their inputs' axis order.

    Types: as sdpa; accumulation in FLOAT.

    Formula: with P recomputed from q, k and stats, `dV = P^T @ dO`, `dP = dO @ v^T`,
    `dS = P * (dP - rowsum(dO * o))`, times d score_mod / d S when a modifier is given (derived from the
    pointwise ops' backward rules), `dQ = attn_scale * dS @ k`, `dK = attn_scale * dS^T @ q` (summed over
    the query heads of a group), `dBias = dS` reduced to bias's dims.

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
        seq_len_q: INT32 [B, 1, 1, 1], the valid query length per batch (with use_padding_mask).
        seq_len_kv: INT32 [B, 1, 1, 1], the valid key length per batch (with use_padding_mask).
        use_causal_mask: keep j <= i (top-left aligned).
        use_causal_mask_bottom_right: keep j <= i + (Skv - Sq) (bottom-right aligned, with actual lengths).
        sliding_window_length: W, keep j > i + delta - W as well (delta 0 top-left, Skv - Sq bottom-right).
        dropout: (p, seed, offset) with seed and offset 1-element INT64 tensors read at run time (Philox;
            docs/attention.md defines the stream), or (mask, scale) with an explicit mask tensor.
        score_mod: a function `score_mod(g, score) -> tensor` building pointwise ops on the virtual score
            [B, H, Sq, Skv] (g.gen_index gives positions; other graph tensors broadcast in); fused into
            the kernel and allowed with every mask.
        use_deterministic_algorithm: accepted for cuDNN compatibility; the generated kernels are always
            deterministic (no atomics).
        compute_data_type: the accumulation type.
        name: the op's name.

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
    opts = _options(label, use_alibi_mask, use_padding_mask, use_causal_mask, use_causal_mask_bottom_right,
                    sliding_window_length)
    p, (seed, offset, mask, scale, scale_inv) = _dropout(dropout, label, backward=True)
    mod, extra = _score_mod(self, score_mod, label, q, k)
    mod_grad = None
    if mod is not None:
        from ..autodiff.score_mod import derivative  # lazy: autodiff is a layer above ops

        mod_grad = derivative(mod, label)
    op = SdpaBackward(**opts, dropout_probability=p, score_mod=mod, score_mod_grad=mod_grad,
                      use_deterministic_algorithm=bool(use_deterministic_algorithm))
    inputs = [q, k, v, o, dO, stats, attn_scale, bias, seq_len_q, seq_len_kv, seed, offset, mask, scale,
              scale_inv, *extra]
    if dBias is not None and not (isinstance(dBias, Tensor) and dBias.graph is self):
        raise ShapeError(f"dBias must be a tensor of this graph, got {type(dBias).__name__}", op=label,
                         rule="sdpa_backward.dbias", hint="declare dBias with g.tensor(dim=<bias dims>) and pass it")
    nm = name or f"sdpa_backward_{len(self._records)}"
    handles = []
    for role in ("dQ", "dK", "dV"):
        t = Tensor(self, name=f"{nm}::{role}", is_virtual=True)
        self._tensors.append(t)
        handles.append(t)
    self._add_op(op, inputs, name=nm, compute_data_type=compute_data_type, out_handles=[*handles, dBias])
    return handles
