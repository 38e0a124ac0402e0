"""Pieces: the sub-graphs of a finalized graph that one kernel runs (the partitioner makes them; engines,
tuning and plans read them). A piece grown by one op from another (`grow`) reuses its bookkeeping, so
partitioning stays linear in the number of ops."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from .attrs import encode_attrs
from .ir import FinalGraph, Node
from .tensor import TensorDesc


@dataclass(frozen=True)
class Piece:
    """A sub-graph run by one kernel. `inputs` are read from outside it; `outputs` are produced here
    and needed outside (graph outputs or later pieces); everything else is internal."""

    index: int
    nodes: tuple[Node, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    graph: FinalGraph = field(compare=False, repr=False)
    # how the piece was built (make_piece / grow): what growing it by one more op reuses
    growth: _Growth | None = field(default=None, compare=False, repr=False)

    def tensor(self, uid: int) -> TensorDesc:
        return self.graph.tensors[uid]

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(n.kind for n in self.nodes)

    @property
    def kind_set(self) -> frozenset[str]:
        """The op kinds in the piece (known without a pass over its nodes)."""
        return self.growth.kinds if self.growth is not None else frozenset(n.kind for n in self.nodes)

    def fold(self, key: str, step: Callable[[Any, Node], Any], init: Any) -> Any:
        """`step` folded over the nodes from `init`, memoized: a piece grown by one op from another
        (the partitioner's way) folds only that op onto the smaller piece's result, so that a
        template's match stays linear in the size of a growing piece. `key` names the fold."""
        g = self.growth
        if g is None:
            acc = init
            for n in self.nodes:
                acc = step(acc, n)
            return acc
        if key in g.memo:
            return g.memo[key]
        if g.parent_memo is not None and key in g.parent_memo:
            acc = step(g.parent_memo[key], self.nodes[-1])
        else:
            acc = init
            for n in self.nodes:
                acc = step(acc, n)
        g.memo[key] = acc
        return acc

    def label(self) -> str:
        return f"piece {self.index} [" + ", ".join(n.name for n in self.nodes) + "]"

    def signature(self) -> str:
        """A hash of what the piece computes (ops, attributes, tensor shapes, strides and types,
        roles of its boundary tensors), not of names or UIDs: the key of tuning caches."""
        return self._structure[0]

    def uid_order(self) -> tuple[int, ...]:
        """The piece's tensor UIDs in the order its signature numbers them: two pieces of one signature
        pair their tensors by position here (a model's identical layers)."""
        return self._structure[1]

    def structure_key(self) -> tuple[str, tuple[tuple[bool, bool], ...]]:
        """What identical pieces share: the signature, and the by-reference and virtual flags of the
        tensors in `uid_order` (which the signature leaves out; a kernel reads a by-reference buffer
        through the address table)."""
        return self._structure_key

    @cached_property
    def _structure_key(self) -> tuple[str, tuple[tuple[bool, bool], ...]]:
        flags = tuple((self.tensor(u).is_by_reference, self.tensor(u).is_virtual) for u in self._structure[1])
        return self._structure[0], flags

    @cached_property
    def _structure(self) -> tuple[str, tuple[int, ...]]:
        renumber: dict[int, int] = {}

        def num(uid: int) -> int:
            return renumber.setdefault(uid, len(renumber))

        def desc(uid: int) -> list:
            t = self.tensor(uid)
            return [num(uid), list(t.dim), list(t.stride), t.data_type.value, t.is_pass_by_value]

        doc = {
            "in": [desc(u) for u in self.inputs],
            "nodes": [
                [
                    n.kind,
                    encode_attrs(n.op),
                    n.compute_data_type.value,
                    [None if v is None else (num(v) if isinstance(v, int) else repr(v.value)) for v in n.inputs],
                    [None if u is None else desc(u) for u in n.outputs],
                ]
                for n in self.nodes
            ],
            "out": [num(u) for u in self.outputs],
        }
        # (default=str: a symbolic piece's dims and size attributes are expressions, keyed as printed)
        digest = hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:16]
        return digest, tuple(renumber)


@dataclass
class _Growth:
    """A piece's bookkeeping, so that one more op costs work in proportion to that op (plus C-level
    copies): the partitioner grows pieces one op at a time, and rebuilding each from scratch made
    building quadratic in the number of ops."""

    members: set[int]  # node indices in graph.nodes
    produced: set[int]
    inputs: dict[int, None]  # ordered set: first-use order
    outside: dict[int, int]  # produced uid -> readers that are not members
    outputs: dict[int, None]  # ordered set: production order
    kinds: frozenset[str]
    memo: dict[str, Any] = field(default_factory=dict)
    parent_memo: dict[str, Any] | None = None


_EMPTY = _Growth(set(), set(), {}, {}, {}, frozenset())


def _node_index(graph: FinalGraph, node: Node) -> int:
    """The position of `node` in graph.nodes (through its first output, or a search)."""
    for u in node.output_uids():
        i = graph.producer_index(u)
        if i is not None and graph.nodes[i] is node:
            return i
    return next(i for i, n in enumerate(graph.nodes) if n is node)


def _grown(graph: FinalGraph, g: _Growth, node: Node) -> _Growth:
    index = _node_index(graph, node)
    members = g.members | {index}
    produced, inputs, outside, outputs = set(g.produced), dict(g.inputs), dict(g.outside), dict(g.outputs)
    for u in dict.fromkeys(node.input_uids()):
        if u in produced:
            outside[u] -= 1
            if outside[u] == 0 and graph.tensors[u].is_virtual:
                outputs.pop(u, None)
        elif u not in node.output_uids():  # (an in-place update's input is its own output)
            inputs.setdefault(u, None)
    for u in node.output_uids():
        produced.add(u)
        inputs.pop(u, None)
        outside[u] = sum(1 for i in graph.consumer_indices(u) if i not in members)
        if not graph.tensors[u].is_virtual or outside[u] > 0:
            outputs[u] = None
    return _Growth(members, produced, inputs, outside, outputs, g.kinds | {node.kind}, parent_memo=g.memo)


def grow(piece: Piece, node: Node, index: int | None = None) -> Piece:
    """`piece` with `node` (the next op in topological order) added: what make_piece gives for the
    nodes plus `node`, in time proportional to `node`."""
    g = piece.growth if piece.growth is not None else _grown_all(piece.graph, piece.nodes)
    ng = _grown(piece.graph, g, node)
    return Piece(
        piece.index if index is None else index,
        (*piece.nodes, node),
        tuple(ng.inputs),
        tuple(ng.outputs),
        piece.graph,
        ng,
    )


def _grown_all(graph: FinalGraph, nodes: Sequence[Node]) -> _Growth:
    g = _EMPTY
    for n in nodes:
        g = _grown(graph, g, n)
    g.parent_memo = None
    return g


def make_piece(graph: FinalGraph, index: int, nodes: Sequence[Node]) -> Piece:
    """The piece running `nodes` (a run of the topological order): what it reads from outside (in
    first-use order) and what it produces that is a graph output or read outside (in production order)."""
    g = _grown_all(graph, nodes)
    return Piece(index, tuple(nodes), tuple(g.inputs), tuple(g.outputs), graph, g)
