"""The option checks of the attention ops (attention.py): the band, packed tensors, sink token and
block mask, dropout and score modifiers. Each raises the typed error of its rule through `ctx`."""

from __future__ import annotations

from typing import Any

from ..core.errors import AttributeValueError, DataTypeError, ShapeError
from ..core.ir import Const
from ..core.op import NodeContext
from ..core.tensor import TensorDesc
from . import attention_ref as ref
from .pointwise import Pointwise, PointwiseMode
from .score_mod import Src


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _pointwise_roles(node) -> tuple[str, ...]:
    return Pointwise(mode=node.mode, axis=node.axis).input_roles()


def check_band(op: Any, ctx: NodeContext) -> None:
    if op.use_causal_mask and op.use_causal_mask_bottom_right:
        ctx.error(
            AttributeValueError,
            "use_causal_mask and use_causal_mask_bottom_right are both set",
            rule="sdpa.causal",
            hint="pick one alignment of the causal diagonal",
        )
    w = op.sliding_window_length
    if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1):
        ctx.error(
            AttributeValueError,
            f"sliding_window_length={w!r} is not a positive int",
            rule="sdpa.sliding_window",
            hint="pass the window length W >= 1 (keys i-W < j <= i)",
        )
    r = op.diagonal_band_right_bound
    if r is not None:
        if isinstance(r, bool) or not isinstance(r, int) or r < 0:
            ctx.error(
                AttributeValueError,
                f"diagonal_band_right_bound={r!r} is not an int >= 0",
                rule="sdpa.band",
                hint="pass the right bound R >= 0 (keys j <= i + R); 0 is causal",
            )
        if op.use_causal_mask or op.use_causal_mask_bottom_right:
            ctx.error(
                AttributeValueError,
                "a causal flag and diagonal_band_right_bound are both set",
                rule="sdpa.band",
                hint="the causal flags are right bound 0: set one of the two",
            )
    if op.use_causal_mask and op.diagonal_alignment.name == "BOTTOM_RIGHT":
        ctx.error(
            AttributeValueError,
            "use_causal_mask (top-left) with diagonal_alignment=BOTTOM_RIGHT",
            rule="sdpa.band",
            hint="use use_causal_mask_bottom_right, or the TOP_LEFT alignment",
        )


def check_packed(op: Any, ctx: NodeContext, g: Any) -> None:
    roles = [r for r in op.input_roles() if r.endswith("_ragged_offset") and ctx.has(r)]
    if roles and not op.use_padding_mask:
        ctx.error(
            AttributeValueError,
            f"{roles[0]} is given without use_padding_mask",
            tensor=roles[0],
            rule="sdpa.ragged",
            hint="packed sequences are cut by their lengths: set use_padding_mask=True with seq_len_q and seq_len_kv",
        )
    for role in roles:
        t = ctx.tensor(role)
        if not t.data_type.is_integer or len(t.dim) != 4 or t.dim[0] not in (g.b, g.b + 1) or t.dim[1:] != (1, 1, 1):
            ctx.error(
                ShapeError,
                f"{role} is {t.data_type.name} {list(t.dim)}, expected an integer [{g.b} or {g.b + 1}, 1, 1, 1]",
                tensor=role,
                rule="sdpa.ragged",
                hint="one offset (in rows of axis 2) per sequence, e.g. the exclusive prefix sum of the lengths",
            )
    known = {r.removesuffix("_ragged_offset") for r in op.input_roles() if r.endswith("_ragged_offset")}
    for role, n in op.ragged_offset_strides:
        if role not in known or isinstance(n, bool) or not isinstance(n, int) or n < 1:
            ctx.error(
                AttributeValueError,
                f"ragged_offset_strides has ({role!r}, {n!r})",
                rule="sdpa.ragged",
                hint=f"pairs of a packed tensor's role (one of {sorted(known)}) and its elements per row >= 1",
            )
    if (
        ctx.has("paged_attention_k_table_ragged_offset")
        and not ctx.has("paged_attention_k_table")
        or ctx.has("paged_attention_v_table_ragged_offset")
        and not ctx.has("paged_attention_v_table")
    ):
        ctx.error(
            AttributeValueError,
            "a page table offset without its page table",
            rule="sdpa.paged",
            hint="pass paged_attention_k_table / paged_attention_v_table",
        )


def check_extras(op: Any, ctx: NodeContext, g: Any) -> None:
    if ctx.has("sink_token"):
        t = ctx.tensor("sink_token")
        if t.dim != (1, g.hq, 1, 1) or not t.data_type.is_floating:
            ctx.error(
                ShapeError,
                f"sink_token is {t.data_type.name} {list(t.dim)}, expected FLOAT [1, {g.hq}, 1, 1]",
                tensor="sink_token",
                rule="sdpa.sink",
                hint="one sink logit per query head",
            )
    if ctx.has("block_mask"):
        t = ctx.tensor("block_mask")
        tile = ref.BLOCK_MASK_TILE
        want = (g.b, g.hq, _ceil(g.sq, tile), _ceil(_ceil(g.skv, tile), 8))
        if t.dim != want or not t.data_type.is_integer:
            ctx.error(
                ShapeError,
                f"block_mask is {t.data_type.name} {list(t.dim)}, expected UINT8 {list(want)}",
                tensor="block_mask",
                rule="sdpa.block_mask",
                hint=f"one bit per {tile}x{tile} tile of the scores, 8 key tiles a byte",
            )


INT64_MAX = 2**63 - 1


def philox_problem(role: str, value: int) -> tuple[str, str, str] | None:
    """What is wrong with a host value (a literal or a pass-by-value tensor's) of the Philox seed or
    offset: (message, rule, hint), or None. Both are non-negative int64 values."""
    if 0 <= value <= INT64_MAX:
        return None
    where = "negative" if value < 0 else "beyond int64"
    return (
        f"{role}={value} is {where}",
        "sdpa.dropout",
        "give the Philox seed and offset as integers in [0, 2**63 - 1] (a uint64 seed such as "
        "torch.initial_seed(): take it modulo 2**63)",
    )


def check_dropout(op: Any, ctx: NodeContext) -> None:
    p = op.dropout_probability
    philox = [r for r in ("dropout_seed", "dropout_offset") if ctx.has(r)]
    if p is not None:
        if not (isinstance(p, float) and 0.0 <= p < 1.0):
            ctx.error(
                AttributeValueError,
                f"dropout probability {p!r} is outside [0, 1)",
                rule="sdpa.dropout",
                hint="pass dropout=(p, seed, offset) with 0 <= p < 1",
            )
        if len(philox) != 2:
            ctx.error(
                AttributeValueError,
                "Philox dropout needs a seed and an offset",
                rule="sdpa.dropout",
                hint="pass dropout=(p, seed, offset) with two 1-element INT64 tensors",
            )
        if ctx.has("dropout_mask"):
            ctx.error(
                AttributeValueError,
                "dropout has both a probability and a mask",
                tensor="dropout_mask",
                rule="sdpa.dropout",
                hint="pass (p, seed, offset) or (mask, scale), not both",
            )
    elif philox:
        ctx.error(
            AttributeValueError,
            f"{philox[0]} is given without a dropout probability",
            tensor=philox[0],
            rule="sdpa.dropout",
            hint="pass dropout=(p, seed, offset)",
        )
    for role in philox:
        t = ctx.input(role)
        if isinstance(t, TensorDesc) and not t.data_type.is_integer:
            ctx.error(
                DataTypeError,
                f"{role} has data type {t.data_type.name}",
                tensor=role,
                rule="sdpa.dropout",
                hint="give the Philox seed and offset an integer type (INT64)",
            )
        if isinstance(t, Const) and (isinstance(t.value, float) and not float(t.value).is_integer()):
            ctx.error(
                AttributeValueError,
                f"{role}={t.value} is not an integer",
                rule="sdpa.dropout",
                hint="seeds and offsets are integers",
            )
        if isinstance(t, Const) and isinstance(t.value, (int, float)):
            problem = philox_problem(role, int(t.value))
            if problem is not None:
                ctx.error(AttributeValueError, problem[0], rule=problem[1], hint=problem[2])
    if ctx.has("dropout_mask"):
        op.check_broadcast(ctx, "dropout_mask", "sdpa.dropout", "dropout mask")
        if not ctx.has("dropout_scale"):
            ctx.error(
                AttributeValueError,
                "a dropout mask needs its scale",
                rule="sdpa.dropout",
                hint="pass dropout=(mask, scale), scale usually 1 / (1 - p)",
            )
    elif ctx.has("dropout_scale") or ctx.has("dropout_scale_inv"):
        ctx.error(
            AttributeValueError,
            "a dropout scale is given without a mask",
            rule="sdpa.dropout",
            hint="pass dropout=(mask, scale)",
        )


def check_score_mod(op: Any, ctx: NodeContext) -> None:
    mods = [("score_mod", op.score_mod), ("score_mod_grad", getattr(op, "score_mod_grad", None))]
    for what, mod in mods:
        if mod is None:
            continue
        n_in = op.score_mod.num_inputs if op.score_mod is not None else 0
        for i, node in enumerate(mod.nodes):
            bad = [
                r
                for r in node.operands
                if r is not None
                and (
                    (r.src is Src.NODE and r.index >= i)
                    or (r.src is Src.INPUT and r.index >= n_in)
                    or (r.src is Src.GRAD and what == "score_mod")
                )
            ]
            if bad or len(node.operands) != len(_pointwise_roles(node)):
                ctx.error(
                    AttributeValueError,
                    f"{what} node %{i} ({node}) has operands that refer to no earlier node, input or score",
                    rule="sdpa.score_mod",
                    hint="rebuild the modifier through g.sdpa(..., score_mod=fn)",
                )
            if node.mode is PointwiseMode.GEN_INDEX and node.axis not in (0, 1, 2, 3):
                ctx.error(
                    AttributeValueError,
                    f"{what} node %{i} gen_index(axis={node.axis}) indexes no axis of the scores [B, H, Sq, Skv]",
                    rule="sdpa.score_mod_axis",
                    hint="use axis 2 for the query position i, 3 for the key position j",
                )
        r = mod.result
        if (r.src is Src.NODE and r.index >= len(mod.nodes)) or (r.src is Src.INPUT and r.index >= n_in):
            ctx.error(
                AttributeValueError,
                f"{what} result {r} refers to nothing",
                rule="sdpa.score_mod",
                hint="rebuild the modifier through g.sdpa(..., score_mod=fn)",
            )
    for role in op.score_mod.input_roles() if op.score_mod is not None else ():
        op.check_broadcast(ctx, role, "sdpa.score_mod_input", "score_mod input")
