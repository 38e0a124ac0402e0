"""One AOTAutograd graph made runnable by opgraph: the nodes opgraph translates, cut into partitions
(torch.fx's CapabilityBasedPartitioner) that each run as one opgraph plan; every other node stays in
the FX graph and runs in PyTorch. `compile_graph(gm, kind, options)` returns the fused GraphModule and
a `GraphReport`.

Which nodes opgraph runs is asked of the translator, in two steps: `fx_graph.translatable` (the table
has the op) proposes partitions; each partition is then imported (`fx_graph.import_fx`), and a node
the translator declines (`Untranslatable`: it would become an opaque custom op), a node whose
translation fails, or a partition whose plan cannot be built, is taken out and the partitions are
proposed again. A partition holding only views, getitems and copies stays in PyTorch, which makes its
views without copying. So the result always runs: at worst the whole graph in PyTorch, with every
fallback and its reason in the report.

A partition runs through `PlanModule`: its inputs bound as they come (copied only when their layout
is not the one traced), fresh outputs per call (a forward's results are saved for the backward and
live on past the next call), the plan built once at compile time. Should a plan fail while running,
the partition falls back to PyTorch for good, with a warning on the `opgraph.dynamo` logger.
"""

from __future__ import annotations

import functools
import logging
import operator
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import GraphError
from .aot_attention import FREED, free_attention_state
from .fx_graph import import_fx, translatable
from .fx_linear import fold_linear_views
from .fx_tidy import VIEWS, tidy
from .torch_runtime import ImportedGraph

log = logging.getLogger("opgraph.dynamo")

# ops PyTorch runs as views or no-ops: a partition of these alone is not worth a plan
VIEW_OPS = VIEWS | frozenset(
    {
        "detach",
        "clone",
        "split",
        "split_with_sizes",
        "unbind",
        "contiguous",
        "as_strided",
        "lift_fresh_copy",
        "view_as",
        "expand_as",
        "flatten",
        "unflatten",
        "chunk",
        "narrow",
    }
)


@dataclass(frozen=True)
class Fallback:
    """A node left to PyTorch: its name, its target and why."""

    node: str
    target: str
    reason: str

    def __str__(self) -> str:
        return f"{self.node}: {self.target} ({self.reason})"


@dataclass(frozen=True)
class PartitionReport:
    """A partition run by opgraph: its submodule name, the aten ops it holds (target x count) and its
    plan's steps per engine."""

    name: str
    nodes: int
    ops: tuple[tuple[str, int], ...]
    engines: tuple[tuple[str, int], ...]

    def __str__(self) -> str:
        engines = ", ".join(f"{e} x{n}" for e, n in self.engines)
        return f"{self.name}: {self.nodes} node(s) as {sum(n for _, n in self.engines)} plan step(s) ({engines})"


@dataclass
class GraphReport:
    """What became of one graph the backend compiled: `kind` ('forward', 'backward', 'inference'),
    the input shapes it was built for, the partitions opgraph runs and the nodes left to PyTorch
    (`fallbacks`: ops opgraph cannot run; `views`: views, getitems and empty tensors outside
    partitions, which cost nothing there)."""

    kind: str
    index: int
    shapes: tuple[tuple[int, ...], ...]
    nodes: int = 0
    partitions: list[PartitionReport] = field(default_factory=list)
    fallbacks: list[Fallback] = field(default_factory=list)
    views: int = 0

    @property
    def nodes_in_opgraph(self) -> int:
        return sum(p.nodes for p in self.partitions)

    def summary(self) -> str:
        head = (
            f"{self.kind} graph {self.index}: {self.nodes} node(s), {self.nodes_in_opgraph} in "
            f"{len(self.partitions)} opgraph partition(s), {len(self.fallbacks)} left to PyTorch"
        )
        lines = [head] + [f"  {p}" for p in self.partitions] + [f"  fallback {f}" for f in self.fallbacks]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


class PlanModule:
    """Runs one partition (an `ImportedGraph` of its FX submodule) as an opgraph plan; callable like
    the submodule it replaces (a tuple of outputs, or the one output bare, as the submodule returns)."""

    def __init__(self, imported: ImportedGraph, plan: Any, fallback: Any, name: str, device: Any) -> None:
        import torch

        self.imported = imported
        self.device = device
        self.plan = plan
        self.fallback = fallback  # the FX submodule: PyTorch runs it if the plan ever fails
        self.name = name
        self.failed = False
        final = imported.graph.final
        self._torch = torch
        self._inputs = []
        for i, handle in enumerate(imported._input_slots):
            if handle is not None:
                d = final.tensors[handle.known_uid()]
                self._inputs.append((i, d.uid, tuple(d.dim), tuple(d.stride)))
        self._outputs = [
            (u, final.tensors[u].dim, final.tensors[u].stride, final.tensors[u].data_type.to_torch())
            for u in final.outputs
        ]
        self._leaves = [
            (None, leaf.value) if leaf.tensor is None else (leaf.tensor.known_uid(), leaf.shape)
            for leaf in imported._output_leaves
        ]
        self._bound = [(h.known_uid(), s) for h, s in imported.bound_inputs]
        self._release = False  # (reserve: the plan forgets each call's buffers after it)
        output = next(n for n in fallback.graph.nodes if n.op == "output")
        self._single = not isinstance(output.args[0], (tuple, list))  # (the submodule returns one value bare)

    def reserve(self) -> None:
        """Before PyTorch's CUDA graph trees record the first calls in their private pool, which must
        hold only outputs after each: the plan's per-thread state and the device copies of its constants
        (and what is derived from them) allocated now, and from now on each call's buffers released
        by the plan after it (each call binds afresh: host time only while recording)."""
        self.plan.reserve()
        self.imported.preload([s for _, s in self._bound], self.device)
        # the plan's binding keeps a call's buffers until the next: inside a recording, a partition's
        # output that the graph frees after use would stay in the pool, not an output
        self._release = True

    def __call__(self, *args: Any) -> Any:
        if self.failed:
            return self.fallback(*args)
        torch = self._torch
        pack: dict[int, Any] = {}
        device = self.device
        for i, uid, dim, stride in self._inputs:
            x = args[i]
            if x.shape == dim and x.stride() == stride:  # (as traced: most inputs, at every call)
                pack[uid] = x
                continue
            if tuple(x.shape) != dim:
                x = x.reshape(dim)
            if any(d > 1 and s != w for d, s, w in zip(dim, x.stride(), stride)):
                x = torch.empty_strided(dim, stride, dtype=x.dtype, device=x.device).copy_(x)
            pack[uid] = x
        if self._bound:  # constants folded at import, random draws (per call)
            cache: dict = {}
            for uid, source in self._bound:
                pack[uid] = self.imported._resolve(source, cache, {}, device, None)
        for uid, dim, stride, dtype in self._outputs:
            pack[uid] = torch.empty_strided(dim, stride, dtype=dtype, device=device)
        try:
            self.plan.execute(pack)
        except Exception as err:  # noqa: BLE001 - any failure: PyTorch runs the partition from now on
            self.failed = True
            log.warning(
                "opgraph: partition %s failed to run (%s: %s); PyTorch runs it from now on",
                self.name,
                type(err).__name__,
                str(err).splitlines()[0] if str(err) else "",
            )
            return self.fallback(*args)
        if self._release:
            self.plan.release()
        outs = tuple(value if uid is None else pack[uid].view(value) for uid, value in self._leaves)
        return outs[0] if self._single else outs


# -- partitioning ------------------------------------------------------------------------------------


def _target(node: Any) -> str:
    return str(node.target) if node.op == "call_function" else node.op


def _base(node: Any) -> str:
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return "getitem" if "getitem" in str(node.target) else str(node.target)
    return schema.name.split("::")[-1].rstrip("_")


def _computes(nodes: Sequence[Any]) -> bool:
    return any(n.op == "call_function" and _base(n) not in VIEW_OPS for n in nodes)


def _supported(refused: Mapping[str, str], node: Any) -> bool:
    """The partitioner's operator support: translatable, with static tensor values, not found wanting."""
    import torch

    if node.name in refused or node.op != "call_function" or not translatable(node) or node.meta.get(FREED):
        return False
    val = node.meta.get("val")
    vals = val if isinstance(val, (list, tuple)) else [val]
    if isinstance(val, (list, tuple)) and node.users and all(u.target is operator.getitem for u in node.users):
        vals = [val[u.args[1]] for u in node.users]  # the results read (an attention kernel's RNG state may not be)
    # symbolic shapes (a dynamic graph), empty tensors and non-tensor results stay in PyTorch
    return all(
        v is None or (isinstance(v, torch.Tensor) and all(isinstance(d, int) and d > 0 for d in v.shape)) for v in vals
    )


def _device(sub: Any) -> Any:
    """The one device of a partition's tensor inputs, or of its values when it has none (a mask built
    from `arange`); None when they are on several devices."""

    def devices(nodes: Any) -> set[Any]:
        found = set()
        for n in nodes:
            vals = n.meta.get("val")
            for v in vals if isinstance(vals, (list, tuple)) else [vals]:
                if hasattr(v, "device"):
                    found.add(v.device)
        return found

    found = devices(n for n in sub.graph.nodes if n.op == "placeholder") or devices(sub.graph.nodes)
    return found.pop() if len(found) == 1 else None


def compile_graph(
    gm: Any,
    kind: str,
    index: int,
    *,
    engines: Sequence[str] | None,
    build_options: Mapping[str, Any],
    user_outputs: Collection[int] | None = None,
) -> tuple[Any, GraphReport]:
    """Partition `gm` (an AOTAutograd GraphModule; modified in place), build a plan per partition and
    return the fused GraphModule, whose partitions are `PlanModule`s, with its report. `user_outputs`: the
    positions of the graph's results its caller sees (None: all; a training forward's others are saved
    for the backward)."""
    from torch.fx.node import _get_qualified_name
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
    from torch.fx.passes.operator_support import create_op_support
    from torch.fx.passes.utils.fuser_utils import fuse_as_graphmodule, fuse_by_partitions, topo_sort

    fold_linear_views(gm)  # (linear layers as one batched matmul each, as from_torch imports them)
    free_attention_state(gm)  # (a training forward's attention in its plan: its unused RNG state not saved)
    tidy(gm, user_outputs)  # (AOTAutograd's duplicate casts merged, casts beside their sources, ...)
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    position = {n.name: i for i, n in enumerate(calls)}
    shapes = tuple(
        tuple(int(d) for d in n.meta["val"].shape) if hasattr(n.meta.get("val"), "shape") else ()
        for n in gm.graph.nodes
        if n.op == "placeholder"
    )
    report = GraphReport(kind, index, shapes, nodes=len(calls))
    refused: dict[str, str] = {}
    done: dict[frozenset[str], tuple[ImportedGraph, Any, Any, list[str]]] = {}
    proposed: list[list[Any]] = []
    # views at a partition's edge stay in PyTorch (a transposed weight read in place, not copied in or out)
    views = sorted({_get_qualified_name(n.target) for n in calls if _base(n) in VIEW_OPS})
    for _round in range(len(calls) + 1):
        support = create_op_support(functools.partial(lambda r, _subs, n: _supported(r, n), dict(refused)))
        partitioner = CapabilityBasedPartitioner(gm, support, allows_single_node_partition=True, non_compute_ops=views)
        partitions = partitioner.propose_partitions()
        partitioner.remove_bookend_non_compute_ops(partitions)
        proposed = [topo_sort(list(p.nodes)) for p in partitions]
        proposed = [nodes for nodes in proposed if _computes(nodes)]
        again = False
        for i, nodes in enumerate(proposed):
            names = frozenset(n.name for n in nodes)
            if names in done:
                continue
            # (the node order fuse_by_partitions will use: the same placeholders, in the same order)
            sub, _, _ = fuse_as_graphmodule(gm, topo_sort(nodes), f"opgraph_{i}")
            _in_program_order(sub, position)
            outcome = _import_partition(sub, engines, build_options)
            if isinstance(outcome, dict):
                refused.update(outcome or dict.fromkeys(names, "the partition did not import"))
                again = True
            else:
                done[names] = outcome
        if not again:
            break
    proposed = [nodes for nodes in proposed if frozenset(n.name for n in nodes) in done]
    _account(report, calls, proposed, refused)
    subs = [done[frozenset(n.name for n in nodes)] for nodes in proposed]
    fused = fuse_by_partitions(gm, [dict.fromkeys(nodes) for nodes in proposed], prefix="opgraph_") if proposed else gm
    for i, (imported, plan, device, placeholders) in enumerate(subs):
        name = f"opgraph_{i}"
        sub = getattr(fused, name)
        if _placeholders(sub) != placeholders:  # (made in the order of first use: the plan's input slots)
            _in_program_order(sub, position)
            outcome = _import_partition(sub, engines, build_options)
            if isinstance(outcome, dict):  # (the same nodes imported before: not expected)
                continue
            imported, plan, device, _ = outcome
        fused.delete_submodule(name)
        fused.add_submodule(name, as_module(PlanModule(imported, plan, sub, name, device)))
        report.partitions.append(_partition_report(name, sub, plan))
    fused.recompile()
    return fused, report


def reserve(fused: Any) -> None:
    """Every plan of a compiled graph: its per-thread state allocated now, in the calling thread."""
    for module in fused.modules():
        fn = getattr(module, "fn", None)
        if isinstance(fn, PlanModule):
            fn.reserve()


def _account(report: GraphReport, calls: list[Any], proposed: list[list[Any]], refused: Mapping[str, str]) -> None:
    """Every node outside the partitions: a fallback (with the reason) or a view PyTorch makes."""
    inside = {n.name for nodes in proposed for n in nodes}
    for n in calls:
        if n.name in inside:
            continue
        if n.name in refused:
            report.fallbacks.append(Fallback(n.name, _target(n), refused[n.name]))
        elif _base(n) in VIEW_OPS or _supported({}, n) or _empty(n):
            report.views += 1  # a view, an empty tensor, or translatable but in a partition of views alone
        else:
            report.fallbacks.append(Fallback(n.name, _target(n), _why_not(n)))


def _empty(node: Any) -> bool:
    val = node.meta.get("val")
    return hasattr(val, "shape") and any(isinstance(d, int) and d == 0 for d in val.shape)


def _in_program_order(sub: Any, position: Mapping[str, int]) -> None:
    """A partition's ops put back in the order of the graph they were cut from (`position`: name -> place).
    torch.fx's partitioner lays a partition out breadth first, which interleaves independent chains (a
    Llama layer's rotary embedding of the queries and of the keys, op by op); opgraph's partitioner cuts
    runs of its graph's order into kernels, so an interleaved order cuts each chain at every op."""
    calls = [n for n in sub.graph.nodes if n.op == "call_function"]
    if any(n.name not in position for n in calls):
        return
    ordered = sorted(calls, key=lambda n: position[n.name])
    if ordered == calls:
        return
    output = next(n for n in sub.graph.nodes if n.op == "output")
    for n in ordered:
        output.prepend(n)
    sub.graph.lint()
    sub.recompile()


def _placeholders(sub: Any) -> list[str]:
    """The submodule's inputs in order (named after the nodes of the graph it was cut from)."""
    return [n.name for n in sub.graph.nodes if n.op == "placeholder"]


def _body(sub: Any) -> list[str]:
    return [n.name for n in sub.graph.nodes if n.op == "call_function"]


def _partition_report(name: str, sub: Any, plan: Any) -> PartitionReport:
    counts: dict[str, int] = {}
    for n in sub.graph.nodes:
        if n.op == "call_function":
            counts[_target(n)] = counts.get(_target(n), 0) + 1
    engines: dict[str, int] = {}
    for step in plan.steps:
        engines[step.config.engine] = engines.get(step.config.engine, 0) + 1
    return PartitionReport(name, sum(counts.values()), tuple(sorted(counts.items())), tuple(sorted(engines.items())))


def _why_not(node: Any) -> str:
    import torch

    if not isinstance(node.target, torch._ops.OpOverload):
        return "not an aten op"
    if not translatable(node):
        return "no opgraph translation"
    return "symbolic, empty or non-tensor values"


def _import_partition(
    sub: Any, engines: Sequence[str] | None, build_options: Mapping[str, Any]
) -> tuple[ImportedGraph, Any, Any, list[str]] | dict[str, str]:
    """The partition imported and its plan built, or {node name: reason} for what to take out ({} when
    the whole partition must go)."""
    device = _device(sub)
    if device is None:
        return {
            n.name: "its partition's tensors are on several devices" for n in sub.graph.nodes if n.op == "call_function"
        }
    try:
        imported = import_fx(sub, name=sub.__class__.__name__)
    except GraphError as err:
        if err.rule == "import.fx_node":
            return {err.op: f"translation failed: {err.detail}"}
        return _culprit(err, sub, "import failed")
    declined = {e.node: f"declined by the translator: {e.note}" for e in imported.report.custom_ops}
    if declined:
        return declined
    try:
        plan = imported.plan(device.type, engines, **build_options)
    except GraphError as err:
        return _culprit(err, sub, "no plan")
    return imported, plan, device, _placeholders(sub)


def _culprit(err: GraphError, sub: Any, what: str) -> dict[str, str]:
    """The node an error is about, from the op it names (opgraph ops are named after the FX node that
    made them: `addmm.matmul`, `view_1#2`); every node of the partition when it names none."""
    import re

    names = set(_body(sub))
    reason = f"{what}: {str(err).splitlines()[0]}"
    for e in (err, err.__cause__):
        for quoted in re.findall(r"'([^']+)'", getattr(e, "op", "") or ""):
            name = re.match(r"[A-Za-z0-9_]*", quoted)
            if name and name.group() in names:
                return {name.group(): reason}
    return dict.fromkeys(names, reason)


def as_module(fn: Any) -> Any:
    """`fn` wrapped as an nn.Module (FX call_module nodes call submodules)."""
    import torch

    class _Run(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fn = fn

        def forward(self, *args: Any) -> Any:
            return self.fn(*args)

    return _Run()
