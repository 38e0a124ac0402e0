"""The forward graph of a training step, prepared from an imported module's graph.

`prepare_forward(final, ...)` replays the imported graph into a new `Graph` (same UIDs, names, dims)
with three changes a training step needs:

1. Tied parameters. The importer binds each distinct view of a module tensor as its own graph input
   (a tied embedding is read as `W` by the lookup and as `W^T` by the output projection). Updating
   both in place would update the storage twice, and the plan could not order the reads of one view
   before the in-place write of the other. So a parameter read through several views becomes one
   input (the module's tensor as it is, named by its key) and each view becomes ops on it
   (transpose, reshape, slice; an expand is a product with an input of ones of the expanded dims,
   held with zero strides, `Prepared.ones`): the gradients of the uses are summed by autodiff, the
   update is done once, and every read is ordered before it. A parameter read through one view of
   part of it (a slice) or a broadcast (an expand) is made one input the same way, so that it is
   updated whole (opgraph.training.module_graph).
2. Normalizations: layernorm and rmsnorm in inference form (how the importer reads them) become the
   training form, and training batchnorm outputs its batch statistics: the backward reads the saved
   mean / inv_variance instead of recomputing them. Likewise sdpa generates its Stats (the row
   log-sum-exp, [B, H, Sq, 1]): the backward reads the forward's O and Stats, as flash attention's
   does, instead of running the attention forward again (opgraph.grad's recompute of a stat-less sdpa).
3. Mixed precision (`low` = BFLOAT16 or HALF), the casts torch.autocast makes on CUDA, in graph form:
   - every floating operand of a matmul, convolution or sdpa is cast to `low` (a parameter's 16-bit compute
     copy is one identity op per parameter, which generated kernels fuse into the GEMM's prologue or
     the producer's epilogue), and the GEMM's result is `low`;
   - a pointwise op whose activation operands (tensors computed in the graph, not parameters,
     buffers or constants) are all `low` computes to `low` (a bias added to a 16-bit matmul result
     stays 16-bit, as linear's does under autocast), except the modes autocast runs in fp32 (exp, log,
     pow, rsqrt, reciprocal, tan, softplus);
   - layout ops keep their input's type (a concatenation of operands of mixed types runs in the widest,
     its operands cast up, as autocast promotes cat), and so does batchnorm's y (autocast leaves batch_norm to
     cuDNN in the input's type; its statistics stay fp32); everything else (reductions, layer and RMS
     norms, softmax's parts, losses, embeddings, custom ops) keeps the imported (fp32) type.
   Parameters stay fp32 (the master weights); their gradients are fp32 through the cast's backward.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.dtypes import DataType
from ..core.errors import UnsupportedGraphError, expect
from ..core.ir import Const, FinalGraph, Node
from ..core.tensor import Tensor
from ..graph.builder import Graph
from ..ops.attention import Sdpa
from ..ops.layernorm import Layernorm, Rmsnorm
from ..ops.layout import Reshape, Slice, Transpose
from ..ops.norm import Batchnorm
from ..ops.norm_common import NormForwardPhase
from ..ops.pointwise import Pointwise, PointwiseMode

# autocast's lower-precision ops (scaled dot-product attention: the sdpa op, when translated)
GEMM_KINDS = frozenset({"matmul", "conv_fprop", "conv_dgrad", "conv_wgrad", "sdpa"})
_Y_ONLY = frozenset({"batchnorm", "batchnorm_inference"})  # y in the input's type, stats fp32
LAYOUT_KINDS = frozenset({"reshape", "transpose", "slice", "concatenate"})
# aten view ops that read part of a tensor or broadcast it: a parameter read so is updated whole
READS_PART = frozenset({"slice", "expand", "expand_copy"})
_FP32_MODES = frozenset(
    {
        PointwiseMode.EXP,
        PointwiseMode.LOG,
        PointwiseMode.POW,
        PointwiseMode.RSQRT,
        PointwiseMode.RECIPROCAL,
        PointwiseMode.TAN,
        PointwiseMode.SOFTPLUS_FWD,
    }
)


@dataclass
class TiedParam:
    """A module tensor read through several views: `members` are the imported graph's inputs (one
    per view, each with its `views` chain of aten view ops), `dim`/`stride`/`data_type` the tensor's own."""

    key: str
    members: list[tuple[int, tuple]]
    dim: tuple[int, ...]
    stride: tuple[int, ...]
    data_type: DataType


@dataclass
class Prepared:
    """The prepared forward: `graph`, the new input of each tied parameter (key -> handle), and the
    normalization stats the training form added (outputs here, so that the forward alone validates;
    make them virtual again in the step graph, where the backward reads them)."""

    graph: Graph
    tied: dict[str, Tensor] = field(default_factory=dict)
    stats: list[int] = field(default_factory=list)
    casts: int = 0
    ones: dict[int, tuple[int, ...]] = field(default_factory=dict)  # inputs of ones (UID -> dims): bind expanded


def prepare_forward(
    final: FinalGraph,
    *,
    bound: set[int],
    tied: Sequence[TiedParam] = (),
    low: DataType | None = None,
    internal: Sequence[int] = (),
    output_types: Mapping[int, DataType | None] | None = None,
    name: str | None = None,
) -> Prepared:
    """Replay `final` as described in the module docstring. `bound`: UIDs of the inputs bound from the
    module (parameters, buffers, constants), which do not make a pointwise op wide. `internal`: outputs
    of `final` that become virtual (the module's results, which a loss reads), typed like any
    intermediate (the graph does not validate until something reads them). `output_types`: outputs of
    `final` that stay outputs in another type (the type eager PyTorch gives a module's result under
    autocast; None: the autocast type of the op making it), written by that op."""
    output_types = output_types or {}
    internal_uids = set(internal)
    g = Graph(
        name or final.name,
        io_data_type=final.io_data_type,
        intermediate_data_type=final.intermediate_data_type,
        compute_data_type=final.compute_data_type,
    )
    handles: dict[int, Tensor] = {}
    types: dict[int, DataType] = {}
    members = {uid: t for t in tied for uid, _ in t.members}
    prepared = Prepared(g)
    next_uid = [max(final.tensors) + 1]

    def new_uid() -> int:
        next_uid[0] += 1
        return next_uid[0] - 1

    for uid in final.inputs:
        if uid in members:
            continue
        d = final.tensors[uid]
        handles[uid] = g.tensor(
            dim=d.dim,
            stride=d.stride,
            data_type=d.data_type,
            name=d.name,
            uid=uid,
            is_pass_by_value=d.is_pass_by_value,
            is_by_reference=d.is_by_reference,
        )
        types[uid] = d.data_type
    views_of: dict[int, tuple] = {}
    for t in tied:
        prepared.tied[t.key] = g.tensor(dim=t.dim, stride=t.stride, data_type=t.data_type, name=t.key, uid=new_uid())
        for uid, views in t.members:
            views_of[uid] = views
            types[uid] = t.data_type

    def handle(uid: int) -> Tensor:
        """The tensor standing for `uid`; a tied member's view ops are made right before their first
        reader, so that they run in that reader's kernel (views of the parameter read in place)."""
        if uid not in handles:
            t = members[uid]
            handles[uid] = _viewed(g, prepared.tied[t.key], views_of[uid], final.tensors[uid].dim, t.key, new_uid, ones)
        return handles[uid]

    def ones(dims: tuple[int, ...], data_type: DataType) -> Tensor:
        """An input of ones of `dims` (bound to one element with zero strides)."""
        t = g.tensor(
            dim=list(dims), stride=[0] * len(dims), data_type=data_type, name=f"ones{list(dims)}", uid=new_uid()
        )
        prepared.ones[t.known_uid()] = tuple(dims)
        return t

    bound = set(bound) | set(members)
    casts: dict[tuple[int, DataType], Tensor] = {}

    def cast(uid: int, to: DataType) -> Tensor:
        if (uid, to) not in casts:
            c = g.identity(handle(uid), name=f"{final.tensors[uid].name or uid}.to_{to.short}")
            casts[uid, to] = c.set_data_type(to).set_uid(new_uid())
        return casts[uid, to]

    for node in final.nodes:
        op, roles = _training_form(node)
        ins: list[Any] = []
        gemm = low is not None and node.kind in GEMM_KINDS
        # a concatenation of 16-bit and wider operands: all in the widest, its imported type (autocast's
        # promotion of cat: ViT's fp32 class token beside its 16-bit patch embeddings)
        widest = _promoted(node, final, types) if low is not None else None
        for v in node.inputs:
            if v is None or isinstance(v, Const):
                ins.append(None if v is None else v.value)
            elif low is not None and gemm and final.tensors[v].data_type.is_floating and types[v] is not low:
                ins.append(cast(v, low))
            elif widest is not None and types[v].is_floating and types[v] is not widest:
                ins.append(cast(v, widest))
            else:
                ins.append(handle(v))
        outs = g._add_op(op, ins, name=node.name, compute_data_type=node.compute_data_type, outputs=roles)
        out_type = _out_type(node, final, types, bound, low) if low is not None else None
        for role, out in zip(op.output_roles(), outs):
            typed = out_type if node.kind not in _Y_ONLY or role == "y" else None
            if out is None:
                continue
            out_uid = node.output(role) if role in node.op.output_roles() else None
            if out_uid is None:  # a stat the training form adds
                out.set_uid(new_uid()).set_output(True).set_data_type(final.intermediate_data_type)
                prepared.stats.append(out.known_uid())
                continue
            d = final.tensors[out_uid]
            virtual = d.is_virtual or out_uid in internal_uids
            wide = typed is not None and d.data_type in (DataType.FLOAT, DataType.DOUBLE)
            dt = typed if typed is not None and wide and virtual else d.data_type
            if not virtual and out_uid in output_types and d.data_type.is_floating:
                dt = output_types[out_uid] or (typed if wide and typed is not None else d.data_type)
            out.set_uid(out_uid).set_name(d.name).set_dim(d.dim).set_data_type(dt).set_is_virtual(virtual)
            if virtual and dt is d.data_type:
                out.set_stride(d.stride)
            elif not virtual:
                out.set_output(True).set_stride(d.stride)
            handles[out_uid], types[out_uid] = out, dt
    prepared.casts = len(casts)
    return prepared


def _training_form(node: Node) -> tuple[Any, list[str]]:
    """The op to replay and its output roles: layernorm / rmsnorm inference as training; batchnorm's
    and sdpa's statistics added (what their backward reads instead of recomputing)."""
    op = node.op
    present = [r for r, u in zip(op.output_roles(), node.outputs) if u is not None]
    if isinstance(op, (Layernorm, Rmsnorm)) and op.norm_forward_phase is NormForwardPhase.INFERENCE:
        return type(op)(norm_forward_phase=NormForwardPhase.TRAINING), list(op.output_roles())
    if isinstance(op, Batchnorm):  # the batch statistics, which the backward then reads
        return op, [r for r in op.output_roles() if r in present or r in ("mean", "inv_variance")]
    if isinstance(op, Sdpa):
        return op, [r for r in op.output_roles() if r in present or r == "stats"]
    return op, present


def _promoted(node: Node, final: FinalGraph, types: dict[int, DataType]) -> DataType | None:
    """The type a concatenation's floating operands of mixed types are cast to (its imported output
    type), or None (one type, or another op)."""
    if node.kind != "concatenate":
        return None
    kinds = {types[u] for u in node.input_uids() if types[u].is_floating}
    return final.tensors[node.output_uids()[0]].data_type if len(kinds) > 1 else None


def _out_type(
    node: Node, final: FinalGraph, types: dict[int, DataType], bound: set[int], low: DataType
) -> DataType | None:
    """The autocast type of the node's floating outputs (None: keep the imported type)."""
    if node.kind in GEMM_KINDS:
        return low
    ins = [u for u in node.input_uids() if final.tensors[u].data_type.is_floating or types[u].is_floating]
    if node.kind in LAYOUT_KINDS:
        kinds = {types[u] for u in ins}
        return low if kinds == {low} else None
    if node.kind in _Y_ONLY:
        x = node.input("input")
        return low if isinstance(x, int) and types[x] is low else None
    if (
        not isinstance(node.op, Pointwise)
        or node.op.mode in _FP32_MODES
        or node.op.info.bool_out
        or node.op.mode is PointwiseMode.GEN_INDEX
    ):
        return None
    acts = [u for u in ins if u not in bound and final.tensors[u].data_type.is_floating]
    if acts and all(types[u] is low for u in acts):
        return low
    return None


def _viewed(g: Graph, base: Tensor, views: tuple, dim: tuple[int, ...], key: str, new_uid: Any, ones: Any) -> Tensor:
    """`base` through a chain of aten view ops, as layout ops (transpose, reshape, slice) and, for an
    expand, a product with `ones(dims, type)` (an input of ones of the expanded dims)."""
    t = base
    shape = list(base.known_dim())

    def add(op: Any, *more: Tensor) -> Tensor:
        (out,) = g._add_op(op, [t, *more], name=f"{key}.view{new_uid()}")
        return expect(out, f"the output of {op.kind}").set_dim(tuple(shape))

    for op, args in views:
        name = getattr(op, "__name__", str(op)).split(".")[0]
        if name in ("t", "transpose", "permute"):
            perm = list(range(len(shape)))
            if name == "permute":
                perm = [a % len(shape) for a in args[0]]
            elif len(shape) == 2 or name == "transpose":
                a, b = (0, 1) if name == "t" else (args[0] % len(shape), args[1] % len(shape))
                perm[a], perm[b] = perm[b], perm[a]
            shape = [shape[p] for p in perm]
            if perm != sorted(perm):
                t = add(Transpose(permutation=tuple(perm)))
        elif name in ("view", "reshape", "_unsafe_view"):
            target = [int(s) for s in args[0]] or [1]
            if -1 in target:
                known = math.prod(s for s in target if s != -1)
                target = [math.prod(shape) // known if s == -1 else s for s in target]
            if target != shape:
                shape = target
                t = add(Reshape(dim=tuple(shape)))
        elif name == "slice":
            axis, start, stop, step = (list(args) + [None, None, 1])[:4]
            axis %= len(shape)
            bounds = [(0, s, 1) for s in shape]
            bounds[axis] = slice(start, stop, step).indices(shape[axis])
            shape[axis] = len(range(*bounds[axis]))
            t = add(Slice(slices=tuple(bounds)))
        elif name in ("expand", "expand_copy"):
            sizes = [int(s) for s in args[0]]
            lead = len(sizes) - len(shape)
            target = [shape[i - lead] if s == -1 and i >= lead else s for i, s in enumerate(sizes)]
            if lead > 0:
                shape = [1] * lead + shape
                t = add(Reshape(dim=tuple(shape)))
            if target != shape:
                shape = target
                t = add(Pointwise(mode=PointwiseMode.MUL), ones(tuple(shape), base.known_data_type()))
                t.set_data_type(base.known_data_type())
        else:
            raise UnsupportedGraphError(
                f"parameter '{key}' is read through a {name} view",
                rule="training.tied_view",
                hint="read tied parameters through view/reshape, t/transpose/permute, slicing or expand",
            )
    if tuple(shape) != tuple(dim):
        raise UnsupportedGraphError(
            f"parameter '{key}': its view chain gives dims {shape}, the graph reads {list(dim)}",
            rule="training.tied_view",
            hint="report this as a bug, with the module",
        )
    return t
