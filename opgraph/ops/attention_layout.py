"""How the tensors of an attention node lie (attention.py): dense, packed (ragged, THD: per-sequence
row offsets) or paged (a page table into a container of pages); the `Geometry` of the problem those
give, the checks of packed and paged tensors, and the node's `features` beyond the masks, layouts and
outputs the engines were first written for (each engine says which of them it runs)."""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.errors import AttributeValueError, ShapeError
from ..core.ir import Node
from ..core.op import NodeContext
from ..core.tensor import TensorDesc

FWD_RAGGED = ("q", "k", "v", "o", "stats")
BWD_RAGGED = ("q", "k", "v", "o", "dO", "stats", "dQ", "dK", "dV")
KV_SIDE = frozenset({"k", "v", "dK", "dV"})  # tensors whose rows are keys (the rest are queries)


def ragged_role(tensor_role: str) -> str:
    """The input role of the ragged offset of the tensor under `tensor_role` ("q" -> "q_ragged_offset")."""
    return f"{tensor_role}_ragged_offset"


@dataclass(frozen=True)
class Geometry:
    """The logical problem of one attention node: B sequences, Hq/Hk/Hv heads, Sq queries and Skv keys
    per sequence (the padded dims), head dims D and Dv; which tensors are packed and which paged."""

    b: int
    hq: int
    hk: int
    hv: int
    sq: int
    skv: int
    d: int
    dv: int
    packed: frozenset[str]
    paged: frozenset[str]

    @property
    def scores(self) -> tuple[int, int, int, int]:
        return (self.b, self.hq, self.sq, self.skv)

    def rows(self, role: str) -> int:
        return self.skv if role in KV_SIDE else self.sq


# -- features -----------------------------------------------------------------------------------------


class Feature(enum.Enum):
    """What an attention node may use beyond dense tensors, the causal and sliding-window masks and
    the O / Stats outputs (issue 41); an engine names the ones it runs."""

    PACKED = "packed"  # ragged offsets of q, k, v, o, stats (dQ ... in the backward)
    PAGED = "paged"  # a paged KV cache
    BAND_RIGHT = "band_right"  # a diagonal band's right bound other than the causal flags' 0
    BAND_BOTTOM_RIGHT = "band_bottom_right"  # a bottom-right aligned band without the causal flag
    SINK = "sink"
    BLOCK_MASK = "block_mask"
    EXTRA_OUTPUT = "extra_output"  # score_max, score_sum_exp, rng_dump, dSink_token
    EMPTY_ROW_STATS = "empty_row_stats"  # Stats of -inf on rows with no key kept


def features(node: Node) -> list[tuple[Feature, str]]:
    """The features of an attention node with a phrase for each (for a decline reason)."""
    op: Any = node.op
    roles = dict(zip(op.input_roles(), node.inputs))
    out = []
    packed = [r.removesuffix("_ragged_offset") for r, v in roles.items() if r.endswith("_ragged_offset") and v]
    if packed:
        out.append((Feature.PACKED, f"packed (ragged) {', '.join(packed)}"))
    if roles.get("paged_attention_k_table") is not None or roles.get("paged_attention_v_table") is not None:
        out.append((Feature.PAGED, "a paged KV cache"))
    if op.diagonal_band_right_bound is not None:
        out.append((Feature.BAND_RIGHT, f"a diagonal band with right bound {op.diagonal_band_right_bound}"))
    if op.diagonal_alignment.name == "BOTTOM_RIGHT" and not op.use_causal_mask_bottom_right:
        out.append((Feature.BAND_BOTTOM_RIGHT, "a bottom-right aligned band without the causal flag"))
    for role, feature in (("sink_token", Feature.SINK), ("block_mask", Feature.BLOCK_MASK)):
        if roles.get(role) is not None:
            out.append((feature, f"a {role.replace('_', ' ')}"))
    present = {r for r, u in zip(op.output_roles(), node.outputs) if u is not None}
    for role in ("score_max", "score_sum_exp", "rng_dump", "dSink_token"):
        if role in present:
            out.append((Feature.EXTRA_OUTPUT, f"the {role} output"))
    if getattr(op, "empty_row_stats", "+inf") != "+inf" and "stats" in present:
        out.append((Feature.EMPTY_ROW_STATS, f"Stats of {op.empty_row_stats} on rows with no key kept"))
    return out


def extensions(node: Node, runs: frozenset[Feature] = frozenset()) -> list[str]:
    """The phrases of the node's features that an engine running `runs` does not run ([] when none).
    The torch and reference engines run all of them."""
    return [phrase for f, phrase in features(node) if f not in runs]


# -- packed and paged tensors -------------------------------------------------------------------------


def packed_batch(ctx: NodeContext) -> int:
    if not ctx.has("seq_len_q"):
        ctx.error(
            ShapeError,
            "packed q needs seq_len_q (the length of each sequence)",
            tensor="q",
            rule="sdpa.ragged",
            hint="pass use_padding_mask=True with seq_len_q and seq_len_kv [B, 1, 1, 1]",
        )
    return ctx.tensor("seq_len_q").dim[0]


def max_len(ctx: NodeContext, attr: str, value: int | None, role: str) -> int:
    if value is None or isinstance(value, bool) or not isinstance(value, int) or value < 1:
        ctx.error(
            AttributeValueError,
            f"packed '{role}' needs {attr} (a positive int), got {value!r}",
            tensor=role,
            rule="sdpa.max_seq_len",
            hint=f"pass {attr}=<the longest sequence>: the padded dims of the scores",
        )
    return value


def check_packed_dims(ctx: NodeContext, role: str, t: TensorDesc) -> None:
    if t.dim[0] != 1:
        ctx.error(
            ShapeError,
            f"packed '{role}' has dims {list(t.dim)}; a packed tensor is [1, H, T, D]",
            tensor=role,
            rule="sdpa.ragged",
            hint="give packed tensors batch 1: the tokens of every sequence lie along axis 2",
        )


def paged_length(max_seq_len_kv: int | None, ctx: NodeContext, role: str, t: TensorDesc, b: int) -> int:
    """Skv of a paged k or v (`t`, the container [pages, H, block, D]), its page table checked."""
    table_role = f"paged_attention_{role}_table"
    table = ctx.tensor(table_role)
    if not table.data_type.is_integer or len(table.dim) != 4 or table.dim[1] != 1 or table.dim[3] != 1:
        ctx.error(
            ShapeError,
            f"{table_role} is {table.data_type.name} {list(table.dim)}",
            tensor=table_role,
            rule="sdpa.paged",
            hint="give an integer page table [B, 1, pages per sequence, 1]",
        )
    packed_table = ctx.has(f"{table_role}_ragged_offset")
    if not packed_table and table.dim[0] != b:
        ctx.error(
            ShapeError,
            f"{table_role} has batch {table.dim[0]}, the problem {b}",
            tensor=table_role,
            rule="sdpa.paged",
            hint="one row of pages per sequence",
        )
    if packed_table:
        check_packed_dims(ctx, table_role, table)
    if max_seq_len_kv is not None:
        return max_len(ctx, "max_seq_len_kv", max_seq_len_kv, role)
    if packed_table:
        return max_len(ctx, "max_seq_len_kv", None, role)
    return table.dim[2] * t.dim[2]


def tuning_inputs(
    tensors: Mapping[str, TensorDesc], max_q: int | None, max_kv: int | None, divisor: Callable[[str], int]
) -> dict[str, np.ndarray]:
    """An attention's lengths, ragged offsets and page tables for timing configs (Op.tuning_inputs): every
    sequence of one length, as long as the packed tensors allow (their rows over the batch, at most the
    max_seq_len attribute) or the dense Sq and Skv; pages in order. Random integers are no lengths: timed on
    them, the tuner chose a config slower than the heuristic's (bench/results/constants.md#tuning-inputs)."""
    q, k = tensors["q"], tensors["k"]
    lens = tensors.get("seq_len_q", tensors.get("seq_len_kv"))
    packed_q = ragged_role("q") in tensors
    b = int(lens.dim[0]) if lens is not None and packed_q else int(q.dim[0])

    def length(t: TensorDesc, packed: bool, most: int | None) -> int:
        rows = int(t.dim[2])
        return max(1, min(most or rows, rows // b)) if packed else rows

    lq = length(q, packed_q, max_q)
    table = tensors.get("paged_attention_k_table")
    packed_table = "paged_attention_k_table_ragged_offset" in tensors
    # a sequence's slots: the table's, or (a packed table [1, 1, T, 1]) its rows over the batch
    pages = (max(1, int(table.dim[2]) // b) if packed_table else int(table.dim[2])) if table is not None else 0
    if table is not None:
        lkv = min(max_kv or pages * int(k.dim[2]), pages * int(k.dim[2]))
    else:
        lkv = length(k, ragged_role("k") in tensors, max_kv)
    values: dict[str, Any] = {"seq_len_q": lq, "seq_len_kv": lkv}
    # (one offsets tensor may serve several roles: the first role's units hold, the operands' before stats')
    for role in sorted(set(FWD_RAGGED) | set(BWD_RAGGED), key=lambda r: (r == "stats", BWD_RAGGED.index(r))):
        rows = lkv if role in KV_SIDE else lq
        values[ragged_role(role)] = np.arange(b + 1) * rows * divisor(role)
    for r in ("k", "v"):
        container = tensors.get(r)
        blocks = int(container.dim[0]) if container is not None else 1
        values[f"paged_attention_{r}_table"] = np.arange(b * pages) % max(blocks, 1)
        values[f"paged_attention_{r}_table_ragged_offset"] = (
            np.arange(b + 1) * pages * divisor(f"paged_attention_{r}_table")
        )
    out = {}
    for role, value in values.items():
        t = tensors.get(role)
        if t is not None:
            out[role] = np.resize(np.asarray(value).ravel(), int(np.prod(t.dim))).reshape(t.dim)
    return out
