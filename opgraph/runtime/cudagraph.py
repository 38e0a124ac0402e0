"""CUDA graphs of plans: capture once, replay many times, re-point without re-capturing.

`plan.populate_cuda_graph(pack)` returns a `torch.cuda.CUDAGraph` that runs the whole plan on the
pack's buffers (replay it with `graph.replay()`). What a replay reads at run time, and so may change
between replays with no call at all:
- 1-element tensors used as scalars (epsilon, momentum, a learning rate): write the new value into
  the device tensor;
- the contents of every buffer;
- the address of every by-reference tensor (`set_is_by_reference`, or `build(by_reference=True)`):
  `plan.set_address(tensor, buffer)` or a device-side copy into `plan.address_table`.

`plan.update_cuda_graph(graph, new_pack)` checks the new pack against the plan (a VariantPackError
if it does not fit) and re-points the graph: by-reference tensors through the table (no re-capture);
if a tensor that is not by reference moved, or a pass-by-value scalar changed value, those are baked
into the captured launches, so the graph is re-captured, and the update says so (a log message and
the returned `UpdateResult`). Engines whose kernels read addresses from the table (Triton) carry the
behaviour note SUPPORTS_CUDA_GRAPH_NATIVE_API; a by-reference tensor that a step without it reads
(a PyTorch call) moves like any other: re-captured, and set_address refuses it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..core.errors import GraphError
from ..memory.addresses import TABLE_KEY

if TYPE_CHECKING:
    from .plan import ExecutionPlan
    from .state import PlanState
    from .threads import ThreadState

log = logging.getLogger("opgraph.cudagraph")


@dataclass
class Capture:
    """What a captured graph baked in, kept with the graph (the populating thread's
    state.ThreadState.captures is keyed weakly by the graph object, so a record goes when its graph
    does) and without the pack: like any CUDA graph, it reads the buffers it was captured with, which
    the caller keeps alive."""

    direct: dict[int, int]  # uid -> address baked into the launches (tensors not by reference)
    values: dict[int, Any]  # pass-by-value scalars baked into the launches
    workspace: int = 0  # the workspace's address (0: the plan's own)
    recaptures: int = 0


@dataclass(frozen=True)
class UpdateResult:
    recaptured: bool
    reason: str = ""
    moved: tuple[int, ...] = field(default_factory=tuple)


def _require_cuda(plan: ExecutionPlan) -> Any:
    if not plan.device.is_cuda:
        raise GraphError(
            "CUDA graphs need a plan built for a CUDA device", rule="cudagraph.device", hint="build with device='cuda'"
        )
    import torch

    return torch


def _snapshot(state: PlanState, local: ThreadState, pack: Mapping[Any, Any]) -> tuple[dict[int, int], dict[int, Any]]:
    binder = local.binder
    binder.bind(pack)  # raises VariantPackError when the pack does not fit
    direct, values = {}, {}
    baked = state.baked  # by reference, but a step without table reads uses the address
    for uid, value in binder.values.items():
        t = state.graph.tensors[uid]
        if t.is_pass_by_value:
            values[uid] = value
        elif not t.is_by_reference or uid in baked:
            direct[uid] = binder.pointers[uid]
    return direct, values


def _workspace_address(workspace: Any) -> int:
    if workspace is None:
        return 0
    from ..memory.buffers import address_of

    return address_of(workspace)


def _capture(plan: ExecutionPlan, graph: Any, pack: Mapping[Any, Any], workspace: Any) -> None:
    torch = _require_cuda(plan)
    side = torch.cuda.Stream(device=plan.device.index)
    side.wait_stream(torch.cuda.current_stream(plan.device.index))
    with torch.cuda.stream(side):  # warm up: compile every kernel, write the address table
        plan.execute(pack, workspace)
    torch.cuda.current_stream(plan.device.index).wait_stream(side)
    torch.cuda.synchronize(plan.device.index)
    with torch.cuda.graph(graph):
        plan.execute(pack, workspace)


def populate(plan: ExecutionPlan, pack: Mapping[Any, Any], workspace: Any = None) -> Any:
    torch = _require_cuda(plan)
    local = plan.local_state()
    direct, values = _snapshot(plan.state, local, pack)
    graph = torch.cuda.CUDAGraph()
    _capture(plan, graph, pack, workspace)
    local.captures[graph] = Capture(direct, values, _workspace_address(workspace))
    return graph


def update(plan: ExecutionPlan, graph: Any, pack: Mapping[Any, Any], workspace: Any = None) -> UpdateResult:
    _require_cuda(plan)
    local = plan.local_state()
    try:
        record = local.captures.get(graph)
    except TypeError:  # not a weak-referenceable object, so not one of ours
        record = None
    if record is None:
        raise GraphError(
            "this CUDA graph was not populated by this plan in this thread",
            rule="cudagraph.unknown",
            hint="update graphs returned by this plan's populate_cuda_graph, from the thread that "
            "populated them (each thread binds the plan on its own)",
        )
    direct, values = _snapshot(plan.state, local, pack)  # raises VariantPackError when the pack does not fit
    moved = tuple(u for u, a in direct.items() if record.direct.get(u) != a)
    changed = tuple(u for u, v in values.items() if record.values.get(u) != v)
    if _workspace_address(workspace) != record.workspace and plan.workspace_size:
        moved += (TABLE_KEY,)
    if not moved and not changed:
        local.table.update_from(local.binder.pointers)  # by-reference tensors: new addresses, no re-capture
        return UpdateResult(False)
    names = ", ".join(plan.graph.tensors[u].label() for u in (*moved, *changed) if u in plan.graph.tensors)
    reason = (
        f"re-captured: {names or 'the workspace'} "
        "moved or changed and is baked into the launches (declare tensors by reference, and scalars "
        "as 1-element device tensors, to update without re-capture)"
    )
    log.warning("update_cuda_graph %s", reason)
    graph.reset()
    _capture(plan, graph, pack, workspace)
    local.captures[graph] = Capture(direct, values, _workspace_address(workspace), record.recaptures + 1)
    return UpdateResult(True, reason, moved + changed)
