"""Collectives: gradients reduced across the processes of a torch.distributed process group, in buckets.

    all_reduce(inputs, group="world", average=True) -> bucket
        bucket = concat(flatten(x) for x in inputs), summed element-wise over the group's ranks
                 (divided by the group's size when `average`)
    all_reduce_wait(bucket, shapes) -> outputs
        outputs[i] = bucket[o_i : o_i + prod(shapes[i])] in dims shapes[i]   (o_i: the earlier sizes)

A data-parallel training step (opgraph.training.distributed) reduces each bucket of gradients with one
`all_reduce` as soon as the bucket's gradients exist and cuts the reduced bucket back into gradients with
`all_reduce_wait` just before the updates read them. The two are apart so that an engine may run the
reduction on a communication stream while the rest of the backward runs (the torch engine on CUDA
does: NCCL on its own stream, joined by an event at the wait; a CUDA graph captures both). Flattening
is in row-major order of logical dims, whatever the strides.

The process group is a run-time binding, not data: the op holds a key (`group`), and
`register_group(group)` gives a torch.distributed group its key in this process ("world" is the
default group). With no group under the key and torch.distributed not initialized, the step runs on
one process: the reduction is the identity. The reference definition reduces through
torch.distributed (gloo for host tensors) in float64.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.errors import AttributeValueError, DataTypeError, ExecutionError, ShapeError
from ..core.op import NodeContext, Op, TensorSpec, check_counts, graph_method, register_op
from ..core.tensor import Tensor, packed_strides

WORLD = "world"
COLLECTIVE_KINDS = frozenset({"all_reduce", "all_reduce_wait"})
_GROUPS: dict[str, Any] = {}
_LOCK = threading.Lock()


def register_group(group: Any) -> str:
    """The key collectives name `group` (a torch.distributed ProcessGroup) by in this process: "world"
    for the default group, else "group<n>", n counting the groups registered here (the same on every
    rank that registers its groups in the same order). Registering a group again gives its key."""
    import torch.distributed as dist

    if group is None or group is dist.group.WORLD:
        return WORLD
    with _LOCK:
        for key, known in _GROUPS.items():
            if known is group:
                return key
        key = f"group{len(_GROUPS)}"
        _GROUPS[key] = group
        return key


def resolve_group(key: str, op: str = "") -> tuple[Any, int]:
    """(the process group under `key`, its size): (None, 1) for "world" without torch.distributed
    initialized (one process). ExecutionError for a key no group was registered under."""
    if key in _GROUPS:
        import torch.distributed as dist

        return _GROUPS[key], dist.get_world_size(_GROUPS[key])
    if key != WORLD:
        raise ExecutionError(
            f"no process group is registered under '{key}' in this process",
            op=op,
            rule="collective.group",
            hint="call opgraph.ops.collective.register_group(group) on every rank, in the same "
            "order, before running a plan whose collectives name it",
        )
    try:
        import torch.distributed as dist
    except ImportError:
        return None, 1
    if not dist.is_available() or not dist.is_initialized():
        return None, 1
    return dist.group.WORLD, dist.get_world_size()


def reduce_in_place(t: Any, key: str, average: bool, op: str = "") -> None:
    """All-reduce torch tensor `t` in place over the group under `key` (sum, then / size if `average`)."""
    group, size = resolve_group(key, op)
    if group is None:  # one process
        return
    import torch.distributed as dist

    try:
        dist.all_reduce(t, group=group)
    except (RuntimeError, ValueError) as err:
        raise ExecutionError(
            f"torch.distributed.all_reduce failed: {type(err).__name__}: {err}",
            op=op,
            rule="collective.failed",
            hint="every rank must run the same step; host tensors need a gloo group, CUDA tensors an NCCL one",
        ) from err
    if average:
        t.div_(size)


@register_op
@dataclass(frozen=True, kw_only=True)
class AllReduce(Op):
    """bucket = the inputs flattened and joined, reduced over the group (see the module docstring)."""

    kind = "all_reduce"
    OUTPUTS = ("bucket",)
    num_inputs: int
    group: str = WORLD
    average: bool = True

    def __post_init__(self) -> None:
        check_counts(num_inputs=self.num_inputs)

    def input_roles(self) -> tuple[str, ...]:
        return tuple(f"input{i}" for i in range(self.num_inputs))

    def infer(self, ctx: NodeContext) -> list[TensorSpec]:
        roles = self.input_roles()
        if not roles:
            ctx.error(
                AttributeValueError,
                "all_reduce has no inputs",
                rule="all_reduce.count",
                hint="pass a list of at least one tensor",
            )
        xs = [ctx.tensor(r) for r in roles]
        for role, x in zip(roles[1:], xs[1:]):
            if x.data_type is not xs[0].data_type:
                ctx.error(
                    DataTypeError,
                    f"input '{role}' has type {x.data_type.name} but input0 has "
                    f"{xs[0].data_type.name}; a bucket holds one type",
                    tensor=role,
                    rule="all_reduce.data_type",
                    hint="reduce tensors of each type in a bucket of their own",
                )
        total = sum(x.numel for x in xs)
        return [TensorSpec((total,), (1,), xs[0].data_type)]

    def reference(self, ins, outs):
        flat = np.concatenate([np.asarray(x, dtype=np.float64).reshape(-1) for x in ins])
        group, _ = resolve_group(self.group, self.kind)
        if group is not None:
            import torch

            t = torch.from_numpy(np.ascontiguousarray(flat))
            reduce_in_place(t, self.group, self.average, self.kind)
            flat = t.numpy()
        return [flat]


@register_op
@dataclass(frozen=True, kw_only=True)
class AllReduceWait(Op):
    """outputs = the reduced bucket cut back into tensors of `shapes` (see the module docstring)."""

    kind = "all_reduce_wait"
    INPUTS = ("bucket",)
    MOVES_DATA_ONLY = True
    shapes: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        check_counts(num_outputs=len(self.shapes))

    def output_roles(self) -> tuple[str, ...]:
        return tuple(f"output{i}" for i in range(len(self.shapes)))

    def infer(self, ctx: NodeContext) -> list[TensorSpec]:
        bucket = ctx.tensor("bucket")
        if not self.shapes:
            ctx.error(
                AttributeValueError,
                "all_reduce_wait has no outputs",
                rule="all_reduce_wait.count",
                hint="give the shapes of the bucket's tensors",
            )
        if any(not s or any(type(d) is not int or d < 1 for d in s) for s in self.shapes):
            ctx.error(
                AttributeValueError,
                f"shapes {[list(s) for s in self.shapes]} are not all lists of positive dims",
                tensor="bucket",
                rule="all_reduce_wait.shapes",
                hint="give each tensor's dims",
            )
        total = sum(math.prod(s) for s in self.shapes)
        if bucket.dim != (total,):
            ctx.error(
                ShapeError,
                f"the bucket has dims {list(bucket.dim)}, the shapes hold {total} elements",
                tensor="bucket",
                rule="all_reduce_wait.size",
                hint="cut the bucket all_reduce made into the shapes of its inputs",
            )
        return [TensorSpec(tuple(s), packed_strides(s), bucket.data_type) for s in self.shapes]

    def reference(self, ins, outs):
        (flat,) = ins
        out, at = [], 0
        for s in self.shapes:
            n = math.prod(s)
            out.append(np.asarray(flat[at : at + n]).reshape(s))
            at += n
        return out


@graph_method
def all_reduce(self, inputs, group: str = WORLD, average: bool = True, name: str = ""):
    """The inputs reduced across the processes of a process group, as one bucket.

    Shapes: inputs of any dims -> a bucket of dims [sum of their element counts].

    Layouts: any input strides (flattened in row-major order of logical dims); the bucket is packed.

    Types: all inputs of one type, which the bucket has.

    Formula: `bucket = concat(flatten(x) for x in inputs)` summed over the ranks, `/ size` when `average`.

    Args:
        inputs: the tensors to reduce, a list.
        group: the key of the process group (opgraph.ops.collective.register_group; "world" the default).
        average: divide the sum by the group's size (data-parallel gradients).
        name: the op's name.

    Returns:
        the bucket, a virtual tensor; `all_reduce_wait` cuts it back into tensors.

    Example:
        ```python
        bucket = g.all_reduce([dw1, db1])
        dw1_mean, db1_mean = g.all_reduce_wait(bucket, [dw1.dim, db1.dim])
        ```
    """
    if isinstance(inputs, Tensor) or not isinstance(inputs, (list, tuple)) or not inputs:
        raise AttributeValueError(
            f"inputs must be a non-empty list of tensors, got {inputs!r}",
            op=f"all_reduce '{name}'",
            rule="all_reduce.count",
            hint="pass the tensors to reduce as a list: g.all_reduce([a, b])",
        )
    op = AllReduce(num_inputs=len(inputs), group=str(group), average=bool(average))
    return self._add_op(op, list(inputs), name=name)[0]


@graph_method
def all_reduce_wait(self, bucket, shapes, name: str = ""):
    """The reduced bucket cut back into tensors: where the reduction is waited for.

    Shapes: a bucket of dims [n] -> one tensor per entry of `shapes`, their element counts summing to n.

    Layouts: outputs packed row-major.

    Types: the bucket's type.

    Formula: `outputs[i] = bucket[o_i : o_i + prod(shapes[i])]` in dims `shapes[i]`.

    Args:
        bucket: an all_reduce's bucket.
        shapes: the dims of each output (those of the all_reduce's inputs), a list.
        name: the op's name.

    Returns:
        the tensors, a list.

    Example:
        ```python
        bucket = g.all_reduce([dw1, db1])
        dw1_mean, db1_mean = g.all_reduce_wait(bucket, [dw1.dim, db1.dim])
        ```
    """
    if not isinstance(shapes, (list, tuple)) or not shapes:
        raise AttributeValueError(
            f"shapes must be a non-empty list of dims, got {shapes!r}",
            op=f"all_reduce_wait '{name}'",
            rule="all_reduce_wait.count",
            hint="pass the dims of the tensors the bucket holds",
        )
    op = AllReduceWait(shapes=tuple(tuple(int(d) for d in s) for s in shapes))
    return self._add_op(op, [bucket], name=name)
