"""Backward rule of attention: sdpa -> sdpa_backward.

The backward op reads the forward's q, k, v, O and Stats (saved: Stats is small, FP32 [B, H, Sq, 1])
and every mask, bias, dropout, sink, packing and score-modifier argument of the forward node,
unchanged, so it draws the same Philox mask and applies the same masks. A forward node built without
Stats (generate_stats=False) is recomputed in the backward graph with Stats (O and Stats from q, k,
v). Gradients flow into q, k, v, bias (dBias) and the sink logits (dSink_token), packed like their
inputs; only O carries an incoming gradient (a gradient arriving at Stats, score_max, score_sum_exp
or rng_dump is an error), and none flows into the score modifier's extra inputs. A forward reading a
paged KV cache has no backward (the caches are for inference).
"""

from __future__ import annotations

from dataclasses import fields

from ..core.errors import expect
from ..ops.attention import BWD_RAGGED, Sdpa, SdpaBackward, ragged_role
from .rules import RuleContext, register_rule, unsupported

_GRADS = (("dQ", "q"), ("dK", "k"), ("dV", "v"), ("dBias", "bias"), ("dSink_token", "sink_token"))
_SHARED = (
    "attn_scale",
    "bias",
    "seq_len_q",
    "seq_len_kv",
    "dropout_seed",
    "dropout_offset",
    "dropout_mask",
    "dropout_scale",
)
# the backward's packing of each tensor: the forward's offset of the tensor it mirrors
_PACKED_AS = {"q": "q", "k": "k", "v": "v", "o": "o", "dO": "o", "stats": "stats", "dQ": "q", "dK": "k", "dV": "v"}


@register_rule("sdpa", inputs=("q", "k", "v", "bias", "sink_token"), outputs=("o",))
def sdpa(ctx: RuleContext):
    op = ctx.op_as(Sdpa)
    wanted = [(out, role) for out, role in _GRADS if ctx.has_input(role) and ctx.needs(role)]
    if not wanted:
        return {}
    if ctx.has_input("paged_attention_k_table") or ctx.has_input("paged_attention_v_table"):
        raise unsupported(
            ctx.node,
            "attention over a paged KV cache has no backward",
            "read k and v dense or packed where gradients are needed",
            rule="autodiff.sdpa_paged",
        )
    roles = op.input_roles()
    fwd = {r: ctx.input(r) for r in roles}
    extra = [fwd[r] for r in (op.score_mod.input_roles() if op.score_mod is not None else ())]
    shared = [fwd[r] for r in _SHARED]
    offsets = {r: fwd.get(ragged_role(r)) for r in ("q", "k", "v", "o", "stats")}
    if ctx.has_output("stats"):
        o, stats = ctx.output("o"), ctx.output("stats")
    else:  # recompute O and (dense) Stats
        offsets["stats"] = None
        q = ctx.tensor_desc("q")
        packed_q = ctx.has_input("q_ragged_offset")
        b = ctx.tensor_desc("seq_len_q").dim[0] if packed_q else q.dim[0]
        sq = expect(op.max_seq_len_q, "max_seq_len_q") if packed_q else q.dim[2]
        od, sd = ctx.result_desc("o"), (b, q.dim[1], sq, 1)
        ins = [None if r == "stats_ragged_offset" else fwd[r] for r in roles]
        o, stats = ctx.b.op(op, ins, ["o", "stats"], [od.dim, sd], tag="sdpa_recompute")
    from .score_mod import derivative  # (score_mod imports rules, which imports this module)

    attrs = {f.name: getattr(op, f.name) for f in fields(op) if f.name != "empty_row_stats"}
    bwd = SdpaBackward(**attrs, score_mod_grad=None if op.score_mod is None else derivative(op.score_mod))
    packed = [offsets[_PACKED_AS[r]] for r in BWD_RAGGED]
    dims = [ctx.tensor_desc(role).dim for _, role in wanted]
    handles = ctx.b.op(
        bwd,
        [
            fwd["q"],
            fwd["k"],
            fwd["v"],
            o,
            ctx.grad_full("o"),
            stats,
            *shared,
            None,
            *packed,
            fwd["sink_token"],
            fwd["block_mask"],
            *extra,
        ],
        [out for out, _ in wanted],
        dims,
        tag="sdpa_backward",
        float_outputs=True,
    )
    return {role: h for (_, role), h in zip(wanted, handles)}
