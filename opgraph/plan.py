"""Execution plans: the pieces of a graph, the kernel chosen for each, and the workspace that holds
tensors crossing pieces. `execute` binds a variant pack and runs the steps in order."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from .bindings import arrays_overlap, bind
from .device import Device, resolve_device
from .engines import get_engine
from .engines.base import Engine, EngineConfig, Kernel
from .errors import GraphError, UnsupportedGraphError, VariantPackError
from .heuristics import HeurMode, PieceConfigs, as_modes, rank_configs
from .ir import FinalGraph
from .partition import Cut, Piece, partition
from .tensor import strided_view

ALIGN = 256  # bytes; every workspace slot starts on this boundary


@dataclass(frozen=True)
class Step:
    index: int
    piece: Piece
    config: EngineConfig
    kernel: Kernel = field(compare=False, repr=False)
    alternatives: tuple[EngineConfig, ...] = ()


def default_engines(device: Device) -> list[str]:
    return ["reference"] if not device.is_cuda else []


def _engines(names: Sequence[str] | None, device: Device) -> list[Engine]:
    if isinstance(names, str):
        names = [names]
    chosen = list(names) if names is not None else default_engines(device)
    if not chosen:
        raise UnsupportedGraphError(
            f"no engine is available for {device}", rule="engine.none",
            hint="build with device='cpu' to use the reference engine",
        )
    engines = [get_engine(n) for n in chosen]
    usable = [e for e in engines if e.available(device).ok]
    if not usable:
        reasons = "; ".join(f"{e.name}: {e.available(device).reason}" for e in engines)
        raise UnsupportedGraphError(
            f"none of the engines {chosen} can run on {device} ({reasons})", rule="engine.unavailable",
            hint="pick engines available on this device, or another device",
        )
    return usable


def engine_configs(
    graph: FinalGraph, *, heur_mode: Any = None, device: Any = None, engines: Sequence[str] | None = None
) -> list[PieceConfigs]:
    dev = resolve_device(device)
    usable = _engines(engines, dev)
    pieces, _ = partition(graph, usable, dev)
    return [rank_configs(p, usable, dev, as_modes(heur_mode)) for p in pieces]


def build_plan(
    graph: FinalGraph,
    *,
    heur_mode: Any = None,
    device: Any = None,
    engines: Sequence[str] | None = None,
    allow_partition: bool = True,
    autotune: bool = False,
    **options: Any,
) -> ExecutionPlan:
    if options:
        raise TypeError(f"build() got unexpected option(s): {', '.join(sorted(options))}")
    dev = resolve_device(device)
    usable = _engines(engines, dev)
    modes = as_modes(heur_mode)
    pieces, cuts = partition(graph, usable, dev, allow_partition=allow_partition)
    steps = []
    for piece in pieces:
        ranked = rank_configs(piece, usable, dev, modes)
        if not ranked.configs:
            reasons = "; ".join(f"{n}: {why}" for n, why in ranked.declined) or "no config in these modes"
            raise UnsupportedGraphError(
                f"no engine config for {piece.label()} in heuristic modes "
                f"{[m.name for m in modes]} ({reasons})", op=piece.nodes[0].label(), rule="engine.no_config",
                hint="add HeurMode.FALLBACK to heur_mode, or allow more engines",
            )
        config = ranked.configs[0]
        kernel = get_engine(config.engine).compile(piece, config, dev)
        steps.append(Step(len(steps), piece, config, kernel, ranked.configs[1:]))
    return ExecutionPlan(graph, dev, tuple(steps), tuple(cuts))


class ExecutionPlan:
    """An ordered list of kernel launches over a variant pack plus a workspace."""

    def __init__(self, graph: FinalGraph, device: Device, steps: tuple[Step, ...], cuts: tuple[Cut, ...]) -> None:
        self.graph = graph
        self.device = device
        self.steps = steps
        self.cuts = cuts
        self.workspace_layout = self._layout()
        self.workspace_size = max((off + n for off, n in self.workspace_layout.values()), default=0)
        self._workspace: Any = None

    def _layout(self) -> dict[int, tuple[int, int]]:
        """Workspace slots (offset, bytes) for virtual tensors that cross pieces."""
        layout: dict[int, tuple[int, int]] = {}
        offset = 0
        for step in self.steps:
            for uid in step.piece.outputs:
                t = self.graph.tensors[uid]
                if t.is_virtual and uid not in layout:
                    layout[uid] = (offset, t.nbytes)
                    offset += -(-t.nbytes // ALIGN) * ALIGN
        return layout

    # -- running -----------------------------------------------------------------------------------
    def execute(self, variant_pack: Mapping[Any, Any], workspace: Any = None, stream: Any = None) -> None:
        """Run the plan. `workspace`: None (the plan allocates and keeps one) or a buffer of at least
        `workspace_size` bytes on the plan's device."""
        buffers = bind(self.graph, self.device, variant_pack)
        buffers.update(self._workspace_views(workspace, buffers))  # checked before any step runs
        for step in self.steps:
            step.kernel.run(buffers, stream)

    def _workspace_views(self, workspace: Any, bound: Mapping[int, Any]) -> dict[int, Any]:
        if workspace is None and not self.workspace_layout:
            return {}
        if workspace is None:
            if self._workspace is None:
                self._workspace = np.empty(self.workspace_size, dtype=np.uint8)
            workspace = self._workspace
        if (not isinstance(workspace, np.ndarray) or workspace.dtype != np.uint8 or workspace.ndim != 1
                or not workspace.flags.c_contiguous):
            raise VariantPackError(
                "the workspace must be a contiguous 1-D uint8 NumPy array on the CPU", rule="pack.workspace",
                hint="pass np.empty(plan.workspace_size, np.uint8), or None to let the plan allocate",
            )
        if workspace.nbytes < self.workspace_size:
            raise VariantPackError(
                f"the workspace has {workspace.nbytes} bytes but the plan needs {self.workspace_size}",
                rule="pack.workspace_size", hint="allocate plan.workspace_size bytes",
            )
        if not workspace.flags.writeable:
            raise VariantPackError("the workspace is read-only", rule="pack.workspace",
                                   hint="pass a writeable np.empty(plan.workspace_size, np.uint8)")
        for uid, buf in bound.items():
            if isinstance(buf, np.ndarray) and arrays_overlap(workspace[:self.workspace_size], buf):
                raise VariantPackError(
                    "the workspace overlaps the buffer bound to this tensor", tensor=self.graph.tensors[uid],
                    rule="pack.workspace_overlap", hint="give the workspace memory of its own",
                )
        views = {}
        for uid, (offset, nbytes) in self.workspace_layout.items():
            t = self.graph.tensors[uid]
            views[uid] = strided_view(workspace[offset:offset + nbytes].view(t.data_type.numpy), t.dim, t.stride)
        return views

    # -- explaining ----------------------------------------------------------------------------------
    def describe(self) -> str:
        g = self.graph
        lines = [
            f"plan for graph '{g.name}' on {self.device}: {len(self.steps)} step(s), "
            f"workspace {self.workspace_size} bytes"
        ]
        for step in self.steps:
            p = step.piece
            lines.append(f"  step {step.index}: {step.config}")
            for n in p.nodes:
                lines.append(f"      {n.render(g.tensors)}")
            ins = ", ".join(f"%{u}" for u in p.inputs)
            outs = ", ".join(f"%{u}" + (" (workspace)" if u in self.workspace_layout else "") for u in p.outputs)
            lines.append(f"      reads {ins or '-'}; writes {outs or '-'}")
            if step.alternatives:
                lines.append("      alternatives: " + "; ".join(str(c) for c in step.alternatives))
        for cut in self.cuts:
            reasons = "; ".join(f"{e}: {why}" for e, why in cut.reasons)
            lines.append(f"  not fused: step {cut.before} | {cut.node.label()}: {reasons}")
        return "\n".join(lines)

    def source(self, step: int) -> str | None:
        if not 0 <= step < len(self.steps):
            raise GraphError(f"the plan has no step {step}", rule="plan.step",
                             hint=f"steps are 0..{len(self.steps) - 1}")
        return self.steps[step].kernel.source()

    def __repr__(self) -> str:
        engines = ", ".join(s.config.engine for s in self.steps)
        return f"<ExecutionPlan '{self.graph.name}' on {self.device}: {len(self.steps)} step(s) [{engines}]>"

    __str__ = describe


__all__ = ["ExecutionPlan", "Step", "build_plan", "engine_configs", "HeurMode"]
