"""Backward rule of the embedding lookup.

embedding   y = weight[indices]   dweight = embedding_backward(dy, indices, V, padding_idx)
            (a scatter-add of dy's rows; the indices get no gradient)
"""

from __future__ import annotations

from ..ops.gather import Embedding, EmbeddingBackward
from .rules import RuleContext, register_rule


@register_rule("embedding", inputs=("weight",))
def embedding(ctx: RuleContext):
    w = ctx.tensor_desc("weight")
    op = EmbeddingBackward(num_weights=w.dim[0], padding_idx=ctx.op_as(Embedding).padding_idx)
    dy = ctx.grad_full("output")
    (dw,) = ctx.b.op(op, [dy, ctx.input("indices")], ["dweight"], [w.dim], tag="embedding_backward", float_outputs=True)
    return {"weight": dw}
