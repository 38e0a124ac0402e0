"""Pieces: the sub-graphs of a finalized graph that one kernel runs (the partitioner makes them; engines,
tuning and plans read them)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

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

    def tensor(self, uid: int) -> TensorDesc:
        return self.graph.tensors[uid]

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(n.kind for n in self.nodes)

    def label(self) -> str:
        return f"piece {self.index} [" + ", ".join(n.name for n in self.nodes) + "]"

    def signature(self) -> str:
        """A hash of what the piece computes (ops, attributes, tensor shapes, strides and types,
        roles of its boundary tensors), not of names or UIDs: the key of tuning caches."""
        renumber: dict[int, int] = {}

        def num(uid: int) -> int:
            return renumber.setdefault(uid, len(renumber))

        def desc(uid: int) -> list:
            t = self.tensor(uid)
            return [num(uid), list(t.dim), list(t.stride), t.data_type.value, t.is_pass_by_value]

        doc = {
            "in": [desc(u) for u in self.inputs],
            "nodes": [
                [n.kind, encode_attrs(n.op), n.compute_data_type.value,
                 [None if v is None else (num(v) if isinstance(v, int) else repr(v.value)) for v in n.inputs],
                 [None if u is None else desc(u) for u in n.outputs]]
                for n in self.nodes
            ],
            "out": [num(u) for u in self.outputs],
        }
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]



def make_piece(graph: FinalGraph, index: int, nodes: Sequence[Node]) -> Piece:
    produced = {u for n in nodes for u in n.output_uids()}
    members = {id(n) for n in nodes}
    inputs: list[int] = []
    for n in nodes:
        for u in n.input_uids():
            if u not in produced and u not in inputs:
                inputs.append(u)
    outputs = []
    for u in sorted(produced, key=lambda u: graph.producer_index(u) or 0):
        t = graph.tensors[u]
        read_outside = any(id(c) not in members for c in graph.consumers(u))
        if not t.is_virtual or read_outside:
            outputs.append(u)
    return Piece(index, tuple(nodes), tuple(inputs), tuple(outputs), graph)
