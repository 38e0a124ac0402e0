"""Attention translators: aten.scaled_dot_product_attention -> sdpa (docs/attention.md).

    F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
      q, k, v rank 4 [B, H, S, E] (rank 3 [B, S, E] is one head); k/v heads dividing q's (GQA, or
          PyTorch's broadcast of one head)
      scale None -> 1/sqrt(E) (PyTorch's default; the op's own default is 1)
      is_causal -> use_causal_mask (PyTorch's diagonal is the top-left one)
      float attn_mask -> bias (broadcast to [B, H, Sq, Skv] with leading 1s)
      a constant attn_mask (built from arange: transformers' masks without padding) that is causal or
          causal with a sliding window -> use_causal_mask (+ sliding_window_length), no mask tensor;
          all-true -> nothing
      bool attn_mask (True = attend) -> a score modifier select(mask, s, -inf), fused into the kernel
      dropout_p > 0 (train mode) -> Philox dropout=(p, seed, offset): seed an INT64 input drawn by
          variant_pack at every call (uniform in [0, 2^53)), offset 0. The draws are the op's Philox
          stream, not PyTorch's (no two attention implementations share one).
nn.MultiheadAttention(need_weights=False) and nn.TransformerEncoderLayer call it, so they import
through it; need_weights=True computes the averaged weights with bmm/softmax, translated op by op.
Stats are not generated (the imported graph outputs what the module returns): opgraph.grad
recomputes them in the backward graph, unless the graph is a train_step's, whose forward generates them.
"""

from __future__ import annotations

import math
from typing import Any

from .torch_importer import Args, Importer, Untranslatable, Value
from .torch_ops import op


def _mask_pattern(imp: Importer, mask: Value, sq: int, skv: int) -> dict[str, Any] | None:
    """The sdpa arguments a constant mask means ({} for all-true; use_causal_mask and
    sliding_window_length for causal and sliding-window masks, top-left aligned as PyTorch's
    is_causal), or None for a mask of another pattern, or not constant. A float mask counts when it
    holds only 0 (attend) and -inf or the dtype's lowest (masked: transformers' min_dtype)."""
    torch = imp.torch
    if mask.source is None or mask.source.kind != "constant" or mask.example is None or mask.rank > 4:
        return None
    m = mask.example
    if m.dtype == torch.bool:
        allowed = m
    elif m.dtype.is_floating_point:
        masked = (m == -math.inf) | (m <= torch.finfo(m.dtype).min)
        if not bool(((m == 0) | masked).all()):
            return None
        allowed = m == 0
    else:
        return None
    allowed = allowed.reshape((1,) * (4 - allowed.dim()) + tuple(allowed.shape)).expand(-1, -1, sq, skv)
    plane = allowed[0, 0]
    if not bool((allowed == plane).all()):
        return None
    if bool(plane.all()):
        return {}
    i, j = torch.arange(sq)[:, None], torch.arange(skv)[None, :]
    causal = j <= i
    if torch.equal(plane, causal):
        return {"use_causal_mask": True}
    window = int(plane[-1].sum())
    if 0 < window < skv and torch.equal(plane, causal & (j > i - window)):
        return {"use_causal_mask": True, "sliding_window_length": window}
    return None


def _rank4(imp: Importer, v: Value) -> Any:
    if v.rank == 4:
        return imp.tensor(v)
    return imp.reshaped(v, (v.shape[0], 1, *v.shape[1:]))


def attention_options(
    imp: Importer, node: Any, q: Value, k: Value, mask: Any, is_causal: bool, scale: Any
) -> dict[str, Any]:
    """The sdpa keyword arguments of PyTorch's scale, mask and causal flag (a constant causal or
    sliding-window mask as the op's own, a bool mask as a score modifier, a float one as a bias)."""
    torch = imp.torch
    if isinstance(scale, Value):
        raise Untranslatable("a tensor scale")
    kw: dict[str, Any] = {"attn_scale": float(scale) if scale is not None else 1.0 / math.sqrt(q.shape[-1])}
    recognised = _mask_pattern(imp, mask, q.shape[-2], k.shape[-2]) if isinstance(mask, Value) else None
    if recognised is not None:
        kw.update(recognised)
        imp.note(
            f"{node.name}: its constant attention mask is "
            + (
                "all-true: dropped"
                if not recognised
                else "causal"
                + (
                    f" with a sliding window of {recognised['sliding_window_length']}"
                    if "sliding_window_length" in recognised
                    else ""
                )
                + ": the op's own mask, no mask tensor"
            )
        )
        mask = None
    if isinstance(mask, Value):
        if mask.rank > 4:
            raise Untranslatable("an attention mask of rank > 4")
        m = imp.at_rank(mask, 4)
        if mask.dtype == torch.bool:
            kw["score_mod"] = lambda g, s: g.binary_select(s, -math.inf, m)
        else:
            kw["bias"] = m
    if is_causal:
        kw["use_causal_mask"] = True
    return kw


def attention_operands(a: Args, ranks: tuple[int, ...] = (3, 4)) -> tuple[Value, Value, Value]:
    """q, k and v of an attention node: one rank among `ranks` (3: one head), one batch, k/v heads
    dividing q's (GQA)."""
    q, k, v = a["query"], a["key"], a["value"]
    if not all(isinstance(x, Value) and x.rank in ranks and x.rank == q.rank for x in (q, k, v)):
        raise Untranslatable(f"attention over tensors of rank other than {' or '.join(map(str, ranks))}")
    heads = (q.shape[1], k.shape[1], v.shape[1]) if q.rank == 4 else (1, 1, 1)
    if q.shape[0] != k.shape[0] or k.shape[0] != v.shape[0] or heads[0] % heads[1] or heads[0] % heads[2]:
        raise Untranslatable("batch broadcasting between q, k and v")
    return q, k, v


@op("scaled_dot_product_attention")
def _sdpa(imp: Importer, node: Any, a: Args) -> Any:
    torch = imp.torch
    q, k, v = attention_operands(a)
    kw = attention_options(imp, node, q, k, a.get("attn_mask"), bool(a.get("is_causal")), a.get("scale"))
    p = float(a.get("dropout_p") or 0.0)
    if p >= 1.0:
        raise Untranslatable("dropout_p >= 1")
    if p > 0.0:
        seed = imp.random_value("seed", (1,), torch.int64)
        offset = imp.constant_value(torch.zeros(1, dtype=torch.int64), "dropout_offset")
        kw["dropout"] = (p, imp.tensor(seed), imp.tensor(offset))
        imp.note(
            f"{node.name}: attention dropout in train mode: the op's Philox stream, its seed an input drawn "
            "by variant_pack at every call (other draws than PyTorch's)"
        )
    o, _ = imp.g.sdpa(
        _rank4(imp, q), _rank4(imp, k), _rank4(imp, v), generate_stats=False, name=imp.op_name("sdpa"), **kw
    )
    if q.rank == 3:
        out_shape = (*q.shape[:2], v.shape[-1])
        return imp.reshape(o, list(out_shape), name=imp.op_name("reshape"))
    return o
