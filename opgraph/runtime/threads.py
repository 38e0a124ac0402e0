"""One thread's binding of a plan (the mutable half of a plan's runtime state; the frozen half is
state.PlanState): the pack binder, the address table, the workspaces bound (the plan's own, allocated
for this thread, and the last one the caller passed), whether set_address wrote the table, the CUDA
graphs populated from it. An ExecutionPlan keeps one per thread that runs it (a threading.local), so
threads running one plan at once never share what an execute writes.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

from ..memory import workspace as wsp
from ..memory.addresses import AddressTable
from ..memory.buffers import address_of
from .bindings import PackBinder
from .bound import BoundPlan
from .state import PlanState


class ThreadState:
    """One thread's binding of a plan: its binder, address table and bound workspaces."""

    def __init__(self, state: PlanState) -> None:
        self.state = state
        state.threads.join()
        self.binder = PackBinder(state.graph, state.device, state.inplace)
        self.table = AddressTable(state.graph, state.device)
        self.table_stale = False  # set_address wrote the table: the next execute rewrites it
        self.owned: BoundPlan | None = None  # bound to the workspace the plan allocated for this thread
        self.reserved: tuple[Any, Mapping[int, Any]] | None = None  # that workspace, allocated before binding
        self.user: BoundPlan | None = None  # bound to the last workspace the caller passed
        self.reserved_launch_memory: dict[tuple[int, int], Any] | None = None  # Kernel.global_scratch_bytes
        # CUDAGraph -> cudagraph.Capture, dropped with the graph
        self.captures: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()

    def prepare(self, variant_pack: Mapping[Any, Any], workspace: Any) -> BoundPlan:
        """The plan bound to the pack and the workspace: everything the steps need, checked before
        any step runs. The prelude of execute, profile and profile_steps alike."""
        self.binder.bind(variant_pack)
        bound = self.bound(workspace)
        stale, self.table_stale = self.table_stale, False
        bound.sync(self.binder, force_table=stale)
        return bound

    def reserve(self) -> None:
        """Allocate this thread's own workspace and its launches' own memory now, as the first execute
        without a workspace would."""
        state = self.state
        if self.reserved is None and self.owned is None:
            base = wsp.allocate(state.workspace_size, state.device) if state.workspace_size else None
            self.reserved = (base, wsp.tensor_views(base, state.layout, state.graph) if base is not None else {})
        self._reserve_launch_memory()

    def release(self) -> None:
        """Forget the bound buffers: a fresh binder, the bound plans dropped, their workspace kept."""
        state = self.state
        self.binder = PackBinder(state.graph, state.device, state.inplace)
        if self.owned is not None:
            base = self.owned.base
            views = wsp.tensor_views(base, state.layout, state.graph) if base is not None else {}
            self.reserved, self.owned = (base, views), None
        self.user = None

    def _reserve_launch_memory(self) -> dict[tuple[int, int], Any]:
        if self.reserved_launch_memory is None:
            made: dict[tuple[int, int], Any] = {}
            # (a compiled launch's needs are read from its binary: a loaded plan's, from the plan file)
            with self.state.kernels.visible():
                for step in self.state.steps:
                    for launch, nbytes in step.kernel.global_scratch_bytes().items():
                        made[(id(step.kernel), launch)] = wsp.allocate(nbytes, self.state.device)
            self.reserved_launch_memory = made
        return self.reserved_launch_memory

    def bound(self, user: Any) -> BoundPlan:
        state = self.state
        if user is None:
            if self.owned is None:
                self.reserve()
                assert self.reserved is not None
                (base, views), self.reserved = self.reserved, None
                self.owned = self._bind(base, views, None)
            return self.owned
        last = self.user
        if last is not None and last.workspace is user and address_of(user) == last.ws_ptr:
            return last
        base = wsp.check(user, state.workspace_size, state.device, state.graph, self.binder.values)
        self.user = self._bind(base, wsp.tensor_views(base, state.layout, state.graph), user)
        return self.user

    def _bind(self, base: Any, views: Mapping[int, Any], user: Any) -> BoundPlan:
        reserved = self._reserve_launch_memory()
        with self.state.kernels.visible():  # a loaded plan's kernels, for this plan's launchers only
            return BoundPlan(self.state, self.binder, self.table, base, views, workspace=user, reserved=reserved)


__all__ = ["ThreadState"]
