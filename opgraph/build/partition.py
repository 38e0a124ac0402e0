"""Cutting a finalized graph into pieces, each a connected run of ops that one engine kernel runs.

Pieces are contiguous runs of the topological order, so the pieces' order is always a valid
execution order and no piece can need another's output before that piece ran. A tensor crossing
pieces is materialised once (the plan gives it workspace unless it is a graph output); tensors that
stay inside a piece stay virtual. For every cut the partitioner keeps each engine's reason for not
extending the piece over it: `describe()` prints them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..core.config import Support
from ..core.errors import UnsupportedGraphError
from ..core.ir import FinalGraph, Node
from ..core.piece import Piece, grow, make_piece
from ..ops.layout import VIEW_KINDS

if TYPE_CHECKING:
    from ..core.device import Device
    from ..engines.base import Engine


@dataclass(frozen=True)
class Cut:
    """Why piece `before` was not extended over the first op of the next piece."""

    before: int
    node: Node
    reasons: tuple[tuple[str, str], ...]  # (engine, reason)


def _unsupported(node: Node, graph: FinalGraph, engines: Sequence[Engine], device: Device) -> None:
    verdicts = [(e.name, engine_supports(e, make_piece(graph, 0, [node]), device)) for e in engines]
    reasons = "; ".join(f"{name}: {v.reason}" for name, v in verdicts)
    raise UnsupportedGraphError(
        f"no allowed engine runs this op ({reasons})",
        op=node.label(),
        rule="engine.no_support",
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
                    return (
                        f"{node.label()} updates {graph.tensors[uid].label()} in place, which {other.label()} "
                        "reads at other elements: they cannot share a kernel"
                    )
    return None


def overwrites_own_input(node: Node) -> str | None:
    """Why `node` writes its result over an input it reads at other elements (a one-op graph's matmul or
    convolution over its own operand, a transpose in place; finalize allows no such update in larger
    graphs), or None. Only an engine that writes a piece's outputs after computing all of it (copying
    them out: `Engine.writes_after_compute`) runs such a node right; another's kernel would read
    elements it had already overwritten."""
    roles = node.op.input_roles()
    for out_role, out in zip(node.op.output_roles(), node.outputs):
        for in_role, v in zip(roles, node.inputs):
            if type(v) is int and v == out and node.op.dependence(out_role, in_role) not in ("aligned", "none"):
                return (
                    f"{node.label()} writes its {out_role} over its own {in_role} (UID {out}), whose other "
                    "elements it still reads: only an engine that computes the whole result before writing it "
                    "(torch, reference) runs that right [rule dataflow.inplace]"
                )
    return None


# A concatenation joins values computed at other dims (the rotary embedding's cat(-x2, x1) of slices), and
# a lookup's result may broadcast into the space only where it is added (GPT-2's position embedding):
# until that op joins, the piece holds values it cannot write out (a dangling view, a value of other
# dims), and the greedy walk would cut before them. At such a cut the walk looks ahead over this many ops
# of these kinds, to a concatenation (or over them all where the piece holds a concatenation or a
# lookup), and takes the shortest run that the piece's engine runs.
LOOKAHEAD = 12
_JOINABLE = frozenset({*VIEW_KINDS, "pointwise", "concatenate", "embedding"})
_JOINING = frozenset({"concatenate", "embedding"})


def _lookahead(nodes: Sequence[Node], at: int, joined: bool) -> list[Node]:
    """The ops after `at` that a lookahead from a cut at nodes[at] may take (see LOOKAHEAD): up to the last
    concatenation among them, or all where `joined` (the piece holds a concatenation or a lookup), or at
    least to the first op reading nodes[at] (through views) where it is a view or a pointwise op; else none."""
    run = []
    for n in nodes[at + 1 : at + LOOKAHEAD]:
        if n.kind not in _JOINABLE:
            break
        run.append(n)
    last = max((i for i, n in enumerate(run) if n.kind == "concatenate"), default=len(run) - 1 if joined else -1)
    # a view joins with the op reading it (a bias reshaped for an epilogue), and so does a pointwise op (a
    # cast of a value in memory read by the next ops, whose other operands are the piece's: the importer's
    # recasts before an RMSNorm's scaling)
    if nodes[at].kind in VIEW_KINDS or nodes[at].kind == "pointwise":
        made = set(nodes[at].output_uids())
        for i, n in enumerate(run):
            if made & set(n.input_uids()):
                if n.kind not in VIEW_KINDS:
                    last = max(last, i)
                    break
                made.update(n.output_uids())  # (through the views it feeds)
    return run[: last + 1]


def _ahead(
    nodes: Sequence[Node],
    at: int,
    group: Sequence[Node],
    grown: Piece,
    owner: int,
    engines: Sequence[Engine],
    fits: Callable[[Piece, int], int | None],
    graph: FinalGraph,
) -> list[tuple[Node, Piece]]:
    """The shortest run of ops after a cut at nodes[at] (LOOKAHEAD) that engine `owner` runs joined to
    `grown` (the group and nodes[at]), each op with the piece grown over it; [] where there is none.
    `fits(piece, k)`: the most preferred of the first k engines that runs the piece."""
    if owner > 0 and not engines[owner].fuses_neighbours or nodes[at].kind not in _JOINABLE:
        return []
    taken: list[tuple[Node, Piece]] = []
    for n in _lookahead(nodes, at, bool(grown.kind_set & _JOINING)):
        if _inplace_race([*group, nodes[at], *(m for m, _ in taken)], n, graph) is not None:
            return []
        grown = grow(grown, n)
        taken.append((n, grown))
        if fits(grown, owner + 1) == owner:
            return taken
    return []


def _second_product(group: Sequence[Node], node: Node) -> str | None:
    """Why matmul `node` does not join a group holding a matmul of the same A, on a GPU: products of one
    operand are weighed together after the walk there (build/sibling_merge.py), not joined greedily."""
    if node.kind == "matmul" and any(n.kind == "matmul" and n.input("A") == node.input("A") for n in group):
        return "a product of the same A is merged after the partition where the estimates say so [build.sibling_merge]"
    return None


def _views_only(nodes: Sequence[Node]) -> bool:
    return all(n.kind in VIEW_KINDS for n in nodes)


def engine_supports(engine: Engine, piece: Piece, device: Device) -> Support:
    """The engine's verdict on one kernel running the piece, with the partitioner's own rule first: a
    node overwriting an input it reads at other elements needs an engine that writes after computing."""
    overwrite = piece.fold("partition.overwrites", lambda found, n: found or overwrites_own_input(n), None)
    if overwrite is not None and not engine.writes_after_compute:
        return Support.no(overwrite)
    return engine.supports(piece, device)


def partition(
    graph: FinalGraph, engines: Sequence[Engine], device: Device, *, allow_partition: bool = True
) -> tuple[list[Piece], list[Cut]]:
    """Greedy over the topological order. `engines` are in order of preference: a piece belongs to
    the most preferred engine that runs it. The next op joins the current piece when an engine at
    least as preferred runs the grown piece (a lone slice on the reference engine becomes part of a
    Triton matmul that folds it in); a piece of a less preferred engine (op-by-op torch) does not
    absorb an op that a more preferred engine runs, unless that engine fuses what it absorbs (the
    library engine's generated epilogue); an op that no engine runs alone (a transpose
    only a GEMM template folds in) opens a pending piece that later ops may complete.

    A run of views (reshapes, transposes, slices) stays open for the op that reads them: views that an
    engine would copy alone (the pointwise template's copies) join the next views pending, so that a GEMM
    or attention op after them reads them all in place; where the next op is not their reader (no engine
    runs the views and it as one piece as well as it runs that op alone), the views close as pieces of
    their own (`_close_views`), each run on the most preferred engine that copies it."""
    groups: list[list[Node]] = []
    pieces: list[Piece] = []  # the piece of each group (grown one op at a time)
    owners: list[int | None] = []  # None: no engine runs the group yet
    cuts: list[Cut] = []

    def best(piece: Piece, limit: int) -> tuple[int | None, list[tuple[str, Support]]]:
        # in order of preference, stopping at the first engine that runs the piece: the verdicts of the
        # others would only explain a cut, and a cut asks every engine (some answers cost a library
        # query: cuDNN's support check)
        verdicts: list[tuple[str, Support]] = []
        for r, e in enumerate(engines[:limit]):
            verdicts.append((e.name, engine_supports(e, piece, device)))
            if verdicts[-1][1].ok:
                return r, verdicts
        return None, verdicts

    walk = _Walk(graph, len(engines), groups, pieces, owners, cuts, best)
    nodes = graph.nodes
    skip = 0
    for at, node in enumerate(nodes):
        if skip:
            skip -= 1
            continue
        if groups:
            owner = owners[-1]
            race = _inplace_race(groups[-1], node, graph) or (
                _second_product(groups[-1], node) if device.is_cuda else None
            )
            if race is None:
                grown = grow(pieces[-1], node)
                if _views_only(groups[-1]) and _after_views(walk, node, grown):
                    continue
                fit, verdicts = best(grown, len(engines) if owner is None else owner + 1)
                if fit is None and owner is not None:
                    taken = _ahead(nodes, at, groups[-1], grown, owner, engines, lambda p, k: best(p, k)[0], graph)
                    if taken:
                        groups[-1] += [node, *(n for n, _ in taken)]
                        pieces[-1] = taken[-1][1]
                        skip = len(taken)
                        continue
                if fit is not None and fit == owner and owner > 0 and not engines[owner].fuses_neighbours:
                    preferred, _ = best(make_piece(graph, len(groups), [node]), owner)
                    if preferred is not None:
                        verdicts = [
                            (
                                engines[owner].name,
                                Support.no(f"this op runs on the preferred engine '{engines[preferred].name}'"),
                            )
                        ]
                        fit = None
                if fit is not None or owner is None:
                    groups[-1].append(node)
                    pieces[-1] = grown
                    owners[-1] = fit
                    continue
                cuts.append(Cut(len(groups) - 1, node, tuple((name, v.reason) for name, v in verdicts)))
            else:
                _close_pending_views(walk)
                if owners[-1] is None:
                    _unsupported(groups[-1][0], graph, engines, device)
                cuts.append(Cut(len(groups) - 1, node, (("partition", race),)))
        alone = make_piece(graph, len(groups), [node])
        first, _ = best(alone, len(engines))
        groups.append([node])
        pieces.append(alone)
        owners.append(first)
    if owners:
        _close_pending_views(walk)
    if owners and owners[-1] is None:
        _unsupported(groups[-1][0], graph, engines, device)
    if not allow_partition and len(groups) > 1:
        whole = make_piece(graph, 0, graph.nodes)
        single = next((e for e in engines if engine_supports(e, whole, device).ok), None)
        if single is not None:
            return [whole], []
        cut = cuts[0]
        reasons = "; ".join(f"{name}: {why}" for name, why in cut.reasons)
        raise UnsupportedGraphError(
            f"the graph needs {len(groups)} kernels, and allow_partition=False asks for one; fusion broke "
            f"at this op ({reasons})",
            op=cut.node.label(),
            rule="partition.strict",
            hint="build with allow_partition=True to run it as several kernels, or change the op",
        )
    return pieces, cuts


@dataclass
class _Walk:
    """The partitioner's state, for the helpers on runs of views: the groups of ops so far, each one's
    piece and engine (None: pending), the cuts, and `best(piece, limit)` (the most preferred of the first
    `limit` engines running a piece, with the verdicts)."""

    graph: FinalGraph
    engines: int
    groups: list[list[Node]]
    pieces: list[Piece]
    owners: list[int | None]
    cuts: list[Cut]
    best: Callable[[Piece, int], tuple[int | None, list[tuple[str, Support]]]]

    def fits(self, piece: Piece) -> int | None:
        return self.best(piece, self.engines)[0]


def _close_pending_views(w: _Walk) -> None:
    """A pending run of views (the last group) that its reader did not join: pieces of its own, where an
    engine runs each (else it stays pending: the caller names the op no engine runs)."""
    if w.owners[-1] is None and _views_only(w.groups[-1]):
        runs = _close_views(w.groups[-1], len(w.groups) - 1, w.graph, w.fits)
        if all(fit is not None for _, _, fit in runs):
            _install(w, runs)


def _install(w: _Walk, runs: list[tuple[list[Node], Piece, int | None]]) -> None:
    """The last group replaced by `runs` (from `_close_views` at its position), a cut between each two."""
    w.groups.pop()
    w.pieces.pop()
    w.owners.pop()
    for i, (run, piece, fit) in enumerate(runs):
        if i:  # (each engine's reason for not copying the next view with the run before)
            _, verdicts = w.best(grow(w.pieces[-1], run[0]), w.engines)
            w.cuts.append(Cut(len(w.groups) - 1, run[0], tuple((name, v.reason) for name, v in verdicts)))
        w.groups.append(run)
        w.pieces.append(piece)
        w.owners.append(fit)


def _after_views(w: _Walk, node: Node, grown: Piece) -> bool:
    """`node` after a run of views (the last group; `grown`: it with `node`). A view stays pending with
    them; another op joins the longest run of them ending here that an engine runs with it at least as
    preferred as the op alone, and the views before close as pieces of their own. False: no engine runs
    the op, with views or alone (the caller's pending rule applies)."""
    if node.kind in VIEW_KINDS:
        w.groups[-1].append(node)
        w.pieces[-1] = grown
        w.owners[-1] = None
        return True
    pending = w.groups[-1]
    alone = make_piece(w.graph, len(w.groups), [node])
    alone_fit = w.fits(alone)
    for k in range(len(pending) + 1):
        run = [*pending[k:], node]
        fit = w.fits(grown if k == 0 else make_piece(w.graph, len(w.groups), run))
        if fit is None or (alone_fit is not None and fit > alone_fit):
            continue
        closed = _close_views(pending[:k], len(w.groups) - 1, w.graph, w.fits)  # (the views before the run)
        if all(f is not None for _, _, f in closed):
            break
    else:
        return False
    if k:
        _install(w, closed)
        why = (
            f"{node.label()} reads the views from here on in place; the views before are read by other ops"
            if k < len(pending)
            else f"{node.label()} reads none of the views before it in place (they are read by other ops)"
        )
        w.cuts.append(Cut(len(w.groups) - 1, run[0], (("partition", why),)))
        w.groups.append([])
        w.owners.append(None)
        w.pieces.append(alone)
    w.groups[-1] = run
    w.pieces[-1] = make_piece(w.graph, len(w.groups) - 1, run)
    w.owners[-1] = fit
    return True


def _close_views(
    run: list[Node], index: int, graph: FinalGraph, fits: Callable[[Piece], int | None]
) -> list[tuple[list[Node], Piece, int | None]]:
    """A pending run of views as pieces from position `index`: greedy in order, a view joining the piece
    before it where an engine at least as preferred runs both (`fits`: the most preferred engine running
    a piece, or None), so that views a preferred engine copies are not left to a less preferred one that
    runs them all."""
    out: list[tuple[list[Node], Piece, int | None]] = []
    for node in run:
        if out:
            nodes, piece, owner = out[-1]
            grown = grow(piece, node)
            fit = fits(grown)
            if fit is not None and (owner is None or fit <= owner):
                out[-1] = ([*nodes, node], grown, fit)
                continue
        alone = make_piece(graph, index + len(out), [node])
        out.append(([node], alone, fits(alone)))
    return out
