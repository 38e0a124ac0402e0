"""Backward rule of attention: sdpa -> sdpa_backward.

The backward op reads the forward's q, k, v, O and Stats (saved: Stats is small, FP32 [B, H, Sq, 1])
and every mask, bias, dropout and score-modifier argument of the forward node, unchanged, so it
draws the same Philox mask and applies the same masks. A forward node built without Stats
(generate_stats=False) is recomputed in the backward graph with Stats (O and Stats from q, k, v).
Gradients flow into q, k, v and bias (dBias); only O carries an incoming gradient (a gradient
arriving at Stats is an error), and none flows into the score modifier's extra inputs.
"""

from __future__ import annotations

from dataclasses import fields

from ..ops.attention import Sdpa, SdpaBackward
from .rules import RuleContext, register_rule

_GRADS = (("dQ", "q"), ("dK", "k"), ("dV", "v"), ("dBias", "bias"))
_SHARED = ("attn_scale", "bias", "seq_len_q", "seq_len_kv", "dropout_seed", "dropout_offset", "dropout_mask",
           "dropout_scale")


@register_rule("sdpa", inputs=("q", "k", "v", "bias"), outputs=("o",))
def sdpa(ctx: RuleContext):
    op = ctx.op_as(Sdpa)
    wanted = [(out, role) for out, role in _GRADS if ctx.has_input(role) and ctx.needs(role)]
    if not wanted:
        return {}
    q, k, v = (ctx.input(r) for r in ("q", "k", "v"))
    extra = [ctx.input(r) for r in (op.score_mod.input_roles() if op.score_mod is not None else ())]
    shared = [ctx.input(r) for r in _SHARED]
    if ctx.has_output("stats"):
        o, stats = ctx.output("o"), ctx.output("stats")
    else:  # recompute O and Stats
        od, sd = ctx.result_desc("o"), (*ctx.tensor_desc("q").dim[:3], 1)
        o, stats = ctx.b.op(op, [q, k, v, *shared, *extra], ["o", "stats"], [od.dim, sd], tag="sdpa_recompute")
    from .score_mod import derivative  # (score_mod imports rules, which imports this module)

    attrs = {f.name: getattr(op, f.name) for f in fields(op)}
    bwd = SdpaBackward(**attrs, score_mod_grad=None if op.score_mod is None else derivative(op.score_mod))
    dims = [ctx.tensor_desc(role).dim for _, role in wanted]
    handles = ctx.b.op(bwd, [q, k, v, o, ctx.grad_full("o"), stats, *shared, None, *extra],
                       [out for out, _ in wanted], dims, tag="sdpa_backward", float_outputs=True)
    return {role: h for (_, role), h in zip(wanted, handles)}
