"""Execution plans: the pieces of a graph, the kernel chosen for each, and the workspace that holds
tensors crossing pieces. `execute` binds a variant pack and runs the steps in order."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from . import workspace as wsp
from .autotune import TuningCache, tune
from .addresses import AddressTable
from .aliasing import plan_inplace
from .bindings import FastBinder, bind
from .device import Device, resolve_device
from .engines import get_engine
from .engines.base import BehaviorNote, Engine, EngineConfig, Kernel
from .errors import ExecutionError, GraphError, UnsupportedGraphError
from .filters import OPTIONS as FILTER_OPTIONS, ConfigFilter
from .heuristics import HeurMode, PieceConfigs, as_modes, rank_configs
from .ir import FinalGraph
from .partition import Cut, Piece, partition

if TYPE_CHECKING:
    from .cudagraph import Capture


@dataclass(frozen=True)
class Step:
    index: int
    piece: Piece
    config: EngineConfig
    kernel: Kernel = field(compare=False, repr=False)
    alternatives: tuple[EngineConfig, ...] = ()


@dataclass(frozen=True)
class StepTime:
    """One step's share of an execute (ExecutionPlan.profile_steps)."""

    step: int
    engine: str
    template: str
    ops: int
    device_us: float
    host_us: float

    def __str__(self) -> str:
        what = self.engine + (f":{self.template}" if self.template else "")
        return f"step {self.step:4d} {what:24s} {self.ops:3d} ops  device {self.device_us:9.1f} us  host {self.host_us:7.1f} us"


log = logging.getLogger("opgraph.build")


def _on_stream(stream: Any, device: Device) -> Any:
    """A context that makes `stream` current (torch), or does nothing."""
    if stream is None or not device.is_cuda:
        return contextlib.nullcontext()
    import torch

    if isinstance(stream, int):
        stream = torch.cuda.ExternalStream(stream, device=f"cuda:{device.index}")
    return torch.cuda.stream(stream)


def default_engines(device: Device) -> list[str]:
    """In order of preference: generated kernels, then a library conv/matmul with generated kernels
    around it, then a cuDNN frontend graph (where nvidia-cudnn-frontend is installed), then op-by-op
    PyTorch (which runs any op) on CUDA; the reference engine on the CPU. Engines that are not
    available on the device are left out of the build."""
    return ["reference"] if not device.is_cuda else ["triton", "library", "cudnn", "torch"]


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


def _hashable(key: Any) -> bool:
    try:
        hash(key)
    except TypeError:
        return False
    return True


def _all_by_reference(graph: FinalGraph) -> FinalGraph:
    """The graph with every bound (non-virtual, not pass-by-value) tensor by reference."""
    tensors = {u: (dataclasses.replace(t, is_by_reference=True) if not t.is_virtual and not t.is_pass_by_value else t)
               for u, t in graph.tensors.items()}
    return dataclasses.replace(graph, tensors=tensors)


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
    by_reference = options.pop("by_reference", False)
    filters = ConfigFilter.from_options({k: options.pop(k) for k in FILTER_OPTIONS if k in options})
    if options:
        raise TypeError(f"build() got unexpected option(s): {', '.join(sorted(options))}")
    if by_reference:
        graph = _all_by_reference(graph)
    dev = resolve_device(device)
    if autotune and dev.is_cuda:
        import torch

        if torch.cuda.is_current_stream_capturing():
            raise GraphError(
                "build(autotune=True) was called while a CUDA graph is being captured: timing candidates "
                "synchronises the device, which breaks the capture", rule="autotune.capturing",
                hint="build (and tune) before capturing; the cache makes later builds time nothing",
            )
    usable = _engines(engines, dev)
    modes = as_modes(heur_mode)
    pieces, cuts = partition(graph, usable, dev, allow_partition=allow_partition)
    log.info("partition '%s' for %s with engines %s: %d piece(s)", graph.name, dev, [e.name for e in usable],
             len(pieces))
    for cut in cuts:
        log.info("  not fused before %s: %s", cut.node.label(), "; ".join(f"{e}: {w}" for e, w in cut.reasons))
    cache = TuningCache() if autotune else None
    steps = []
    for piece in pieces:
        ranked = rank_configs(piece, usable, dev, modes)
        configs, dropped = filters.keep(ranked.configs)
        if not configs:
            reasons = "; ".join([*(f"{n}: {why}" for n, why in ranked.declined),
                                 *(f"{c} filtered out: {why}" for c, why in dropped)]) or "no config in these modes"
            raise UnsupportedGraphError(
                f"no engine config for {piece.label()} in heuristic modes "
                f"{[m.name for m in modes]} ({reasons})", op=piece.nodes[0].label(), rule="engine.no_config",
                hint="add HeurMode.FALLBACK to heur_mode, allow more engines, or relax the build's note, "
                     "engine and workspace filters" if dropped else
                     "add HeurMode.FALLBACK to heur_mode, or allow more engines",
            )
        if autotune:
            candidates, _ = filters.keep(rank_configs(piece, usable, dev, (*modes, HeurMode.B)).configs)
            config, kernel, others, _ = tune(piece, candidates, dev, [e.name for e in usable], cache, filters)
            steps.append(Step(len(steps), piece, config, kernel, others))
            continue
        for name, why in ranked.declined:
            log.info("  %s: %s declined: %s", piece.label(), name, why)
        for config, why in dropped:
            log.info("  %s: %s filtered out: %s", piece.label(), config, why)
        config, kernel = _first_within_workspace(piece, configs, dev, filters)
        steps.append(Step(len(steps), piece, config, kernel, tuple(c for c in configs if c is not config)))
    return ExecutionPlan(graph, dev, tuple(steps), tuple(cuts))


def _first_within_workspace(piece: Piece, configs: Sequence[EngineConfig], dev: Device,
                            filters: ConfigFilter) -> tuple[EngineConfig, Kernel]:
    """The first config (in rank order) that compiles and whose kernel's workspace passes the build's
    limit, compiled. A config that fails to compile (a library plan its own support check accepted,
    then could not build) gives way to the next one; if all fail, the first failure is raised."""
    too_big = []
    failed: list[GraphError] = []
    for config in configs:
        t0 = time.perf_counter()
        try:
            kernel = get_engine(config.engine).compile(piece, config, dev)
        except ExecutionError as err:
            log.info("  %s: %s failed to compile, trying the next config: %s", piece.label(), config, err)
            failed.append(err)
            continue
        why = filters.rejects_kernel(kernel)
        if why is None:
            log.info("  %s -> %s (%d candidate configs; compiled in %.1f ms)", piece.label(), config,
                     len(configs), (time.perf_counter() - t0) * 1e3)
            return config, kernel
        log.info("  %s: %s filtered out: %s", piece.label(), config, why)
        too_big.append(f"{config}: {why}")
    if failed and not too_big:
        raise failed[0]
    raise UnsupportedGraphError(
        f"every engine config of {piece.label()} needs more workspace than the build allows "
        f"({'; '.join(too_big)})", op=piece.nodes[0].label(), rule="engine.workspace_limit",
        hint="raise deselect_workspace_greater_than, or add HeurMode.B / FALLBACK for more candidates")


class ExecutionPlan:
    """An ordered list of kernel launches over a variant pack plus a workspace."""

    def __init__(self, graph: FinalGraph, device: Device, steps: tuple[Step, ...], cuts: tuple[Cut, ...]) -> None:
        self.graph = graph
        self.device = device
        self.steps = steps
        self.cuts = cuts
        self.layout = wsp.plan_layout(
            graph, [s.piece.outputs for s in steps], [getattr(s.kernel, "scratch_bytes", 0) for s in steps]
        )
        self.workspace_size = self.layout.size
        self._owned: Any = None  # the workspace the plan allocated, and its views
        self._owned_views: dict[int, Any] = {}
        # which outputs may be bound to the very buffer of an input (opgraph.aliasing), decided once here
        self.inplace = plan_inplace(graph, [s.piece.nodes for s in steps],
                                    [get_engine(s.config.engine).inplace_safe(s.config) for s in steps],
                                    [str(s.config.engine) for s in steps])
        self._fast = FastBinder(graph, device, self.inplace) if device.is_cuda else None
        self._table = AddressTable(graph, device)
        self._captures: dict[int, Capture] = {}

    @property
    def workspace_layout(self) -> Mapping[int, tuple[int, int]]:
        """Workspace slots (offset, bytes) of the virtual tensors that cross pieces."""
        return self.layout.tensors

    # -- running -----------------------------------------------------------------------------------
    def execute(self, variant_pack: Mapping[Any, Any], workspace: Any = None, stream: Any = None) -> None:
        """Run the plan. `workspace`: None (the plan allocates and keeps one) or a buffer of at least
        `workspace_size` bytes on the plan's device. `stream`: a torch.cuda.Stream (or a raw
        cudaStream_t as an int) to run on; default the current stream."""
        buffers, base = self._prepare(variant_pack, workspace)
        if stream is None:
            for step in self.steps:
                step.kernel.run(buffers, None, wsp.scratch_view(base, self.layout, step.index))
            return
        with _on_stream(stream, self.device):
            for step in self.steps:
                step.kernel.run(buffers, stream, wsp.scratch_view(base, self.layout, step.index))

    def profile(self, variant_pack: Mapping[Any, Any], repeat: int = 20) -> list[tuple[str, int, float]]:
        """(kernel, launches per execute, mean device µs per launch) for every GPU kernel the plan runs,
        from PyTorch's profiler over `repeat` executes; on the CPU, (step, 1, µs) per step."""
        from .timing import time_call

        if not self.device.is_cuda:
            buffers = bind(self.graph, self.device, variant_pack, self.inplace)
            base, views = self._workspace(None, buffers)
            buffers.update(views)
            return [(f"step {s.index} ({s.config.engine})", 1,
                     time_call(lambda s=s: s.kernel.run(buffers, None, wsp.scratch_view(base, self.layout, s.index)),
                               cuda=False, warmup=1, repeat=3)) for s in self.steps]
        import torch
        from torch.profiler import ProfilerActivity, profile

        self.execute(variant_pack)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(repeat):
                self.execute(variant_pack)
            torch.cuda.synchronize()
        rows = []
        for ev in prof.key_averages():
            total = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
            if ev.count and total:
                rows.append((ev.key, round(ev.count / repeat), total / ev.count))
        return sorted(rows, key=lambda r: -r[1] * r[2])

    def profile_steps(self, variant_pack: Mapping[Any, Any], repeat: int = 10) -> list[StepTime]:
        """Per step: device µs (median over `repeat`, the device idle before the step starts, so
        that no launch gap of the steps before counts) and host µs to enqueue it. Where the whole
        plan's time goes, step by step; `describe()` says what each step is."""
        from .timing import step_times

        buffers, base = self._prepare(variant_pack, None)
        runs = [lambda s=s: s.kernel.run(buffers, None, wsp.scratch_view(base, self.layout, s.index))
                for s in self.steps]
        return [StepTime(s.index, s.config.engine, str(s.config.knob("template", "")), len(s.piece.nodes), d, h)
                for s, (d, h) in zip(self.steps, step_times(runs, cuda=self.device.is_cuda, repeat=repeat))]

    def _prepare(self, variant_pack: Mapping[Any, Any], workspace: Any) -> tuple[dict[int, Any], Any]:
        """The checked buffers (workspace views and the address table included) and the workspace base:
        everything the steps need, checked before any step runs."""
        buffers = self._bind(variant_pack)
        base, views = self._workspace(workspace, buffers)
        if views:
            buffers.update(views)
        if self._table:
            self._table.update(buffers)
        return buffers, base

    def _bind(self, variant_pack: Mapping[Any, Any]) -> dict[int, Any]:
        """The checked pack: the fast path for packs like the last ones, else the full check."""
        buffers = self._fast.bind(variant_pack) if self._fast is not None else None
        if buffers is None:
            buffers = bind(self.graph, self.device, variant_pack, self.inplace)
            if self._fast is not None:
                self._fast.learn(variant_pack)
        return buffers

    def _workspace(self, user: Any, bound: Mapping[int, Any]) -> tuple[Any, dict[int, Any]]:
        if user is not None:
            base = wsp.check(user, self.workspace_size, self.device, self.graph, bound)
            return base, wsp.tensor_views(base, self.layout, self.graph)
        if self.workspace_size == 0:
            return None, {}
        if self._owned is None:
            self._owned = wsp.allocate(self.workspace_size, self.device)
            self._owned_views = wsp.tensor_views(self._owned, self.layout, self.graph)
        return self._owned, self._owned_views

    # -- CUDA graphs and by-reference tensors (see opgraph.cudagraph) ----------------------------
    def populate_cuda_graph(self, variant_pack: Mapping[Any, Any], workspace: Any = None) -> Any:
        """A torch.cuda.CUDAGraph running the whole plan on these buffers; replay with .replay()."""
        from .cudagraph import populate

        return populate(self, variant_pack, workspace)

    def update_cuda_graph(self, graph: Any, variant_pack: Mapping[Any, Any], workspace: Any = None) -> Any:
        """Re-point a graph from populate_cuda_graph at new buffers: by-reference tensors through the
        address table, others by re-capture (the returned UpdateResult says which)."""
        from .cudagraph import update

        return update(self, graph, variant_pack, workspace)

    @property
    def address_table(self) -> Any:
        """The int64 device tensor of by-reference addresses (None without by-reference tensors).
        Writing into it (e.g. a device-side copy captured in a graph) redirects later launches."""
        self._table.exposed = True
        return self._table.tensor

    def table_slot(self, tensor: Any) -> int:
        from .bindings import resolve_key

        uid = resolve_key(self.graph, tensor)
        if uid not in self._table.slots:
            raise GraphError(f"{self.graph.tensors[uid].label()} is not by reference", rule="plan.not_by_reference",
                             hint="declare it with is_by_reference=True (or build(by_reference=True))")
        return self._table.slots[uid][0]

    def baked_addresses(self) -> dict[int, Step]:
        """By-reference tensors whose address some step bakes into its launches anyway (a step whose
        config lacks SUPPORTS_CUDA_GRAPH_NATIVE_API: PyTorch calls, the library engine's cuDNN part),
        each with the first such step: a captured graph must be re-captured when they move."""
        out: dict[int, Step] = {}
        if not self.device.is_cuda:  # no capture; interpreted kernels read the table
            return out
        for step in self.steps:
            if BehaviorNote.SUPPORTS_CUDA_GRAPH_NATIVE_API not in step.config.behavior_notes:
                for uid in (*step.piece.inputs, *step.piece.outputs):
                    if self.graph.tensors[uid].is_by_reference:
                        out.setdefault(uid, step)
        return out

    def set_address(self, tensor: Any, buffer: Any) -> None:
        """Point a by-reference tensor at another buffer (checked like a variant-pack entry); ordered on
        the current stream, so a captured graph replayed afterwards reads the new buffer."""
        from .bindings import resolve_key
        from .buffers import buffer_info
        from .bindings import _check_buffer

        uid = self._fast.keys.get(tensor) if self._fast is not None and _hashable(tensor) else None
        if uid is None:
            uid = resolve_key(self.graph, tensor)
        baked = self.baked_addresses().get(uid)
        if baked is not None:
            raise GraphError(
                f"{self.graph.tensors[uid].label()} is by reference, but step {baked.index} "
                f"({baked.config.engine}) bakes its address into its launches: set_address cannot redirect it",
                rule="cudagraph.baked_address",
                hint="use update_cuda_graph (it re-captures), or build with "
                     "select_behavior_notes=['supports_cuda_graph_native_api'] so every step reads the table")
        slot = self.table_slot(uid)
        fast = self._fast.bind_one(uid, buffer) if self._fast is not None else False
        if not fast:
            _check_buffer(buffer_info(buffer), self.graph.tensors[uid], self.device)
        addresses = list(self._table.current)
        addresses[slot] = buffer.data_ptr() if hasattr(buffer, "data_ptr") else buffer.__array_interface__["data"][0]
        self._table.write(addresses, force=True)

    # -- saving and loading ----------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        """The plan as bytes (versioned JSON: graph, pieces, engine configs, environment)."""
        from .plan_io import plan_to_bytes

        return plan_to_bytes(self)

    @classmethod
    def from_bytes(cls, data: bytes, *, device: Any = None, on_mismatch: str = "error") -> ExecutionPlan:
        """A plan from `to_bytes` output: compiled from the stored configs, without partitioning,
        heuristics or tuning. See opgraph.plan_io for `on_mismatch`."""
        from .plan_io import plan_from_bytes

        return plan_from_bytes(data, device=device, on_mismatch=on_mismatch)

    def save(self, path: Any) -> None:
        from pathlib import Path

        Path(path).write_bytes(self.to_bytes())

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


__all__ = ["ExecutionPlan", "Step", "build_plan", "engine_configs", "load_plan", "HeurMode"]


def load_plan(path: Any, *, device: Any = None, on_mismatch: str = "error") -> ExecutionPlan:
    """Load a plan saved with ExecutionPlan.save."""
    from pathlib import Path

    from .errors import SerializationError

    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise SerializationError(f"cannot read the plan file: {err}", rule="plan.io") from None
    return ExecutionPlan.from_bytes(data, device=device, on_mismatch=on_mismatch)
