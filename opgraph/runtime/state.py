"""A plan's runtime state, split by who may change it.

`PlanState` (frozen, one per plan) is what the build decided and every execute only reads: the
graph, the device, the steps, the workspace layout, the in-place rule, the address table's slots and
the by-reference tensors some step bakes into its launches, the stream resolver, and, for a plan
loaded from a file, the compiled kernels the file embeds (opgraph.engines.artifacts: the plan's own,
visible only while this plan binds or saves).

`ThreadState` (threads.py; mutable, one per plan and thread that runs it) is what binding changes: the pack
binder, the address table, the workspaces bound (the plan's own, allocated for this thread, and the
last one the caller passed), whether set_address wrote the table, the CUDA graphs populated from it.

Threads: an ExecutionPlan keeps its ThreadStates in a `threading.local`, so one plan may be executed
from several threads at once, each on its own buffers and workspace: nothing one execute writes is
shared with another thread's (the kernels and the PlanState are read-only while running). A thread's
state goes with the thread. The address table, `set_address` and the CUDA-graph calls act on the
calling thread's binding.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from ..build.planner import Step
from ..core.config import BehaviorNote
from ..core.device import Device
from ..core.dtypes import DataType
from ..core.ir import FinalGraph
from ..engines import artifacts, get_engine
from ..memory import workspace as wsp
from ..memory.addresses import table_slots
from .aliasing import InplaceRule, plan_inplace
from .streams import StreamResolver


class ThreadCount:
    """How many threads have bound a plan (threads.ThreadState registers itself): the one mutable
    fact of a PlanState. A plan run by several threads is never captured by autograph (PyTorch's
    CUDA generator is one per process: another thread's random numbers during a capture break it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0

    def join(self) -> None:
        with self._lock:
            self.count += 1

    @property
    def shared(self) -> bool:
        return self.count > 1


@dataclass(frozen=True)
class PlanState:
    """What every execute of a plan reads and nothing changes after the build (or the load)."""

    graph: FinalGraph
    device: Device
    steps: tuple[Step, ...]
    layout: wsp.WorkspaceLayout
    inplace: InplaceRule
    slots: Mapping[int, tuple[int, DataType]]  # by-reference uid -> (address table slot, type)
    baked: Mapping[int, Step]  # by-reference uid -> the first step that bakes its address anyway
    streams: StreamResolver
    kernels: artifacts.Scope = field(default_factory=artifacts.Scope)  # a loaded plan's embedded kernels
    threads: ThreadCount = field(default_factory=ThreadCount, compare=False)

    @property
    def workspace_size(self) -> int:
        return self.layout.size


def plan_state(
    graph: FinalGraph, device: Device, steps: tuple[Step, ...], kernels: artifacts.Scope | None = None
) -> PlanState:
    """The PlanState of steps the planner (or a plan file) gave: the workspace layout, the in-place
    rule and the table's slots, each decided once here."""
    layout = wsp.plan_layout(
        graph, [s.piece.outputs for s in steps], [getattr(s.kernel, "scratch_bytes", 0) for s in steps]
    )
    # which outputs may be bound to the very buffer of an input (runtime.aliasing)
    inplace = plan_inplace(
        graph,
        [s.piece.nodes for s in steps],
        [get_engine(s.config.engine).inplace_safe(s.config) for s in steps],
        [str(s.config.engine) for s in steps],
    )
    return PlanState(
        graph,
        device,
        steps,
        layout,
        inplace,
        MappingProxyType(table_slots(graph)),
        MappingProxyType(_baked(graph, device, steps)),
        StreamResolver(device),
        kernels if kernels is not None else artifacts.Scope(),
    )


def _baked(graph: FinalGraph, device: Device, steps: tuple[Step, ...]) -> dict[int, Step]:
    """By-reference tensors whose address some step bakes into its launches anyway (a step whose
    config lacks SUPPORTS_CUDA_GRAPH_NATIVE_API: PyTorch calls, the library engine's cuDNN part),
    each with the first such step."""
    out: dict[int, Step] = {}
    if not device.is_cuda:  # no capture; interpreted kernels read the table
        return out
    for step in steps:
        if BehaviorNote.SUPPORTS_CUDA_GRAPH_NATIVE_API not in step.config.behavior_notes:
            for uid in (*step.piece.inputs, *step.piece.outputs):
                if graph.tensors[uid].is_by_reference:
                    out.setdefault(uid, step)
    return out


__all__ = ["PlanState", "plan_state"]
