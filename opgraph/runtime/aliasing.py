"""In-place updates through the variant pack: which outputs of a plan may be bound to the very buffer
of an input (batchnorm's next running mean over its running mean, rotary embeddings written over q).

An output O may share the buffer of input I (the same address, dims, strides and type) when
  1. every element of O depends only on the element of I at the same index: each op on the way from
     I to O is aligned (`Op.dependence`: pointwise math, a running-statistics update) and keeps I's dims;
  2. nothing reads I after O was written: every op that reads I runs in an earlier step than the one
     writing O, or in that step, where everything that depends on I is aligned too (no reduction or
     layout op of I shares the kernel that overwrites it);
  3. the engine of the writing step reads each element before it writes the aligned one
     (`Engine.inplace_safe`).
Everything else stays what it was: a VariantPackError (rule pack.overlap), now saying which condition
failed. `plan_inplace` is computed once per plan; binding a pack only looks pairs up.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..core.ir import FinalGraph, Node


def dependents(graph: FinalGraph, src: int) -> tuple[set[int], set[int]]:
    """(aligned, other): the tensors whose every element depends only on src's element at the same
    index (src included), and those that depend on src in any other way."""
    dims = graph.tensors[src].dim
    aligned, other = {src}, set()
    for node in graph.nodes:
        roles = node.op.input_roles()
        for out_role, out in zip(node.op.output_roles(), node.outputs):
            if out is None:
                continue
            kind = "none"
            for role, v in zip(roles, node.inputs):
                if not isinstance(v, int) or (v not in aligned and v not in other):
                    continue
                dep = node.op.dependence(out_role, role)
                if dep == "none":
                    continue
                if v in aligned and dep == "aligned" and graph.tensors[out].dim == dims:
                    kind = "aligned"
                else:
                    kind = "any"
                    break
            if kind == "aligned":
                aligned.add(out)
            elif kind == "any":
                other.add(out)
    return aligned, other


@dataclass(frozen=True)
class InplaceRule:
    """The (input, output) UID pairs a pack may bind to one buffer, and why the other pairs of tensors
    with equal dims, strides and type may not."""

    allowed: frozenset[tuple[int, int]] = frozenset()
    refused: Mapping[tuple[int, int], str] = field(default_factory=dict)

    def reason(self, a: int, b: int) -> str:
        return self.refused.get((a, b)) or self.refused.get((b, a)) or ""


def plan_inplace(
    graph: FinalGraph, step_nodes: Sequence[Sequence[Node]], step_safe: Sequence[bool], step_labels: Sequence[str]
) -> InplaceRule:
    """The in-place rule of a plan whose step k runs the nodes `step_nodes[k]`, on an engine that is
    `step_safe[k]` (Engine.inplace_safe), described as `step_labels[k]`."""
    step_of = {node: k for k, nodes in enumerate(step_nodes) for node in nodes}
    allowed: set[tuple[int, int]] = set()
    refused: dict[tuple[int, int], str] = {}
    for i in graph.inputs:
        t = graph.tensors[i]
        same = [o for o in graph.outputs if _same_layout(graph, i, o)]
        if t.is_pass_by_value or not same:
            continue
        aligned, other = dependents(graph, i)
        readers = [n for n in graph.nodes if i in n.input_uids()]
        for o in same:
            why = _why_not(graph, i, o, aligned, other, readers, step_of, step_safe, step_labels)
            if why is None:
                allowed.add((i, o))
            else:
                refused[(i, o)] = why
    return InplaceRule(frozenset(allowed), refused)


def _same_layout(graph: FinalGraph, a: int, b: int) -> bool:
    ta, tb = graph.tensors[a], graph.tensors[b]
    return (
        ta.dim == tb.dim
        and ta.data_type is tb.data_type
        and all(s == r for d, s, r in zip(ta.dim, ta.stride, tb.stride) if d > 1)
    )


def _why_not(
    graph: FinalGraph,
    i: int,
    o: int,
    aligned: set[int],
    other: set[int],
    readers: list,
    step_of: Mapping[Node, int],
    step_safe: Sequence[bool],
    step_labels: Sequence[str],
) -> str | None:
    ti, to = graph.tensors[i].label(), graph.tensors[o].label()
    if o not in aligned:
        how = "depends on other elements of" if o in other else "does not depend on"
        return (
            f"{to} {how} {ti}, so writing it over {ti} would change values still to be read "
            "(an output may take its input's buffer only where each element depends on the same element "
            "of that input alone: pointwise chains, running-statistics updates)"
        )
    writer = graph.producer(o)
    assert writer is not None
    w = step_of[writer]
    for n in readers:
        s = step_of[n]
        if s > w:
            return (
                f"{n.label()} reads {ti} in step {s}, after step {w} wrote {to} over it (build so that "
                "they share a kernel, or give the output its own buffer)"
            )
    in_step = [n for n in graph.nodes if step_of[n] == w]
    for n in in_step:
        late = [u for u in n.output_uids() if u in other]
        if late:
            return f"{n.label()} depends on other elements of {ti} in the kernel of step {w} that writes {to} over it"
    if any(step_of[n] == w for n in readers) and not step_safe[w]:
        return (
            f"step {w} ({step_labels[w]}) may write {to} before it read all of {ti}: its engine does not "
            "promise element-by-element updates (build with engines that do, e.g. deselect_engines="
            "['library', 'cudnn'], or give the output its own buffer)"
        )
    return None
