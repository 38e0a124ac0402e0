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

from ..core.errors import GraphError, UnsupportedGraphError, VariantPackError
from ..core.symbolic import INT64_MAX
from .aot_attention import FREED, free_attention_state
from .fx_graph import examples, import_fx, translatable
from .fx_linear import fold_linear_views
from .fx_norms import recognise_rms_norms
from .fx_tidy import VIEWS, tidy
from .torch_runtime import ImportedGraph
from .torch_symbolic import fx_symbol_table

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
    """A partition run by opgraph: its submodule name, the aten ops it holds (target x count), its
    plan's steps per engine and, for a dynamic plan, its dims (name, lowest, highest) at compile time."""

    name: str
    nodes: int
    ops: tuple[tuple[str, int], ...]
    engines: tuple[tuple[str, int], ...]
    dims: tuple[tuple[str, int, int], ...] = ()

    def __str__(self) -> str:
        engines = ", ".join(f"{e} x{n}" for e, n in self.engines)
        dims = ", ".join(f"{n} {lo}..{hi}" for n, lo, hi in self.dims)
        over = f", a dynamic plan over {dims}" if dims else ""
        return f"{self.name}: {self.nodes} node(s) as {sum(n for _, n in self.engines)} plan step(s) ({engines}{over})"


@dataclass
class GraphReport:
    """What became of one graph the backend compiled: `kind` ('forward', 'backward', 'inference'),
    the input shapes it was built for, the partitions opgraph runs and the nodes left to PyTorch
    (`fallbacks`: ops opgraph cannot run; `views`: views, getitems and empty tensors outside
    partitions, which cost nothing there)."""

    kind: str
    index: int
    shapes: tuple[tuple[int | str, ...], ...]  # (a symbolic size as torch names it: s77)
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
    the submodule it replaces (a tuple of outputs, or the one output bare, as the submodule returns).

    A partition of a graph torch.compile made dynamic runs one dynamic plan over its dims' ranges: the
    layouts of its inputs, outputs and results are evaluated once per shape met. A call whose sizes lie
    above a range that torch left open (`fx_symbol_table`) builds the partition again over a wider one
    (`widen`, reported on the `opgraph.dynamo` logger), once per doubling, never per shape."""

    def __init__(
        self, imported: ImportedGraph, plan: Any, fallback: Any, name: str, device: Any, widen: Any = None
    ) -> None:
        import torch

        self.device = device
        self.fallback = fallback  # the FX submodule: PyTorch runs it if the plan ever fails
        self.name = name
        self.failed = False
        self.widened = 0
        self._widen = widen  # (sizes met -> (imported, plan) over ranges holding them), dynamic partitions
        self._torch = torch
        self._release = False  # (reserve: the plan forgets each call's buffers after it)
        output = next(n for n in fallback.graph.nodes if n.op == "output")
        self._single = not isinstance(output.args[0], (tuple, list))  # (the submodule returns one value bare)
        self._adopt(imported, plan)

    def _adopt(self, imported: ImportedGraph, plan: Any) -> None:
        self.imported = imported
        self.plan = plan
        self._layouts: dict[tuple, tuple] = {}
        self._bound = [(h.known_uid(), s) for h, s in imported.bound_inputs]
        self._static = None if imported.dynamic else self._layout({})
        self._sizes = _size_inputs(self.fallback, imported) if imported.dynamic else []
        if self._release:  # (a plan built again after `reserve`: reserved as its predecessor was)
            self.reserve()

    def _env(self, args: Sequence[Any], ranges: Any = None) -> dict[str, int]:
        """The dims' values a call's tensors and size arguments give (size arguments: where a tensor
        input holds only a product, `s0*s1`, as a linear layer's flattened input does)."""
        from ..core.symbolic_solve import Observed, solve

        observed = self.imported._observed(args)
        observed += [Observed(expr, int(args[i]), f"size argument {where}") for i, expr, where in self._sizes]
        return solve(observed, ranges=ranges)

    def _layout(self, env: Mapping[str, int]) -> tuple[list, list, list]:
        """At the dims' values `env` ({} for a static plan): (input position, uid, dims, strides) per
        input, (uid, dims, strides, dtype) per output, (uid or None, shape or value) per result."""
        from ..core.symbolic import evaluate
        from .torch_runpack import _layout

        final = self.imported.graph.final
        inputs = []
        for i, handle in enumerate(self.imported._input_slots):
            if handle is not None:
                d = final.tensors[handle.known_uid()]
                inputs.append((i, d.uid, *_layout(d, env)))
        outputs = [(u, *_layout(final.tensors[u], env), final.tensors[u].data_type.to_torch()) for u in final.outputs]
        leaves = [
            (None, leaf.value)
            if leaf.tensor is None
            else (leaf.tensor.known_uid(), tuple(evaluate(d, env) for d in leaf.shape) if env else leaf.shape)
            for leaf in self.imported._output_leaves
        ]
        return inputs, outputs, leaves

    def _layout_at(self, args: Sequence[Any]) -> tuple[list, list, list]:
        key = tuple(tuple(a.shape) if isinstance(a, self._torch.Tensor) else a for a in args)
        found = self._layouts.get(key)
        if found is None:
            try:
                env = self._env(args)
            except VariantPackError as err:
                if err.rule != "pack.dim_range" or self._widen is None:
                    raise
                sizes = self._env(args, {name: (1, INT64_MAX) for name in self.imported.symbols})
                log.info("opgraph: partition %s met sizes %s outside its ranges; building it again", self.name, sizes)
                self._adopt(*self._widen(sizes))
                self.widened += 1
                env = self._env(args)  # (a range torch bounded stays as it was: out of it still, this raises)
            if len(self._layouts) >= 64:
                self._layouts.pop(next(iter(self._layouts)))
            found = self._layouts[key] = self._layout(env)
        return found

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
        try:
            pack, leaves = self._pack(args)
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
        outs = tuple(value if uid is None else pack[uid].view(value) for uid, value in leaves)
        return outs[0] if self._single else outs

    def _pack(self, args: Sequence[Any]) -> tuple[dict[int, Any], list]:
        """The variant pack of a call (inputs bound as they come where their layout is the plan's,
        fresh outputs) and the results' (uid, shape) to view them as."""
        torch = self._torch
        inputs, outputs, leaves = self._static or self._layout_at(args)
        pack: dict[int, Any] = {}
        device = self.device
        for i, uid, dim, stride in inputs:
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
        for uid, dim, stride, dtype in outputs:
            pack[uid] = torch.empty_strided(dim, stride, dtype=dtype, device=device)
        return pack, leaves


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


def _supported(refused: Mapping[str, str], node: Any, dynamic: bool = False) -> bool:
    """The partitioner's operator support: translatable, with tensor values (of static sizes unless
    `dynamic`), not found wanting."""
    import torch

    if node.name in refused or node.op != "call_function" or not translatable(node) or node.meta.get(FREED):
        return False
    val = node.meta.get("val")
    vals = val if isinstance(val, (list, tuple)) else [val]
    if isinstance(val, (list, tuple)) and node.users and all(u.target is operator.getitem for u in node.users):
        vals = [val[u.args[1]] for u in node.users]  # the results read (an attention kernel's RNG state may not be)
    # empty tensors, non-tensor results and, unless dynamic, symbolic sizes stay in PyTorch (a symbolic
    # size is never 0 or 1: torch.compile specializes those)
    return all(
        v is None
        or (
            isinstance(v, torch.Tensor)
            and all(d > 0 if isinstance(d, int) else dynamic and isinstance(d, torch.SymInt) for d in v.shape)
        )
        for v in vals
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
    dynamic: bool = False,
) -> tuple[Any, GraphReport]:
    """Partition `gm` (an AOTAutograd GraphModule; modified in place), build a plan per partition and
    return the fused GraphModule, whose partitions are `PlanModule`s, with its report. `user_outputs`: the
    positions of the graph's results its caller sees (None: all; a training forward's others are saved
    for the backward). `dynamic`: nodes of symbolic sizes (a graph torch.compile made dynamic) join
    partitions too, each partition a dynamic plan over its shape symbols' ranges (`fx_symbol_table`);
    otherwise they stay in PyTorch."""
    from torch.fx.node import _get_qualified_name
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
    from torch.fx.passes.operator_support import create_op_support
    from torch.fx.passes.utils.fuser_utils import fuse_as_graphmodule, fuse_by_partitions, topo_sort

    fold_linear_views(gm)  # (linear layers as one batched matmul each, as from_torch imports them)
    free_attention_state(gm)  # (a training forward's attention in its plan: its unused RNG state not saved)
    recognise_rms_norms(gm)  # (a written-out RMSNorm as one op, as from_torch imports it; not where the
    # forward saves its rsqrt for the backward: each op it removes must have no other reader)
    tidy(gm, user_outputs)  # (AOTAutograd's duplicate casts merged, casts beside their sources, ...)
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    position = {n.name: i for i, n in enumerate(calls)}
    shapes = tuple(
        tuple(d if isinstance(d, int) else str(d) for d in n.meta["val"].shape)
        if hasattr(n.meta.get("val"), "shape")
        else ()
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
        support = create_op_support(functools.partial(lambda r, _subs, n: _supported(r, n, dynamic), dict(refused)))
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
            outcome = _import_partition(sub, engines, build_options, dynamic)
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
            outcome = _import_partition(sub, engines, build_options, dynamic)
            if isinstance(outcome, dict):  # (the same nodes imported before: not expected)
                continue
            imported, plan, device, _ = outcome
        widen = _widener(sub, engines, build_options) if imported.dynamic else None
        fused.delete_submodule(name)
        fused.add_submodule(name, as_module(PlanModule(imported, plan, sub, name, device, widen)))
        report.partitions.append(_partition_report(name, sub, plan, imported))
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
        elif _base(n) in VIEW_OPS or _supported({}, n) or _empty(n) or _size_arithmetic(n):
            # a view, an empty tensor, sizes computed on the host, or translatable but in a partition of
            # views alone
            report.views += 1
        else:
            report.fallbacks.append(Fallback(n.name, _target(n), _why_not(n)))


def _size_inputs(sub: Any, imported: ImportedGraph) -> list[tuple[int, Any, str]]:
    """(position, the size as an expression of the plan's dims, name) of each size argument (a
    `torch.SymInt` placeholder) of a dynamic partition whose symbols are all the plan's dims."""
    import torch

    from .torch_symbolic import SymbolTable, active, to_symint

    dims = imported.symbols
    out = []
    for i, n in enumerate(n for n in sub.graph.nodes if n.op == "placeholder"):
        val = n.meta.get("val")
        if not isinstance(val, torch.SymInt):
            continue
        symbols = val.node.expr.free_symbols
        if not symbols or any(str(sym) not in dims for sym in symbols):
            continue
        with active(SymbolTable({sym: dims[str(sym)] for sym in symbols})):
            out.append((i, to_symint(val), n.name))
    return out


def _size_arithmetic(node: Any) -> bool:
    """A node computing a size (a dynamic graph's `s0 * s1`, `sym_size`): host arithmetic on ints."""
    import torch

    return isinstance(node.meta.get("val"), torch.SymInt)


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


def _partition_report(name: str, sub: Any, plan: Any, imported: ImportedGraph) -> PartitionReport:
    counts: dict[str, int] = {}
    for n in sub.graph.nodes:
        if n.op == "call_function":
            counts[_target(n)] = counts.get(_target(n), 0) + 1
    engines: dict[str, int] = {}
    for step in plan.steps:
        engines[step.config.engine] = engines.get(step.config.engine, 0) + 1
    dims = tuple((d.name, d.min, d.max) for d in imported.symbols.values())
    return PartitionReport(
        name, sum(counts.values()), tuple(sorted(counts.items())), tuple(sorted(engines.items())), dims
    )


def _why_not(node: Any) -> str:
    import torch

    if not isinstance(node.target, torch._ops.OpOverload):
        return "not an aten op"
    if not translatable(node):
        return "no opgraph translation"
    return "symbolic, empty or non-tensor values"


def _import_partition(
    sub: Any,
    engines: Sequence[str] | None,
    build_options: Mapping[str, Any],
    dynamic: bool = False,
    seen: Mapping[str, int] | None = None,
) -> tuple[ImportedGraph, Any, Any, list[str]] | dict[str, str]:
    """The partition imported and its plan built, or {node name: reason} for what to take out ({} when
    the whole partition must go). `dynamic`: its symbolic sizes become dynamic dims (`seen`: sizes met
    above the ranges torch left open, which the new ones must hold)."""
    device = _device(sub)
    if device is None:
        return {
            n.name: "its partition's tensors are on several devices" for n in sub.graph.nodes if n.op == "call_function"
        }
    symbols = fx_symbol_table(examples(sub), seen) if dynamic else None
    try:
        imported = import_fx(sub, name=sub.__class__.__name__, symbols=symbols)
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


def _widener(sub: Any, engines: Sequence[str] | None, build_options: Mapping[str, Any]) -> Any:
    """A dynamic partition's rebuild over wider ranges: sizes met -> (imported, plan) whose ranges hold
    them and every size met before."""
    seen: dict[str, int] = {}

    def widen(sizes: Mapping[str, int]) -> tuple[ImportedGraph, Any]:
        for name, size in sizes.items():
            seen[name] = max(size, seen.get(name, 0))
        outcome = _import_partition(sub, engines, build_options, True, seen)
        if isinstance(outcome, dict):
            raise UnsupportedGraphError(
                f"the partition did not build over wider ranges ({next(iter(outcome.values()), 'no reason')})",
                rule="dynamo.widen",
            )
        return outcome[0], outcome[1]

    return widen


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
