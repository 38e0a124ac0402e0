"""Cutting a finalized graph into pieces, each a connected run of ops that one engine kernel runs.

Pieces are contiguous runs of the topological order, so the pieces' order is always a valid
execution order and no piece can need another's output before that piece ran. A tensor crossing
pieces is materialised once (the plan gives it workspace unless it is a graph output); tensors that
stay inside a piece stay virtual. For every cut the partitioner keeps each engine's reason for not
extending the piece over it: `describe()` prints them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

from .engines.base import Support
from .errors import UnsupportedGraphError
from .ir import FinalGraph, Node
from .tensor import TensorDesc

if TYPE_CHECKING:
    from .device import Device
    from .engines.base import Engine


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
        renumber: dict[int, int] = {}

        def num(uid: int) -> int:
            return renumber.setdefault(uid, len(renumber))

        def desc(uid: int) -> list:
            t = self.tensor(uid)
            return [num(uid), list(t.dim), list(t.stride), t.data_type.value, t.is_pass_by_value]

        from .serialize import encode_attrs  # late: serialize imports the op registry

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


@dataclass(frozen=True)
class Cut:
    """Why piece `before` was not extended over the first op of the next piece."""

    before: int
    node: Node
    reasons: tuple[tuple[str, str], ...]  # (engine, reason)


def _unsupported(node: Node, graph: FinalGraph, engines: Sequence[Engine], device: Device) -> None:
    verdicts = [(e.name, e.supports(make_piece(graph, 0, [node]), device)) for e in engines]
    reasons = "; ".join(f"{name}: {v.reason}" for name, v in verdicts)
    raise UnsupportedGraphError(
        f"no allowed engine runs this op ({reasons})", op=node.label(), rule="engine.no_support",
        hint="allow another engine (engines=[...]); 'reference' runs every op on the CPU",
    )


def _inplace_race(group: Sequence[Node], node: Node, graph: FinalGraph) -> str | None:
    """Why `node`, which updates a tensor in place, cannot join `group`: an op of the group reads other
    elements of that tensor (a conv reading W as its filter) while `node` writes it."""
    for uid in set(node.input_uids()) & set(node.output_uids()):
        dims = graph.tensors[uid].dim
        for other in group:
            if uid in other.input_uids():
                out = [graph.tensors[u].dim for u in other.output_uids()]
                if other.kind != "pointwise" or any(d != dims for d in out):
                    return (f"{node.label()} updates {graph.tensors[uid].label()} in place, which {other.label()} "
                            "reads at other elements: they cannot share a kernel")
    return None


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
    return Piece(piece.index if index is None else index, (*piece.nodes, node), tuple(ng.inputs),
                 tuple(ng.outputs), piece.graph, ng)


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


def partition(
    graph: FinalGraph, engines: Sequence[Engine], device: Device, *, allow_partition: bool = True
) -> tuple[list[Piece], list[Cut]]:
    """Greedy over the topological order. `engines` are in order of preference: a piece belongs to
    the most preferred engine that runs it. The next op joins the current piece when an engine at
    least as preferred runs the grown piece (a lone slice on the reference engine becomes part of a
    Triton matmul that folds it in); a piece of a less preferred engine (op-by-op torch) does not
    absorb an op that a more preferred engine runs, unless that engine fuses what it absorbs (the
    library engine's generated epilogue); an op that no engine runs alone (a transpose
    only a GEMM template folds in) opens a pending piece that later ops may complete."""
    groups: list[list[Node]] = []
    pieces: list[Piece] = []  # the piece of each group (grown one op at a time)
    owners: list[int | None] = []  # None: no engine runs the group yet
    cuts: list[Cut] = []

    def best(piece: Piece, limit: int) -> tuple[int | None, list[tuple[str, Support]]]:
        verdicts = [(e.name, e.supports(piece, device)) for e in engines[:limit]]
        return next((r for r, (_, v) in enumerate(verdicts) if v.ok), None), verdicts

    for node in graph.nodes:
        if groups:
            owner = owners[-1]
            race = _inplace_race(groups[-1], node, graph)
            if race is None:
                grown = grow(pieces[-1], node)
                fit, verdicts = best(grown, len(engines) if owner is None else owner + 1)
                if fit is not None and fit == owner and owner > 0 and not engines[owner].fuses_neighbours:
                    alone, _ = best(make_piece(graph, len(groups), [node]), owner)
                    if alone is not None:
                        verdicts = [(engines[owner].name,
                                     Support.no(f"this op runs on the preferred engine '{engines[alone].name}'"))]
                        fit = None
                if fit is not None or owner is None:
                    groups[-1].append(node)
                    pieces[-1] = grown
                    owners[-1] = fit
                    continue
                cuts.append(Cut(len(groups) - 1, node, tuple((name, v.reason) for name, v in verdicts)))
            else:
                if owner is None:
                    _unsupported(groups[-1][0], graph, engines, device)
                cuts.append(Cut(len(groups) - 1, node, (("partition", race),)))
        alone = make_piece(graph, len(groups), [node])
        first, _ = best(alone, len(engines))
        groups.append([node])
        pieces.append(alone)
        owners.append(first)
    if owners and owners[-1] is None:
        _unsupported(groups[-1][0], graph, engines, device)
    if not allow_partition and len(groups) > 1:
        whole = make_piece(graph, 0, graph.nodes)
        single = next((e for e in engines if e.supports(whole, device).ok), None)
        if single is not None:
            return [whole], []
        cut = cuts[0]
        reasons = "; ".join(f"{name}: {why}" for name, why in cut.reasons)
        raise UnsupportedGraphError(
            f"the graph needs {len(groups)} kernels, and allow_partition=False asks for one; fusion broke "
            f"at this op ({reasons})", op=cut.node.label(), rule="partition.strict",
            hint="build with allow_partition=True to run it as several kernels, or change the op",
        )
    return pieces, cuts
