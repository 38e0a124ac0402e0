"""sdpa and sdpa_backward lowered to the cuDNN frontend's `sdpa` / `sdpa_backward` (the cudnn engine,
cudnn_frontend.py, calls in here for attention nodes).

What is offered (the rest is declined before cuDNN is asked, with the reason; cuDNN's own support
check then decides, and its message is the reason it declines):
- fp16/bf16 q, k, v (and o, dO), the head dims (axis 3) contiguous, FLOAT Stats;
- masks, bias, ALiBi, padding, GQA as the op has them (cuDNN's names are the op's); attn_scale a
  number (baked in) or a FLOAT scalar tensor;
- dropout with an explicit mask and a scale tensor, in the forward only (the backward with a mask
  disagreed with the reference on an H100); not the Philox form: cuDNN draws its own Philox stream,
  not the op's `tl.rand` stream that the reference and the generated kernels share (docs/attention.md);
- no score modifier (the op's recorded sub-graph is not lowered to cuDNN's callback);
- no Stats output when a row can have no key (padding mask, or Sq > Skv with a bottom-right
  diagonal or a window): the op defines those rows' Stats as +inf, cuDNN does not document them;
- the backward with all of dQ, dK and dV (cuDNN writes the three);
- operands read through slices, reshapes and transposes of tensors in memory (the heads of a fused qkv
  projection), and gradients written through transposes and reshapes into their slots of one
  concatenation (the projection's input gradient): the analysis the generated kernels
  share (shared/views.py) gives each a View, a base buffer, an element offset and strides, which
  the cuDNN graph declares as a tensor of its own; the launch passes base + offset (`operand_slots`).
Its plans, like every cudnn plan, are keyed by canonical UIDs (cudnn_frontend.canonical_uids), so one
plan serves every piece of the same signature and loads from the disk cache or a plan file.
"""

from __future__ import annotations

from typing import Any

from ..core.config import Support
from ..core.dtypes import DataType
from ..core.ir import Const, Node
from ..core.piece import Piece
from ..ops.attention import SdpaBackward, _Attention, extensions
from ..ops.layout import VIEW_KINDS
from .shared.views import View, gradient_targets, operand_views

ATTENTION_KINDS = frozenset({"sdpa", "sdpa_backward"})
_TYPES = frozenset({DataType.HALF, DataType.BFLOAT16})
# roles whose 1-element tensors cuDNN wants as [1, 1, 1, 1]
SCALAR_ROLES = ("attn_scale", "dropout_scale", "dropout_scale_inv")


def scalar_uids(piece: Piece) -> set[int]:
    """Piece inputs that attention nodes read as scalars (declared [1, 1, 1, 1] to cuDNN)."""
    out: set[int] = set()
    for node in piece.nodes:
        if node.kind in ATTENTION_KINDS:
            for role in SCALAR_ROLES:
                if role in node.op.input_roles() and isinstance(node.input(role), int):
                    out.add(node.input(role))  # type: ignore[arg-type]
    return out


MOVES = frozenset({*VIEW_KINDS, "concatenate"})


def attention_views(piece: Piece) -> dict[int, View] | str | None:
    """The attention operands the piece reads through views, and the gradients it writes through them,
    as Views by UID; None when the piece moves no data; why not, when cuDNN cannot take them so."""
    attention = [n for n in piece.nodes if n.kind in ATTENTION_KINDS]
    if not attention or not any(n.kind in MOVES for n in piece.nodes):
        return None  # (a piece without attention is judged op by op)
    others = [n for n in piece.nodes if n.kind not in MOVES and n.kind not in ATTENTION_KINDS]
    if len(attention) != 1 or others:
        bad = others[0] if others else piece.nodes[0]
        return (
            f"the cudnn engine reads views (and writes gradients through them) around one attention op alone, "
            f"not with {bad.label()}"
        )
    node = attention[0]
    joined = next((n for n in piece.nodes[: piece.nodes.index(node)] if n.kind == "concatenate"), None)
    if joined is not None:
        return f"the cudnn engine reads attention operands through views only, not through {joined.label()}"
    if node.kind == "sdpa" and piece.nodes[-1] is not node:
        return f"the cudnn engine writes the attention output O itself, not through {piece.nodes[-1].label()}"
    views = operand_views(piece, node, "cudnn")
    if isinstance(views, Support):
        return views.reason
    if node.kind == "sdpa_backward":
        grads = gradient_targets(piece, node, "cudnn")
        if isinstance(grads, Support):
            return grads.reason
        views = {**views, **grads}
    for uid, view in views.items():
        if view.desc.stride[-1] != 1:
            return f"cuDNN needs the head dim of {piece.tensor(uid).label()} contiguous in memory (its view's stride 1)"
        if (view.offset * piece.tensor(view.base).data_type.itemsize) % 16:
            return f"cuDNN needs 16-byte aligned operands; {piece.tensor(uid).label()} starts {view.offset} elements in"
    return views


def operand_slots(piece: Piece) -> tuple[list[int], dict[int, View]]:
    """What the cuDNN graph of the piece binds, in canonical order: the piece's inputs and outputs that
    its ops read and write themselves (not only through views), then the attention operands and
    gradients that are views, by their UIDs; and those Views."""
    views = attention_views(piece)
    if not isinstance(views, dict):
        return [*piece.inputs, *piece.outputs], {}
    node = next(n for n in piece.nodes if n.kind in ATTENTION_KINDS)
    direct = set(node.input_uids()) | set(node.output_uids())
    keys = [u for u in (*piece.inputs, *piece.outputs) if u in direct]
    order = [node.input(r) for r in node.op.input_roles()] + list(node.outputs)
    keys += [u for u in order if isinstance(u, int) and u in views]
    return list(dict.fromkeys(keys)), views  # (one view may serve two roles: q and k of self-attention)


def _rows_can_be_empty(node: Node, piece: Piece) -> bool:
    op = node.op_as(_Attention)
    sq, skv = piece.tensor(node.input("q")).dim[2], piece.tensor(node.input("k")).dim[2]  # type: ignore[arg-type]
    return op.use_padding_mask or (
        sq > skv and (op.use_causal_mask_bottom_right or op.sliding_window_length is not None)
    )


def attention_problem(node: Node, piece: Piece) -> str | None:
    """Why the cudnn engine does not offer this attention node to cuDNN (None: ask cuDNN)."""
    op = node.op_as(_Attention)
    if extra := extensions(node):  # (issue 41, phase A: the torch engine runs these)
        return f"the cudnn engine does not lower {'; '.join(extra)} yet"
    t = {r: piece.tensor(v) for r, v in zip(op.input_roles(), node.inputs) if isinstance(v, int)}
    t.update({r: piece.tensor(u) for r, u in zip(op.output_roles(), node.outputs) if u is not None})
    for role in ("q", "k", "v", "o", "dO"):
        if role in t and t[role].data_type not in _TYPES:
            return f"cuDNN's sdpa takes fp16/bf16 tensors ('{role}' is {t[role].data_type.name})"
    for role in ("q", "k", "v", "o", "dO", "dQ", "dK", "dV"):
        if role in t and t[role].stride[3] != 1:
            return f"cuDNN needs the head dim of '{role}' contiguous (stride 1 along axis 3)"
    if t["q"].dim[3] % 8 or t["v"].dim[3] % 8:
        return f"cuDNN's head dims are multiples of 8 (D={t['q'].dim[3]}, Dv={t['v'].dim[3]})"
    if op.score_mod is not None:
        return "the cudnn engine does not lower score modifiers (generated kernels run them)"
    if op.dropout_probability is not None:
        return "cuDNN's Philox dropout draws another random stream than the op's (tl.rand, docs/attention.md)"
    if node.input("dropout_mask") is not None and isinstance(node.input("dropout_scale"), Const):
        return (
            "cuDNN takes the dropout scale as a tensor: give dropout=(mask, scale) a 1-element or "
            "pass-by-value scale tensor for the cudnn engine"
        )
    stats = t.get("stats")
    if stats is not None and stats.data_type is not DataType.FLOAT:
        return f"cuDNN's Stats are FLOAT (here {stats.data_type.name})"
    if node.kind == "sdpa" and "stats" in t and _rows_can_be_empty(node, piece):
        return "cuDNN does not document Stats for rows with no key kept (the op's are +inf)"
    scale = t.get("attn_scale")
    if scale is not None and scale.data_type is not DataType.FLOAT:
        return f"cuDNN's attn_scale tensor is FLOAT (here {scale.data_type.name})"
    if node.kind == "sdpa_backward":
        missing = [r for r in ("dQ", "dK", "dV") if r not in t]
        if missing:
            return f"cuDNN's sdpa_backward writes dQ, dK and dV ({', '.join(missing)} not used here)"
        if node.input("dropout_mask") is not None:
            # dQ/dK disagreed with the reference (bench/results/constants.md#cudnn-attention-dropout-mask);
            # declined until the mask convention is understood
            return (
                "cuDNN's backward with an explicit dropout mask disagreed with the reference on the GPU "
                "(dQ, dK); the generated kernel runs it"
            )
    return None


def lower_attention(lowering: Any, node: Node, kwargs: dict[str, Any]) -> list[Any]:
    """The cuDNN tensors of the node's outputs (one per output role, None where absent)."""
    g, op = lowering.graph, node.op_as(_Attention)
    ins = {r: lowering.tensors[v] for r, v in zip(op.input_roles(), node.inputs) if isinstance(v, int)}
    consts = {r: float(v.value) for r, v in zip(op.input_roles(), node.inputs) if isinstance(v, Const)}
    common: dict[str, Any] = {
        "use_alibi_mask": op.use_alibi_mask,
        "use_padding_mask": op.use_padding_mask,
        "use_causal_mask": op.use_causal_mask,
        "use_causal_mask_bottom_right": op.use_causal_mask_bottom_right,
        **kwargs,
    }
    if op.sliding_window_length is not None:
        common["sliding_window_length"] = int(op.sliding_window_length)
    if "attn_scale" in consts:
        common["attn_scale"] = consts["attn_scale"]
    for role in ("attn_scale", "bias", "seq_len_q", "seq_len_kv"):
        if role in ins:
            common[role] = ins[role]
    if node.input("dropout_mask") is not None:  # forward only, the scale a tensor (attention_problem)
        common["dropout"] = (ins["dropout_mask"], ins["dropout_scale"])
    extras = lowering.extras  # the padded form's lengths and ragged offsets (cudnn_padded), if any
    if extras:
        common.update(use_padding_mask=True, seq_len_q=extras["seq_len_q"], seq_len_kv=extras["seq_len_kv"])
    if node.kind == "sdpa":
        stats = node.output("stats") is not None
        try:
            o, st = g.sdpa(ins["q"], ins["k"], ins["v"], generate_stats=stats, **common)
        except TypeError:  # frontends before generate_stats took is_inference
            o, st = g.sdpa(ins["q"], ins["k"], ins["v"], is_inference=not stats, **common)
        if extras:
            o.set_ragged_offset(extras["ragged_o"])
        return [o, st if stats else None]
    dbias = None
    uid = node.output("dBias")
    if uid is not None:
        d = lowering.piece.tensor(uid)
        dbias = g.tensor(dim=list(d.dim), stride=list(d.stride), data_type=lowering.dtype(d.data_type), name=f"t{uid}")
        common["dBias"] = dbias
    dq, dk, dv = g.sdpa_backward(
        ins["q"],
        ins["k"],
        ins["v"],
        ins["o"],
        ins["dO"],
        ins["stats"],
        use_deterministic_algorithm=node.op_as(SdpaBackward).use_deterministic_algorithm,
        **common,
    )
    return [dq, dk, dv, dbias]
