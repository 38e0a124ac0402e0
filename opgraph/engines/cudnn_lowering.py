"""Lowering a piece to the cuDNN frontend's graph (the cudnn engine's, cudnn_frontend.py): each node the
pygraph call of the same name with the same roles, literals compile-time scalars, the piece's inputs and
outputs (and attention operands read through views) declared with canonical UIDs, intermediates virtual
tensors of their declared type; in the padded form (cudnn_padded) the attention's lengths and ragged
offsets too. The graph only: planning and building are the engine's.
"""

from __future__ import annotations

from typing import Any

from ..core.dtypes import DataType
from ..core.errors import InternalError, expect
from ..core.ir import Const, Node
from ..core.piece import Piece
from ..ops.pointwise import Pointwise
from ..ops.reduction import Reduction
from .cudnn_padded import EXTRA_UIDS, EXTRAS, PaddedForm, sections
from .cudnn_sdpa import ATTENTION_KINDS, MOVES, lower_attention, operand_slots, scalar_uids

GEMM_KINDS = frozenset({"conv_fprop", "conv_dgrad", "conv_wgrad", "matmul"})
# opgraph pointwise modes whose scalar parameters cuDNN's pygraph takes (as numbers), by method
PARAM_METHODS = frozenset({"relu", "relu_backward", "swish", "swish_backward"})
_CONV_ATTRS = ("pre_padding", "post_padding", "stride", "dilation")


def cudnn_module() -> Any:
    import cudnn  # noqa: PLC0415 - optional dependency

    return cudnn


def cudnn_type(cudnn: Any, dt: DataType) -> Any:
    return getattr(cudnn.data_type, dt.name)


CANON_BASE = 1 << 20


def canonical_uids(piece: Piece, keys: list[int] | None = None) -> dict[int, int]:
    """The UIDs a piece's cuDNN graph gives what it binds (its inputs and outputs, and attention
    operands read through views: cudnn_sdpa.operand_slots): by position (CANON_BASE + i), not the
    piece's own, so that a plan built (and serialized) for one piece serves every piece with the same
    signature (the repeated blocks of a network). Far above the frontend's own numbering of virtual
    tensors. `keys`: operand_slots(piece)'s, where the caller has them."""
    return {u: CANON_BASE + i for i, u in enumerate(operand_slots(piece)[0] if keys is None else keys)}


def canonical_extras(slots: int) -> dict[int, int]:
    """The padded form's tensors (cudnn_padded.EXTRAS) by their stand-in UIDs -> their UIDs in the cuDNN
    graph: numbered after the piece's `slots` operands, in EXTRAS order (the lowering declares them so,
    a kernel binds them so)."""
    return {EXTRA_UIDS[name]: CANON_BASE + slots + i for i, name in enumerate(EXTRAS)}


def _number(node: Node, role: str) -> float:
    """A pointwise parameter, which `_pointwise_problem` made sure is a literal."""
    value = node.input(role)
    if not isinstance(value, Const):
        raise InternalError(
            f"{role} is not a literal",
            op=node.label(),
            rule="internal.invariant",
            hint="this is an opgraph bug: please report it with the graph",
        )
    return float(value.value)


class Lowering:
    """Builds the cuDNN pygraph of a piece (the graph only: planning is the caller's)."""

    def __init__(self, piece: Piece, handle: Any, padded: PaddedForm | None = None) -> None:
        self.cudnn = cudnn = cudnn_module()
        self.piece = piece
        self.graph = cudnn.pygraph(
            name=f"opgraph_piece_{piece.index}",
            io_data_type=cudnn.data_type.HALF,
            intermediate_data_type=cudnn.data_type.FLOAT,
            compute_data_type=cudnn.data_type.FLOAT,
            handle=handle,
        )
        self.tensors: dict[int, Any] = {}
        self.by_value: list[int] = []
        keys, self.views = operand_slots(piece)
        self.canon = canonical_uids(piece, keys)
        scalars = scalar_uids(piece)
        produced = {u for n in piece.nodes if n.kind not in MOVES for u in n.output_uids()}
        for uid in keys:
            if uid in produced:
                continue  # (an output, declared by its op; a view operand's own tensor is declared here)
            t = self.views[uid].desc if uid in self.views else piece.tensor(uid)
            dim, stride = ([1, 1, 1, 1], [1, 1, 1, 1]) if uid in scalars else (list(t.dim), list(t.stride))
            self.tensors[uid] = self.graph.tensor(
                dim=dim,
                stride=stride,
                data_type=cudnn_type(cudnn, t.data_type),
                uid=self.canon[uid],
                is_pass_by_value=t.is_pass_by_value,
                name=f"t{uid}",
            )
            if t.is_pass_by_value:
                self.by_value.append(uid)
        self.extras: dict[str, Any] = {}
        if padded is not None:
            self._declare_padding(padded, keys)
        for node in piece.nodes:
            self._node(node)

    def _declare_padding(self, padded: PaddedForm, keys: list[int]) -> None:
        """The padded form's int32 lengths and ragged offsets (cudnn_padded), numbered after the piece's
        operands, the offsets set on q, k and v (o's once the sdpa made it)."""
        node = next(n for n in self.piece.nodes if n.kind in ATTENTION_KINDS)
        self.canon.update(canonical_extras(len(keys)))
        for name, (_, rows) in sections(padded.batch).items():
            self.extras[name] = self.graph.tensor(
                dim=[rows, 1, 1, 1],
                stride=[1, 1, 1, 1],
                data_type=self.cudnn.data_type.INT32,
                uid=self.canon[EXTRA_UIDS[name]],
                name=name,
            )
        for role in ("q", "k", "v"):
            self.tensors[node.input(role)].set_ragged_offset(self.extras[f"ragged_{role}"])  # type: ignore[index]

    def dtype(self, dt: DataType) -> Any:
        return cudnn_type(self.cudnn, dt)

    def _operand(self, value: Any) -> Any:
        if isinstance(value, Const):
            return self.graph.tensor_scalar(float(value.value), self.cudnn.scalar_type.COMPILE_TIME_CONST)
        return self.tensors[value]

    def _node(self, node: Node) -> None:
        g, kind = self.graph, node.kind
        if self.views and kind in MOVES:  # (static_problem let view ops in only as views of attention)
            return  # (read or written in place: the views' tensors)
        kwargs: dict[str, Any] = {
            "compute_data_type": cudnn_type(self.cudnn, node.compute_data_type),
            "name": f"n_{node.name}",
        }
        roles = {r: self._operand(v) for r, v in zip(node.op.input_roles(), node.inputs) if v is not None}
        if kind == "pointwise":
            op = node.op_as(Pointwise)
            method = op.mode.value
            operands = [roles.pop(r) for r in op.operand_roles()]
            params = {r: _number(node, r) for r in roles}
            if method in PARAM_METHODS:
                kwargs.update(params)
            if method in ("relu_backward", "swish_backward"):
                outs = [getattr(g, method)(operands[0], operands[1], **kwargs)]
            else:
                outs = [getattr(g, method)(*operands, **kwargs)]
        elif kind in ATTENTION_KINDS:
            outs = lower_attention(self, node, kwargs)
        elif kind == "matmul":
            outs = [g.matmul(roles["A"], roles["B"], **kwargs)]
        elif kind == "reduction":
            mode = getattr(self.cudnn.reduction_mode, node.op_as(Reduction).mode.name)
            out = self.piece.tensor(expect(node.outputs[0], "the reduction's output"))
            outs = [g.reduction(roles["input"], mode=mode, out_dims=list(out.dim), **kwargs)]
        elif kind in GEMM_KINDS:
            attrs = {a: list(getattr(node.op, a)) for a in _CONV_ATTRS}
            out = self.piece.tensor(expect(node.outputs[0], f"the {kind} output"))
            outs = [getattr(g, kind)(**roles, **attrs, out_dims=list(out.dim), **kwargs)]
        else:  # genstats: same roles, outputs in the same order
            result = getattr(g, kind)(**roles, **kwargs)
            outs = list(result) if isinstance(result, (tuple, list)) else [result]
        for uid, t in zip(node.outputs, outs):
            if uid is None or t is None:
                continue
            desc = self.views[uid].desc if uid in self.views else self.piece.tensor(uid)
            t.set_data_type(cudnn_type(self.cudnn, desc.data_type)).set_dim(list(desc.dim)).set_stride(
                list(desc.stride)
            )
            if uid in self.piece.outputs or uid in self.views:
                t.set_output(True).set_uid(self.canon[uid])
            self.tensors[uid] = t


__all__ = [
    "CANON_BASE",
    "GEMM_KINDS",
    "PARAM_METHODS",
    "Lowering",
    "canonical_extras",
    "canonical_uids",
    "cudnn_module",
    "cudnn_type",
]
