"""Execution plans: the pieces of a graph, the kernel chosen for each, and the workspace that holds
tensors crossing pieces. `execute` binds a variant pack and runs the steps in order: the first bind of
a workspace prepares every step's launch (opgraph.runtime.bound), later executes rewrite only what
moved and launch."""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..build.options import BuildOptions
from ..build.partition import Cut
from ..build.planner import Schedule, Step, engine_configs, plan_steps
from ..core.device import Device
from ..core.errors import GraphError, printable
from ..core.gc_pause import gc_paused
from ..core.ir import FinalGraph
from ..engines import artifacts
from .autograph import default as autograph_default
from .bound import BoundPlan
from .state import plan_state
from .threads import ThreadState


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


def build_plan(graph: FinalGraph, options: BuildOptions | None = None, **keywords: Any) -> ExecutionPlan:
    """Plan `graph` (opgraph.build.planner.plan_steps: partition, configs, tuning, compilation) and wrap the
    steps in an ExecutionPlan. `Graph.build` calls this with its BuildOptions. A graph with dynamic dims
    gets a DynamicPlan (opgraph.runtime.dynamic): one plan for every shape in the dims' ranges."""
    with gc_paused():
        if graph.is_dynamic:
            from .dynamic import DynamicPlan

            return DynamicPlan(graph, BuildOptions.of(options, **keywords))
        return ExecutionPlan.from_schedule(plan_steps(graph, options, **keywords))


class ExecutionPlan:
    """An ordered list of kernel launches over a variant pack plus a workspace.

    One plan may be executed from several threads at once, each on its own buffers and workspace
    (opgraph.runtime.state: every thread binds its own pack, address table and workspaces)."""

    def __init__(
        self,
        graph: FinalGraph,
        device: Device,
        steps: tuple[Step, ...],
        cuts: Sequence[Cut],
        stats: Mapping[str, Any] | None = None,
        kernels: artifacts.Scope | None = None,
    ) -> None:
        self.state = state = plan_state(graph, device, steps, kernels)
        self.graph = graph
        self.build_stats = dict(stats or {})  # where the build's (or the load's) time went
        self.device = device
        self.steps = steps
        self.cuts = cuts
        self.layout = state.layout
        self.workspace_size = state.layout.size
        self.inplace = state.inplace  # which outputs may be bound to the very buffer of an input
        self._threads = threading.local()  # .state: this thread's ThreadState
        # replay an internal CUDA graph of the launches while the binding is unchanged (runtime.autograph;
        # on unless OPGRAPH_AUTOGRAPH=0; set it on a plan to choose)
        self.auto_graph = autograph_default()

    @classmethod
    def from_schedule(cls, schedule: Schedule) -> ExecutionPlan:
        return cls(schedule.graph, schedule.device, schedule.steps, schedule.cuts, schedule.stats)

    @property
    def workspace_layout(self) -> Mapping[int, tuple[int, int]]:
        """Workspace slots (offset, bytes) of the virtual tensors that cross pieces."""
        return self.layout.tensors

    def local_state(self) -> ThreadState:
        """The calling thread's binding of this plan (made at its first use in the thread)."""
        try:
            return self._threads.state
        except AttributeError:
            local = self._threads.state = ThreadState(self.state)
            return local

    def reserve(self) -> None:
        """Make the calling thread's state (its address table) and allocate its own workspace now, as its
        first execute would (the binding itself waits for a pack): for callers whose first execute runs
        where allocations are watched (the warmup of PyTorch's CUDA graph trees, whose memory pool must
        end up holding outputs only)."""
        self.local_state().reserve()

    def release(self) -> None:
        """Drop the calling thread's references to the buffers of its last execute (the binding's),
        keeping its workspace and address table: the next execute binds afresh. For callers whose
        buffers must not outlive the call, as a compiled graph's intermediates under PyTorch's CUDA
        graph trees (every allocation left in their pool after a recorded call must be an output)."""
        self.local_state().release()

    # -- running -----------------------------------------------------------------------------------
    def execute(self, variant_pack: Mapping[Any, Any], workspace: Any = None, stream: Any = None) -> None:
        """Run the plan. `workspace`: None (the plan allocates and keeps one per thread) or a buffer of
        at least `workspace_size` bytes on the plan's device. `stream`: None (PyTorch's current
        stream), a torch.cuda.Stream, an object with `__cuda_stream__`, or a raw cudaStream_t as an int
        (opgraph.runtime.streams). Threads may execute one plan at once, each on its own buffers and
        workspace."""
        handle, torch_stream = self.state.streams(stream)
        if torch_stream is None:
            self._execute(variant_pack, workspace, handle)
            return
        import torch

        with torch.cuda.stream(torch_stream):  # the table's writes, PyTorch's steps and graph replays too
            self._execute(variant_pack, workspace, handle)

    def _execute(self, variant_pack: Mapping[Any, Any], workspace: Any, handle: int) -> None:
        try:
            local = self._threads.state
        except AttributeError:
            local = self.local_state()
        bound = local.prepare(variant_pack, workspace)
        bound.binding.stream.set(handle)
        if not bound.autograph.run(self.auto_graph):
            bound.run()

    def bind(self, variant_pack: Mapping[Any, Any], workspace: Any = None) -> BoundPlan:
        """The plan bound to the pack and the workspace in this thread, checked, without running it:
        what the next execute with them launches (bound.BoundPlan: its launchers and calls)."""
        return self.local_state().prepare(variant_pack, workspace)

    def profile(self, variant_pack: Mapping[Any, Any], repeat: int = 20) -> list[tuple[str, int, float]]:
        """(kernel, launches per execute, mean device µs per launch) for every GPU kernel the plan runs,
        from PyTorch's profiler over `repeat` executes; on the CPU, (step, 1, µs) per step."""
        from ..core.timing import time_call

        if not self.device.is_cuda:
            bound = self.bind(variant_pack)

            def run_step(i: int) -> None:
                _run_calls(bound.step_calls(i))

            return [
                (
                    f"step {s.index} ({s.config.engine})",
                    1,
                    time_call(functools.partial(run_step, i), cuda=False, warmup=1, repeat=3),
                )
                for i, s in enumerate(self.steps)
            ]
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
        from ..core.timing import step_times

        handle, _ = self.state.streams(None)
        bound = self.bind(variant_pack)
        bound.binding.stream.set(handle)
        runs = [lambda i=i: _run_calls(bound.preludes + bound.step_calls(i)) for i in range(len(self.steps))]
        return [
            StepTime(s.index, s.config.engine, str(s.config.knob("template", "")), len(s.piece.nodes), d, h)
            for s, (d, h) in zip(self.steps, step_times(runs, cuda=self.device.is_cuda, repeat=repeat))
        ]

    # -- CUDA graphs and by-reference tensors (see opgraph.runtime.cudagraph) ----------------------------
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
        """The int64 device tensor of by-reference addresses (None without by-reference tensors), this
        thread's. Writing into it (e.g. a device-side copy captured in a graph) redirects later launches."""
        table = self.local_state().table
        table.exposed = True
        return table.tensor

    def table_slot(self, tensor: Any) -> int:
        from .bindings import resolve_key

        uid = resolve_key(self.graph, tensor)
        if uid not in self.state.slots:
            raise GraphError(
                f"{self.graph.tensors[uid].label()} is not by reference",
                rule="plan.not_by_reference",
                hint="declare it with is_by_reference=True (or build(by_reference=True))",
            )
        return self.state.slots[uid][0]

    def baked_addresses(self) -> dict[int, Step]:
        """By-reference tensors whose address some step bakes into its launches anyway (a step whose
        config lacks SUPPORTS_CUDA_GRAPH_NATIVE_API: PyTorch calls, the library engine's cuDNN part),
        each with the first such step: a captured graph must be re-captured when they move."""
        return dict(self.state.baked)

    def set_address(self, tensor: Any, buffer: Any) -> None:
        """Point a by-reference tensor at another buffer (checked like a variant-pack entry) for this
        thread's executes; ordered on the current stream, so a captured graph replayed afterwards reads
        the new buffer."""
        from ..memory.buffers import address_of

        local = self.local_state()
        uid = local.binder.uid_of(tensor)
        baked = self.state.baked.get(uid)
        if baked is not None:
            raise GraphError(
                f"{self.graph.tensors[uid].label()} is by reference, but step {baked.index} "
                f"({baked.config.engine}) bakes its address into its launches: set_address cannot redirect it",
                rule="cudagraph.baked_address",
                hint="use update_cuda_graph (it re-captures), or build with "
                "select_behavior_notes=['supports_cuda_graph_native_api'] so every step reads the table",
            )
        slot = self.table_slot(uid)
        local.binder.check_one(uid, buffer)
        addresses = list(local.table.current)
        addresses[slot] = address_of(buffer)
        local.table.write(addresses, force=True)
        local.table_stale = True  # the next execute points it back at its pack's buffer

    # -- saving and loading ----------------------------------------------------------------------
    def to_bytes(self, embed_kernels: bool = True) -> bytes:
        """The plan as bytes (a checksummed header and JSON: graph, pieces, engine configs, environment,
        and the compiled kernels unless `embed_kernels` is False)."""
        from .plan_io import plan_to_bytes

        return plan_to_bytes(self, embed_kernels)

    @classmethod
    def from_bytes(cls, data: bytes, *, device: Any = None, on_mismatch: str = "error") -> ExecutionPlan:
        """A plan from `to_bytes` output: compiled from the stored configs, without partitioning,
        heuristics or tuning. See opgraph.runtime.plan_io for `on_mismatch`."""
        from .plan_io import plan_from_bytes

        return plan_from_bytes(data, device=device, on_mismatch=on_mismatch)

    def save(self, path: Any, embed_kernels: bool = True) -> None:
        """Write the plan file (opgraph.runtime.plan_io); with the compiled kernels embedded, loading it
        on a matching device and versions compiles nothing."""
        from pathlib import Path

        Path(path).write_bytes(self.to_bytes(embed_kernels))

    # -- explaining ----------------------------------------------------------------------------------
    def describe(self) -> str:
        g = self.graph
        lines = [
            f"plan for graph '{printable(g.name)}' on {self.device}: {len(self.steps)} step(s), "
            f"workspace {self.workspace_size} bytes"
        ]
        for step in self.steps:
            p = step.piece
            lines.append(f"  step {step.index}: {step.config}")
            detail = step.kernel.detail()
            if detail:
                lines.append(f"      {detail}")
            for n in p.nodes:
                lines.append(f"      {n.render(g.tensors)}")
            ins = ", ".join(f"%{u}" for u in p.inputs)
            outs = ", ".join(f"%{u}" + (" (workspace)" if u in self.workspace_layout else "") for u in p.outputs)
            lines.append(f"      reads {ins or '-'}; writes {outs or '-'}")
            if step.alternatives:
                lines.append("      alternatives: " + "; ".join(str(c) for c in step.alternatives))
            if step.note:
                lines.append(f"      note: {step.note}")
        for cut in self.cuts:
            reasons = "; ".join(f"{e}: {why}" for e, why in cut.reasons)
            lines.append(f"  not fused: step {cut.before} | {cut.node.label()}: {reasons}")
        return "\n".join(lines)

    def source(self, step: int) -> str | None:
        if not 0 <= step < len(self.steps):
            raise GraphError(
                f"the plan has no step {step}", rule="plan.step", hint=f"steps are 0..{len(self.steps) - 1}"
            )
        return self.steps[step].kernel.source()

    def __repr__(self) -> str:
        engines = ", ".join(s.config.engine for s in self.steps)
        return f"<ExecutionPlan '{self.graph.name}' on {self.device}: {len(self.steps)} step(s) [{engines}]>"

    __str__ = describe


__all__ = ["ExecutionPlan", "Step", "StepTime", "build_plan", "engine_configs", "load_plan"]


def _run_calls(calls: list[Any]) -> None:
    for fn, args in calls:
        fn(*args)


def load_plan(path: Any, *, device: Any = None, on_mismatch: str = "error") -> ExecutionPlan:
    """Load a plan saved with ExecutionPlan.save."""
    from pathlib import Path

    from ..core.errors import SerializationError

    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise SerializationError(f"cannot read the plan file: {err}", rule="plan.io") from None
    return ExecutionPlan.from_bytes(data, device=device, on_mismatch=on_mismatch)
