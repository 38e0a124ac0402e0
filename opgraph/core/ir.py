"""The finalized graph: frozen nodes over frozen tensor descriptors, in topological order.

`FinalGraph` is what every later stage (partition, engines, plans, serialization) reads; it is made
by `Graph.validate()` and never changes.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any, TypeVar

from .bucket import Bucket
from .dtypes import DataType
from .errors import InternalError, ShapeError, printable
from .evolve import evolve
from .op import Const, Op
from .symbolic import Dim, Expr, evaluate, free_symbols, lambdify
from .symbolic_value import SizeValue
from .tensor import TensorDesc

__all__ = ["Const", "FinalGraph", "Node", "Operand", "ShapeOrigin"]

Operand = int | Const | None  # a tensor UID, a literal, or an absent optional input
OpT = TypeVar("OpT", bound=Op)


@dataclass(frozen=True)
class Node:
    """One op instance: its attributes (`op`), name, compute type and the UIDs it reads and writes.

    `inputs` and `outputs` line up with `op.input_roles()` and `op.output_roles()`.
    """

    op: Op
    name: str
    inputs: tuple[Operand, ...]
    outputs: tuple[int | None, ...]
    compute_data_type: DataType

    @property
    def kind(self) -> str:
        return self.op.kind

    def label(self) -> str:
        return f"{self.op.kind} '{printable(self.name)}'"

    def op_as(self, kind: type[OpT]) -> OpT:
        """`op` as the class the code handling this node was registered for (its attributes typed)."""
        if not isinstance(self.op, kind):
            raise InternalError(
                f"code for {kind.__name__} ops got a {type(self.op).__name__}",
                op=self.label(),
                rule="internal.op_kind",
                hint="this is an opgraph bug: please report it",
            )
        return self.op

    def input(self, role: str) -> Operand:
        return self.inputs[self.op.input_roles().index(role)]

    def output(self, role: str) -> int | None:
        return self.outputs[self.op.output_roles().index(role)]

    def input_uids(self) -> tuple[int, ...]:
        return tuple(u for u in self.inputs if isinstance(u, int))

    def output_uids(self) -> tuple[int, ...]:
        return tuple(u for u in self.outputs if u is not None)

    def attr_items(self) -> list[tuple[str, Any]]:
        return [(f.name, getattr(self.op, f.name)) for f in fields(self.op) if f.init]

    def render(self, tensors: Mapping[int, TensorDesc]) -> str:
        def operand(role: str, value: Operand) -> str:
            if value is None:
                return ""
            text = f"%{value}" if isinstance(value, int) else str(value)
            return f"{role}={text}"

        outs = ", ".join(
            f"%{u}:{tensors[u].type_str()}" + (f" '{printable(tensors[u].name)}'" if tensors[u].name else "")
            for u in self.output_uids()
        )
        args = ", ".join(filter(None, (operand(r, v) for r, v in zip(self.op.input_roles(), self.inputs))))
        attrs = " ".join(f"{k}={_fmt(v)}" for k, v in self.attr_items() if v is not None)
        attrs = f" {{{attrs}}}" if attrs else ""
        return f"{outs} = {self.op.kind} '{printable(self.name)}'({args}){attrs}"


def _fmt(value: Any) -> str:
    if hasattr(value, "name") and hasattr(value, "value") and not isinstance(value, (int, float)):
        return value.name  # an enum
    if isinstance(value, tuple):
        return "(" + ",".join(_fmt(v) for v in value) + ")"
    return repr(value)


@dataclass(frozen=True)
class FinalGraph:
    """A validated graph. `nodes` are topologically sorted; `tensors` maps every UID to its descriptor."""

    name: str
    tensors: Mapping[int, TensorDesc]
    nodes: tuple[Node, ...]
    io_data_type: DataType
    intermediate_data_type: DataType
    compute_data_type: DataType
    _producer: Mapping[int, int] = field(default_factory=dict, repr=False, compare=False)
    # id(handle) -> (handle, uid) for the Tensor handles the graph was finalized from; the handle is
    # kept so that its id cannot be reused by another object while this graph lives.
    handles: Mapping[int, tuple[Any, int]] = field(default_factory=dict, repr=False, compare=False)
    # shape tuple -> the static graph at that shape (`at`), most recent last
    _at: dict[tuple[int, ...], FinalGraph] = field(init=False, repr=False, compare=False)
    # a static graph a dynamic plan planned for one shape of a bucket (`in_bucket`): where it comes from
    origin: ShapeOrigin | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        producer = {u: i for i, n in enumerate(self.nodes) for u in n.output_uids()}
        object.__setattr__(self, "_producer", producer)
        object.__setattr__(self, "_at", {})

    def __hash__(self) -> int:
        return hash((self.name, self.nodes))

    @cached_property
    def inputs(self) -> tuple[int, ...]:
        """Non-virtual tensors that no op produces: what the variant pack must supply."""
        return tuple(u for u, t in self.tensors.items() if not t.is_virtual and u not in self._producer)

    @cached_property
    def outputs(self) -> tuple[int, ...]:
        """Non-virtual tensors that an op produces: what the variant pack receives."""
        return tuple(u for u, t in self.tensors.items() if not t.is_virtual and u in self._producer)

    @cached_property
    def node_positions(self) -> dict[int, int]:
        """Each node's index in `nodes`, by the node object's id (the graph holds its nodes)."""
        return {id(n): i for i, n in enumerate(self.nodes)}

    @cached_property
    def memo(self) -> dict[Any, Any]:
        """Answers analyses of this graph keep, by keys of their own (a graph is immutable)."""
        return {}

    @cached_property
    def _consumers(self) -> dict[int, tuple[int, ...]]:
        out: dict[int, list[int]] = {}
        for i, n in enumerate(self.nodes):
            for u in set(n.input_uids()):
                out.setdefault(u, []).append(i)
        return {u: tuple(v) for u, v in out.items()}

    @cached_property
    def symbols(self) -> dict[str, Dim]:
        """The dynamic dims (opgraph.Dim) its tensors' dims and strides use, by name, in name order;
        empty for a static graph."""
        found: dict[str, Dim] = {}
        for t in self.tensors.values():
            for d in t.symbols():
                found[d.name] = d
        return dict(sorted(found.items()))

    @property
    def is_dynamic(self) -> bool:
        return bool(self.symbols)

    def at(self, env: Mapping[str, int]) -> FinalGraph:
        """The static graph this one is when each dynamic dim has its value in `env` (by name; each
        within its range): every dim and stride evaluated, nodes and handles kept (a variant pack keyed
        by this graph's handles binds the result). The graph itself when it is static. Memoized per
        shape (the last AT_CACHE shapes made)."""
        if not self.symbols:
            return self
        key = self.shape_key(env)
        hit = self._at.get(key)
        if hit is not None:
            return hit
        values = dict(zip(self.symbols, key))
        dynamic, sizes, sized_nodes = self._shape_function
        flat = sizes(*key)
        tensors = dict(self.tensors)
        i = 0
        for u in dynamic:
            t = tensors[u]
            rank = len(t.dim)
            tensors[u] = evolve(t, dim=flat[i : i + rank], stride=flat[i + rank : i + 2 * rank])
            i += 2 * rank
        nodes = list(self.nodes)  # (the nodes without sizes in them are shared: frozen)
        for k in sized_nodes:
            n = nodes[k]
            nodes[k] = dataclasses.replace(n, op=_op_at(n.op, values), inputs=_inputs_at(n.inputs, values))
        static = FinalGraph(
            self.name,
            tensors,
            tuple(nodes),
            self.io_data_type,
            self.intermediate_data_type,
            self.compute_data_type,
            handles=self.handles,
        )
        self._at[key] = static
        while len(self._at) > AT_CACHE:  # (threads racing here evict one more: harmless)
            self._at.pop(next(iter(self._at)), None)
        return static

    @cached_property
    def _shape_function(self) -> tuple[tuple[int, ...], Callable[..., tuple[int, ...]], tuple[int, ...]]:
        """What `at` evaluates, found once: the dynamic tensors' UIDs, one function of the dims' values
        (in `symbols` order) giving their dims and strides one after the other, and the indices of the
        nodes whose attributes or literals hold sizes."""
        dynamic = tuple(u for u, t in self.tensors.items() if t.is_dynamic)
        flat = [v for u in dynamic for v in (*self.tensors[u].dim, *self.tensors[u].stride)]
        sized = tuple(
            i
            for i, n in enumerate(self.nodes)
            if any(_holds_size(getattr(n.op, f.name)) for f in fields(n.op) if f.init)
            or any(isinstance(v, Const) and isinstance(v.value, SizeValue) for v in n.inputs)
        )
        return dynamic, lambdify(flat, list(self.symbols.values())), sized

    def in_bucket(self, env: Mapping[str, int], bucket: Bucket) -> FinalGraph:
        """The static graph at `env` (`at`), marked as planned for `bucket` of a dynamic plan: its
        `origin` names this graph, the shape and the bucket, so that an engine whose kernels take sizes
        at run time generates from the symbolic dims and decides by the bucket (one kernel for every
        shape of it). A new graph each call (equal to `at(env)`)."""
        static = self.at(env)
        shape = tuple(zip(self.symbols, self.shape_key(env)))
        marked = copy.copy(static)  # (its nodes' producers and cached properties are the static graph's)
        object.__setattr__(marked, "origin", ShapeOrigin(self, shape, bucket))
        object.__setattr__(marked, "_at", {})
        return marked

    def shape_key(self, env: Mapping[str, int]) -> tuple[int, ...]:
        """The values of `symbols` in `env`, in their order, each checked against its range."""
        key = []
        for name, dim in self.symbols.items():
            value = env.get(name)
            if isinstance(value, bool) or not isinstance(value, int) or not dim.contains(value):
                raise ShapeError(
                    f"the shape gives dim '{name}' the value {value!r}, outside its range {dim.min}..{dim.max}"
                    if isinstance(value, int)
                    else f"the shape gives no int value for dim '{name}' (got {value!r})",
                    rule="dim.value",
                    hint=f"give every dynamic dim of the graph a value: {list(self.symbols)}",
                )
            key.append(value)
        return tuple(key)

    def handle_uid(self, handle: Any) -> int | None:
        """The UID a Tensor handle had when this graph was finalized; None for a handle of another graph."""
        entry = self.handles.get(id(handle))
        return entry[1] if entry is not None and entry[0] is handle else None

    def producer(self, uid: int) -> Node | None:
        i = self._producer.get(uid)
        return None if i is None else self.nodes[i]

    def producer_index(self, uid: int) -> int | None:
        return self._producer.get(uid)

    def consumers(self, uid: int) -> tuple[Node, ...]:
        return tuple(self.nodes[i] for i in self._consumers.get(uid, ()))

    def consumer_indices(self, uid: int) -> tuple[int, ...]:
        return self._consumers.get(uid, ())

    def tensor(self, key: int | str) -> TensorDesc:
        if isinstance(key, str):
            for t in self.tensors.values():
                if t.name == key:
                    return t
            raise KeyError(key)
        return self.tensors[key]

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __str__(self) -> str:
        head = (
            f"graph '{printable(self.name)}' (io {self.io_data_type.short}, intermediate "
            f"{self.intermediate_data_type.short}, compute {self.compute_data_type.short})"
        )
        lines = [head]
        if self.symbols:
            lines.append("  dims: " + ", ".join(f"{d.name} {d.min}..{d.max}" for d in self.symbols.values()))
        lines.append("  inputs:")
        lines += [f"    {self.tensors[u]}" for u in self.inputs]
        lines.append("  ops:")
        lines += [f"    {n.render(self.tensors)}" for n in self.nodes]
        lines.append("  outputs:")
        lines += [f"    {self.tensors[u]}" for u in self.outputs]
        return "\n".join(lines)


@dataclass(frozen=True, eq=False)
class ShapeOrigin:
    """Where a static graph of a dynamic plan comes from (`FinalGraph.in_bucket`): the symbolic
    graph (same UIDs), the shape's values by dim name, and the bucket it was planned for."""

    graph: FinalGraph
    shape: tuple[tuple[str, int], ...]
    bucket: Bucket

    @property
    def env(self) -> dict[str, int]:
        return dict(self.shape)

    def varies(self, uids: Iterable[int]) -> bool:
        """Whether a dim that varies over the bucket sizes one of these tensors (by their symbolic dims)."""
        varying = {name for name, lo, hi in self.bucket.ranges if lo != hi}
        symbolic = self.graph.tensors
        return any(
            d.name in varying for u in uids if u in symbolic for size in symbolic[u].dim for d in free_symbols(size)
        )

    def at_largest(self) -> FinalGraph:
        """The symbolic graph at the bucket's largest shape (every dim at its sub-range's top), marked
        as planned for the bucket."""
        return self.graph.in_bucket({name: hi for name, _, hi in self.bucket.ranges}, self.bucket)

    def at_smallest(self) -> FinalGraph:
        """The symbolic graph at the bucket's smallest shape (every dim at its sub-range's bottom)."""
        return self.graph.in_bucket({name: lo for name, lo, _ in self.bucket.ranges}, self.bucket)


AT_CACHE = 64  # static graphs kept per dynamic graph (FinalGraph.at)


def _holds_size(value: Any) -> bool:
    """Whether an op attribute is (or holds) a dynamic size."""
    if isinstance(value, (Expr, Dim)):
        return True
    return isinstance(value, tuple) and any(_holds_size(v) for v in value)


def _value_at(value: Any, env: Mapping[str, int]) -> Any:
    if isinstance(value, (Expr, Dim)):
        return evaluate(value, env)
    if isinstance(value, tuple):
        return tuple(_value_at(v, env) for v in value)
    return value


def _inputs_at(inputs: tuple[Operand, ...], env: Mapping[str, int]) -> tuple[Operand, ...]:
    """The operands with literals that are ratios of sizes (`SizeValue`) as their floats at `env`."""
    if not any(isinstance(v, Const) and isinstance(v.value, SizeValue) for v in inputs):
        return inputs
    return tuple(
        Const(v.value.at(env)) if isinstance(v, Const) and isinstance(v.value, SizeValue) else v for v in inputs
    )


def _op_at(op: Op, env: Mapping[str, int]) -> Op:
    """The op with attributes that are dynamic sizes (a reshape's target, a slice's end) evaluated."""
    changed = {}
    for f in fields(op):
        if f.init:
            value = getattr(op, f.name)
            new = _value_at(value, env)
            if new is not value and new != value:
                changed[f.name] = new
    return dataclasses.replace(op, **changed) if changed else op
