"""Finalize: from the user's handles to a `FinalGraph`.

1. UIDs: explicit ones must be unique, with one exception: an op output may share its UID with one
   declared (not produced) handle, which then stands for that output. That is a forward reference
   (declare a tensor with a UID, read it, produce it later with an op whose output gets the UID) or,
   when the producing op reads that handle itself, an in-place update (single-op graphs only).
   Missing UIDs are assigned.
2. Dataflow from UIDs: one producer per tensor, topological order whatever order ops were added in,
   no cycles.
3. Inference in that order: each op fills in its outputs' dims/strides/types; what the user set
   must agree.
4. Checks: every op's own rules, scalar operands, dangling tensors, layouts of outputs.
"""

from __future__ import annotations

import heapq
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any

from ..core.dtypes import DataType
from ..core.errors import DataflowError, DataTypeError, DuplicateUIDError, GraphError, ShapeError
from ..core.image_layout import mark_images
from ..core.ir import Const, FinalGraph, Node
from ..core.op import Draft, NodeContext, Op, TensorSpec
from ..core.symbolic import Dim, Expr, free_symbols, provably_le
from ..core.tensor import Tensor, TensorDesc, format_dims, is_dynamic, packed_strides, stride_order
from ..ops.base import strides_like
from .placement import place_epilogues, place_generators, place_views

if TYPE_CHECKING:
    from .builder import Graph, OpRecord


def finalize(g: Graph) -> tuple[FinalGraph, dict[int, int]]:
    records = g._records
    if not records:
        raise GraphError(
            f"graph '{g.name}' has no ops",
            rule="graph.empty",
            hint="add at least one op (e.g. g.conv_fprop(...)) before validate/build",
        )
    for r in records:
        if all(t is None for t in r.outputs):
            raise DataflowError(
                "the op produces no output",
                op=f"{r.op.kind} '{r.name}'",
                rule="dataflow.no_output",
                hint=f"give it at least one of its outputs {list(r.op.output_roles())}",
            )
    producer_of = {id(t): i for i, r in enumerate(records) for t in r.outputs if t is not None}
    uids, aliases, inplace = _assign_uids(g, records, producer_of)
    order = _topological_order(records, uids, inplace, set(producer_of))
    readers: dict[int, int] = {}
    for r in records:
        for v in r.inputs:
            if isinstance(v, Tensor):
                readers[uids[id(v)]] = readers.get(uids[id(v)], 0) + 1
    _check_dangling(g, records, uids, producer_of, readers)
    _check_dim_names(g, uids)
    descs: dict[int, TensorDesc] = {}
    for t in g._tensors:
        uid = uids[id(t)]
        # A forward reference gets its descriptor from its producer; an in-place input is read
        # before it is overwritten, so it is described like any graph input.
        if id(t) not in producer_of and (uid not in aliases or uid in inplace):
            descs.setdefault(uid, _input_desc(g, t, uid))
    nodes = place_views([_finalize_node(g, records[i], uids, descs, aliases) for i in order], descs)
    nodes = place_generators(place_epilogues(nodes, descs), descs)
    if len(nodes) > 1:
        _check_inplace(nodes, descs)
    mark_images(nodes, descs)
    final = FinalGraph(
        name=g.name,
        tensors=descs,
        nodes=tuple(nodes),
        io_data_type=g.io_data_type,
        intermediate_data_type=g.intermediate_data_type,
        compute_data_type=g.compute_data_type,
        handles={id(t): (t, uids[id(t)]) for t in g._tensors},
    )
    return final, uids


def _check_inplace(nodes: list[Node], descs: dict[int, TensorDesc]) -> None:
    """An op may write the tensor it reads (same UID as input and output: an in-place update such as
    W = W - lr * dW) in a multi-op graph when each element is read before it is written by the same
    thread: the writer must be a pointwise op (it produces the tensor's full dims, element by element).
    Every other read of the old value is ordered before the update (see _topological_order), and the
    partitioner keeps ops that read other elements (a conv reading W as its filter) out of the
    writer's kernel."""
    for n in nodes:
        for uid in set(n.input_uids()) & set(n.output_uids()):
            if n.kind != "pointwise":
                raise DataflowError(
                    f"{n.kind} cannot update its input in place in a graph of {len(nodes)} ops (its output "
                    "elements depend on other input elements)",
                    op=n.label(),
                    tensor=descs[uid],
                    rule="dataflow.inplace",
                    hint="update in place with a pointwise op (e.g. W = sub(W, mul(lr, dW)) sharing W's UID), or "
                    "give the output its own UID",
                )


def _assign_uids(
    g: Graph, records: list[OpRecord], producer_of: dict[int, int]
) -> tuple[dict[int, int], dict[int, Tensor], set[int]]:
    """UIDs of every handle, the declared handles that stand for an op output (by UID), and the
    UIDs updated in place."""
    by_uid: dict[int, list[Tensor]] = {}
    for t in g._tensors:
        if t._uid is not None:
            by_uid.setdefault(t._uid, []).append(t)
    aliases: dict[int, Tensor] = {}
    inplace: set[int] = set()
    for uid, handles in by_uid.items():
        if len(handles) < 2:
            continue
        declared = [h for h in handles if id(h) not in producer_of]
        produced = [h for h in handles if id(h) in producer_of]
        if len(declared) > 1 or not produced:
            names = ", ".join(f"'{h.name or '<unnamed>'}'" for h in handles)
            raise DuplicateUIDError(
                f"UID {uid} is given to {len(handles)} tensors ({names})",
                tensor=_label(handles[1], uid),
                rule="tensor.duplicate_uid",
                hint="give each tensor its own UID (or leave uid unset to have one assigned); a declared "
                "tensor may share its UID only with the op output it stands for",
            )
        if not declared or len(produced) > 1:
            continue  # several producers: the dataflow check names the tensor produced twice
        ref, out = declared[0], produced[0]
        rec = records[producer_of[id(out)]]
        if any(v is ref for v in rec.inputs):
            if ref.is_virtual or out.is_virtual:
                raise DataflowError(
                    f"'{rec.name}' updates a virtual tensor in place (input '{ref.name or '<unnamed>'}' "
                    f"and output '{out.name or '<unnamed>'}' share UID {uid})",
                    op=f"{rec.op.kind} '{rec.name}'",
                    tensor=_label(ref, uid),
                    rule="dataflow.inplace",
                    hint="an in-place update reads and writes a bound buffer: make both handles "
                    "non-virtual (set_output(True) on the output), or give the output its own UID",
                )
            inplace.add(uid)
        elif ref.is_virtual != out.is_virtual:
            which = "virtual" if ref.is_virtual else "non-virtual"
            raise DataflowError(
                f"the declared tensor is {which} but the output of '{rec.name}' that shares its UID {uid} "
                f"('{out.name or '<unnamed>'}') is not",
                op=f"{rec.op.kind} '{rec.name}'",
                tensor=_label(ref, uid),
                rule="tensor.uid_alias",
                hint="a declared tensor that shares its UID with an op output stands for that output: "
                "declare both virtual, or both non-virtual (set_output(True) on the output)",
            )
        aliases[uid] = ref
    uids: dict[int, int] = {}
    next_uid = 1
    for t in g._tensors:
        if t._uid is not None:
            uids[id(t)] = t._uid
            continue
        while next_uid in by_uid:
            next_uid += 1
        uids[id(t)] = next_uid
        by_uid[next_uid] = [t]
    return uids, aliases, inplace


def _topological_order(
    records: list[OpRecord],
    uids: dict[int, int],
    inplace: AbstractSet[int] = frozenset(),
    produced: AbstractSet[int] = frozenset(),
) -> list[int]:
    producer: dict[int, int] = {}
    for i, r in enumerate(records):
        for t in r.outputs:
            if t is None:
                continue
            uid = uids[id(t)]
            if uid in producer:
                first = records[producer[uid]]
                raise DataflowError(
                    f"the tensor is produced by two ops ('{first.name}' and '{r.name}')",
                    op=f"{r.op.kind} '{r.name}'",
                    tensor=_label(t, uid),
                    rule="dataflow.two_producers",
                    hint="each tensor must be written by exactly one op: give one of the outputs another UID",
                )
            producer[uid] = i
    deps: list[set[int]] = []
    users: list[list[int]] = [[] for _ in records]
    for i, r in enumerate(records):
        # the declared handle of a tensor updated in place is its old value: reading it does not wait
        # for the update (and the update's own read of it is not a dependency either)
        d = {
            producer[uids[id(v)]]
            for v in r.inputs
            if isinstance(v, Tensor)
            and uids[id(v)] in producer
            and not (uids[id(v)] in inplace and id(v) not in produced)
        }
        d.discard(i)
        deps.append(d)
    for i, r in enumerate(records):  # ... and every other read of the old value runs before the update
        for v in r.inputs:
            if isinstance(v, Tensor) and uids[id(v)] in inplace and id(v) not in produced:
                writer = producer[uids[id(v)]]
                if writer != i:
                    deps[writer].add(i)
    for i, d in enumerate(deps):
        for p in d:
            users[p].append(i)
    pending = [len(d) for d in deps]
    ready = [i for i, n in enumerate(pending) if n == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            pending[u] -= 1
            if pending[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(records):
        # Every op left waits on another one left: walking back along those waits closes a cycle.
        stuck = {i for i, n in enumerate(pending) if n > 0}
        walk: list[int] = []
        i = min(stuck)
        while i not in walk:
            walk.append(i)
            i = min(d for d in deps[i] if d in stuck)
        cycle = walk[walk.index(i) :]
        first = records[cycle[0]]
        culprit = next(
            v for v in first.inputs if isinstance(v, Tensor) and producer.get(uids[id(v)]) == cycle[1 % len(cycle)]
        )
        names = " <- ".join(f"'{records[j].name}'" for j in (*cycle, cycle[0]))
        raise DataflowError(
            f"the ops form a cycle through their UIDs ({names}: each reads what the next one writes)",
            op=f"{first.op.kind} '{first.name}'",
            tensor=_label(culprit, uids[id(culprit)]),
            rule="dataflow.cycle",
            hint="an op cannot depend on its own output; check the UIDs of the tensors in the cycle",
        )
    return order


def _label(t: Tensor, uid: int) -> str:
    return f"tensor '{t.name or '<unnamed>'}' (uid {uid})"


def _input_desc(g: Graph, t: Tensor, uid: int) -> TensorDesc:
    label = _label(t, uid)
    if t._dim is None:
        raise ShapeError(
            "the tensor has no dims",
            tensor=label,
            rule="tensor.no_dims",
            hint="give graph inputs their dims: g.tensor(dim=[...]) or t.set_dim([...])",
        )
    stride = t._stride if t._stride is not None else packed_strides(t._dim)
    _check_stride_rank(t._dim, stride, label)
    if is_dynamic(t._dim) or is_dynamic(stride):
        _check_dynamic_layout(tuple(t._dim), tuple(stride), label)
    dt = t._data_type or (g.intermediate_data_type if t.is_virtual else g.io_data_type)
    if t.is_pass_by_value and _numel(t._dim) != 1:
        raise ShapeError(
            f"a pass-by-value tensor must hold one value, this one has dims {list(t._dim)}",
            tensor=label,
            rule="tensor.pass_by_value",
            hint="declare pass-by-value scalars with dims [1] (or all ones); pass arrays as ordinary tensors",
        )
    return TensorDesc(
        uid, t.name, t._dim, tuple(stride), dt, t.is_virtual, t.is_pass_by_value, t.is_by_reference and not t.is_virtual
    )


def _numel(dim: tuple[int, ...]) -> int:
    n = 1
    for d in dim:
        n *= d
    return n


def _check_stride_rank(dim: tuple[int, ...], stride: tuple[int, ...], label: str) -> None:
    if len(stride) != len(dim):
        raise ShapeError(
            f"dims {format_dims(dim)} have rank {len(dim)} but strides {format_dims(stride)} have rank {len(stride)}",
            tensor=label,
            rule="tensor.stride_rank",
            hint="give one stride per dim",
        )


def _self_overlapping(dim: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """True when two different indices of the tensor map to one element (for dynamic sizes: when
    that is not proven impossible over the whole range)."""
    extent = 1
    for axis in reversed(stride_order(stride)):
        if isinstance(dim[axis], int) and dim[axis] == 1:
            continue
        if not provably_le(extent, stride[axis]):
            return True
        extent = stride[axis] * (dim[axis] - 1) + extent
    return False


def _check_dim_names(g: Graph, uids: dict[int, int]) -> None:
    """One name is one dynamic dim: two ranges for a name are refused, naming both tensors."""
    seen: dict[str, tuple[Dim, str]] = {}
    for t in g._tensors:
        for d in {d for v in (*(t._dim or ()), *(t._stride or ())) if isinstance(v, Expr) for d in free_symbols(v)}:
            first = seen.setdefault(d.name, (d, _label(t, uids[id(t)])))
            if first[0] != d:
                raise ShapeError(
                    f"the dynamic dim '{d.name}' has the range {first[0].min}..{first[0].max} in {first[1]} but "
                    f"{d.min}..{d.max} here",
                    tensor=_label(t, uids[id(t)]),
                    rule="dim.conflict",
                    hint=f"declare one Dim('{d.name}', min, max) and use it everywhere (or give the two their own names)",
                )


def _check_dynamic_layout(dim: tuple[int, ...], stride: tuple[int, ...], label: str) -> None:
    """The strides of axes that can be longer than 1 keep one order over the whole range (so every
    kernel knows the innermost axis), proven pairwise: each pair provably ordered or equal."""
    axes = [a for a in range(len(dim)) if not (isinstance(dim[a], int) and dim[a] == 1)]
    for i, a in enumerate(axes):
        for b in axes[i + 1 :]:
            if not (provably_le(stride[a], stride[b]) or provably_le(stride[b], stride[a])):
                raise ShapeError(
                    f"the strides {[str(s) for s in stride]} of axes {a} ({stride[a]}) and {b} ({stride[b]}) "
                    "swap order within the dims' ranges",
                    tensor=label,
                    rule="tensor.layout_order",
                    hint="give strides whose order is the same for every value of the dynamic dims (packed "
                    "strides always are), or narrow the Dim's range",
                )


def _finalize_node(
    g: Graph, rec: OpRecord, uids: dict[int, int], descs: dict[int, TensorDesc], aliases: dict[int, Tensor]
) -> Node:
    op = rec.op
    label = f"{op.kind} '{rec.name}'"
    roles = op.input_roles()
    inputs: list[TensorDesc | Const | None] = []
    operands: list[int | Const | None] = []
    for role, v in zip(roles, rec.inputs):
        if isinstance(v, Tensor):
            desc = descs[uids[id(v)]]
            if desc.is_pass_by_value and role not in op.literal_inputs():
                raise ShapeError(
                    f"input '{role}' cannot be a pass-by-value scalar",
                    op=label,
                    tensor=desc,
                    rule="op.pass_by_value",
                    hint=f"pass an ordinary tensor in device memory as '{role}'",
                )
            if role in op.scalar_inputs() and desc.numel != 1:
                raise ShapeError(
                    f"input '{role}' takes one value, but the tensor has dims {list(desc.dim)}",
                    op=label,
                    tensor=desc,
                    rule="op.scalar_input",
                    hint=f"bind a 1-element tensor (dims [1]), a pass-by-value tensor or a Python number as '{role}'",
                )
            inputs.append(desc)
            operands.append(desc.uid)
        else:
            inputs.append(v)
            operands.append(v)
    drafts = [
        None if t is None else _draft(t, uids[id(t)], aliases.get(uids[id(t)]), f"{rec.name}::{role}", label)
        for t, role in zip(rec.outputs, op.output_roles())
    ]
    cdt = rec.compute_data_type or g.compute_data_type
    ctx = NodeContext(label, roles, inputs, op.output_roles(), drafts, cdt, g.intermediate_data_type)
    dynamic = _dynamic_operand(inputs, drafts)
    if dynamic is not None:
        _admit_dynamic(op, ctx, label, dynamic)
        return _finalize_dynamic_node(g, rec, op, ctx, label, roles, inputs, operands, drafts, cdt, descs)
    op, outs = _apply_rules(g, op, ctx, label, roles, inputs, drafts, cdt, descs, [""])
    return Node(op, rec.name, tuple(operands), tuple(d.uid if d else None for d in outs), cdt)


def _apply_rules(
    g: Graph,
    op: Op,
    ctx: NodeContext,
    label: str,
    roles: tuple[str, ...],
    inputs: list[TensorDesc | Const | None],
    drafts: list[Draft | None],
    cdt: DataType,
    descs: dict[int, TensorDesc],
    stage: list[str],
) -> tuple[Op, list[TensorDesc | None]]:
    """An op's normalize, infer and check rules over its inputs and output drafts: the normalized op
    and its outputs' descriptors (recorded in `descs`). `stage[0]` names the rule running, for the
    dynamic path's errors."""
    stage[0] = "normalize"
    op = op.normalize(ctx)
    stage[0] = "infer"
    specs = op.infer(ctx)
    if len(specs) != len(drafts):
        raise RuntimeError(f"{op.kind}.infer returned {len(specs)} specs for {len(drafts)} outputs")
    outs: list[TensorDesc | None] = []
    for role, draft, spec in zip(op.output_roles(), drafts, specs):
        if draft is None:
            outs.append(None)
            continue
        desc = _merge(g, label, role, draft, spec, inputs)
        descs[desc.uid] = desc
        outs.append(desc)
    stage[0] = "check"
    op.check(NodeContext(label, roles, inputs, op.output_roles(), outs, cdt, g.intermediate_data_type))
    return op, outs


def _dynamic_operand(inputs: list[TensorDesc | Const | None], drafts: list[Draft | None]) -> Any:
    """The first input (or output draft) with a dynamic dim or stride, else None."""
    for t in inputs:
        if isinstance(t, TensorDesc) and t.is_dynamic:
            return t
    for d in drafts:
        if d is not None and (is_dynamic(d.dim or ()) or is_dynamic(d.stride or ())):
            return d.label()
    return None


def _admit_dynamic(op: Op, ctx: NodeContext, label: str, tensor: Any) -> None:
    if not op.DYNAMIC:
        raise ShapeError(
            f"{op.kind} does not take dynamic dims (yet): its rules decide by sizes",
            op=label,
            tensor=tensor,
            rule="op.dynamic_dims",
            hint="give this op's operands static dims (build a plan per shape), or keep the dynamic dims to ops "
            "that take them (see docs/design/dynamic-shapes.md)",
        )
    reason = op.dynamic_refusal(ctx)
    if reason is not None:
        raise ShapeError(
            reason,
            op=label,
            tensor=tensor,
            rule="op.dynamic_dims",
            hint="fix those dims of this op's operands (or build a plan per size)",
        )


def _finalize_dynamic_node(
    g: Graph,
    rec: OpRecord,
    op: Op,
    ctx: NodeContext,
    label: str,
    roles: tuple[str, ...],
    inputs: list[TensorDesc | Const | None],
    operands: list[int | Const | None],
    drafts: list[Draft | None],
    cdt: DataType,
    descs: dict[int, TensorDesc],
) -> Node:
    """`_finalize_node`'s rules for a node with dynamic dims: a rule that decides by a size it cannot
    know over the whole range (Python's TypeError from a symbolic size) is a ShapeError naming the
    op and the rule, never a guess."""
    stage = [""]
    try:
        op, outs = _apply_rules(g, op, ctx, label, roles, inputs, drafts, cdt, descs, stage)
    except TypeError as err:
        raise ShapeError(
            f"{op.kind}'s {stage[0]} rule cannot decide over the dynamic dims' ranges ({err})"[:600],
            op=label,
            tensor=_dynamic_operand(inputs, drafts),
            rule="op.dynamic_dims",
            hint="give this op's operands static dims, or narrow the dynamic dims so the rule holds for every value",
        ) from None
    return Node(op, rec.name, tuple(operands), tuple(d.uid if d else None for d in outs), cdt)


def _draft(t: Tensor, uid: int, alias: Tensor | None, generated_name: str, op_label: str) -> Draft:
    """What the user set on an op output, together with what they set on the declared handle that
    shares its UID (which must agree)."""
    if alias is None:
        return Draft(uid, t.name, t._dim, t._stride, t._data_type, t.is_virtual, t.is_by_reference)

    def pick(what: str, mine, theirs):
        if mine is not None and theirs is not None and mine != theirs:
            cls = DataTypeError if what == "data_type" else ShapeError
            raise cls(
                f"the output sets {what} {_show(mine)} but the declared tensor '{alias.name or '<unnamed>'}' "
                f"sharing its UID sets {what} {_show(theirs)}",
                op=op_label,
                tensor=_label(t, uid),
                rule="tensor.uid_alias",
                hint=f"set {what} on one of the two handles only, or make them agree",
            )
        return mine if mine is not None else theirs

    name = alias.name if t.name in ("", generated_name) and alias.name else t.name
    return Draft(
        uid,
        name,
        pick("dim", t._dim, alias._dim),
        pick("stride", t._stride, alias._stride),
        pick("data_type", t._data_type, alias._data_type),
        t.is_virtual,
        t.is_by_reference or alias.is_by_reference,
    )


def _show(value) -> str:
    return value.name if isinstance(value, DataType) else str([v if isinstance(v, int) else str(v) for v in value])


def _merge(
    g: Graph, label: str, role: str, draft: Draft, spec: TensorSpec, inputs: list[TensorDesc | Const | None]
) -> TensorDesc:
    tlabel = draft.label()
    if draft.dim is not None and spec.dim is not None and tuple(draft.dim) != tuple(spec.dim):
        raise ShapeError(
            f"output '{role}' was set to dims {format_dims(draft.dim)} but the op computes dims {format_dims(spec.dim)}",
            op=label,
            tensor=tlabel,
            rule="infer.dims_mismatch",
            hint=f"remove the set_dim call or set dims {format_dims(spec.dim)}",
        )
    dim = draft.dim if draft.dim is not None else spec.dim
    if dim is None:
        raise ShapeError(
            f"the dims of output '{role}' cannot be inferred from the inputs",
            op=label,
            tensor=tlabel,
            rule="infer.dims_unknown",
            hint="set them on the output with .set_dim([...])",
        )
    like = next((t for t in inputs if isinstance(t, TensorDesc) and len(t.dim) == len(dim)), None)
    stride = draft.stride or spec.stride or strides_like(dim, like)
    _check_stride_rank(tuple(dim), tuple(stride), tlabel)
    if _self_overlapping(tuple(dim), tuple(stride)):
        raise ShapeError(
            f"output strides {format_dims(stride)} for dims {format_dims(dim)} make different elements share memory",
            op=label,
            tensor=tlabel,
            rule="tensor.overlapping_output",
            hint="give outputs strides where each element has its own address (e.g. packed strides)",
        )
    default = g.intermediate_data_type if draft.is_virtual else g.io_data_type
    dt: DataType = draft.data_type or spec.data_type or default
    return TensorDesc(
        draft.uid or 0,
        draft.name,
        tuple(dim),
        tuple(stride),
        dt,
        draft.is_virtual,
        False,
        draft.is_by_reference and not draft.is_virtual,
    )


def _check_dangling(
    g: Graph, records: list[OpRecord], uids: dict[int, int], producer_of: dict[int, int], readers: dict[int, int]
) -> None:
    produced = {uids[k] for k in (id(t) for r in records for t in r.outputs if t is not None)}
    for t in g._tensors:
        uid = uids[id(t)]
        label = _label(t, uid)
        is_produced = id(t) in producer_of
        read = readers.get(uid, 0) > 0
        if uid in produced and t.is_pass_by_value:
            raise DataflowError(
                "an op output cannot be pass-by-value",
                tensor=label,
                rule="dataflow.pass_by_value_output",
                hint="pass-by-value tensors are host scalars given at execute; drop set_is_pass_by_value",
            )
        if t.is_virtual and not is_produced and uid not in produced:
            raise DataflowError(
                "the virtual tensor is read but no op produces it",
                tensor=label,
                rule="dataflow.unproduced_virtual",
                hint="make it a graph input (is_virtual=False) or produce it with an op",
            )
        if t.is_virtual and is_produced and not read:
            rec = records[producer_of[id(t)]]
            raise DataflowError(
                f"the virtual output of '{rec.name}' is never read",
                tensor=label,
                op=f"{rec.op.kind} '{rec.name}'",
                rule="dataflow.unread_virtual",
                hint="mark it as a graph output with .set_output(True), or stop requesting it",
            )
        if not t.is_virtual and not is_produced and not read and uid not in produced:
            raise DataflowError(
                "the tensor is declared but no op reads or produces it",
                tensor=label,
                rule="dataflow.unused",
                hint="use it as an op input, or remove it from the graph",
            )
