"""A plan bound to a workspace: bind once, launch flat.

Design. A repeated `plan.execute(pack)` should do only what must change per call: read the user's
pointers (once per tensor), write the ones that moved into prepared argument slots, launch. So the
work is split three ways:
- at build: each kernel's code and launch geometry (grids, argument layouts), its compiled binary
  (compiled in parallel, opgraph.build.compile);
- at the first bind of a workspace (`BoundPlan`): the workspace's tensor and scratch views, every
  kernel's `Launcher` (engines.base.Kernel.bind), with its argument slots filled, the address table's
  address, the stream slot; the flat list of `calls` an execute makes;
- per execute: the stream (one resolution, streams.py), the pack (bindings.PackBinder: the same pack
  again is an identity check and one data_ptr() per tensor), `sync` (only when an address or a scalar
  changed: those slots rewritten, the address table written), then the calls, in order; or, once the
  binding has been stable for a few executes, one replay of a CUDA graph of those calls
  (autograph.py).

Generated kernels launch natively from prebuilt argument tuples (engines/triton/native.py: one
foreign call, ~1-2 µs of host time, no Python per argument); cuDNN steps through the backend's
execute with a prebuilt, UID-sorted pointer array (engines/cudnn_launch.py); PyTorch steps as
before. Flat launching serves every plan and every call (new addresses, new scalars, host steps), but
it still pays the driver's launch per kernel (several µs per generated kernel, more per cuDNN step:
bench/results/constants.md#launch-costs); so both: a capturable plan whose binding is stable can replay
an internal CUDA graph of the same calls (autograph.py, on by default: under a µs per generated step),
re-pointed through the address table where only
table-addressed tensors moved, falling back to flat launches whenever something it baked in changes.

Everything here is one thread's (threads.ThreadState owns its BoundPlans): threads executing one plan
at once never share a binding, a launcher or an argument slot.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..core.errors import ExecutionError, VariantPackError
from ..engines.base import Binding, Launcher
from ..memory import workspace as wsp
from ..memory.addresses import TABLE_KEY, AddressTable
from ..memory.buffers import address_of
from .autograph import AutoGraph
from .bindings import PackBinder

if TYPE_CHECKING:
    from .state import PlanState


class BoundPlan:
    """A plan's steps bound to one workspace in one thread (state.ThreadState): the binding, each
    step's launcher, the flat list of calls an execute makes."""

    def __init__(
        self,
        state: PlanState,
        binder: PackBinder,
        table: AddressTable,
        base: Any,
        views: Mapping[int, Any],
        workspace: Any = None,
        reserved: Mapping[tuple[int, int], Any] | None = None,
    ) -> None:
        self.state = state
        self.table = table
        self.base = base
        self.workspace = workspace  # the user's workspace object (None: the plan's own)
        self.ws_ptr = address_of(base) if workspace is not None else 0
        self.ws_range = (self.ws_ptr, self.ws_ptr + state.workspace_size)
        self.binding = b = Binding()
        b.buffers.update(binder.values)
        b.pointers.update(binder.pointers)
        b.reserved.update(reserved or {})
        for uid, view in views.items():
            b.buffers[uid] = view
            b.pointers[uid] = address_of(view)
        if table:
            b.buffers[TABLE_KEY] = table.tensor
            b.pointers[TABLE_KEY] = address_of(table.tensor)
            table.update_from(b.pointers)
        self.version = binder.version
        self.launchers: list[Launcher] = [
            step.kernel.bind(b, wsp.scratch_view(base, state.layout, step.index)) for step in state.steps
        ]
        readers: dict[int, list[int]] = {}
        for i, step in enumerate(state.steps):
            for uid in {*step.piece.inputs, *step.piece.outputs}:
                readers.setdefault(uid, []).append(i)
        # (tuples of ints, which the garbage collector stops tracking: a dynamic plan binds every new shape)
        self.readers: dict[int, tuple[int, ...]] = {u: tuple(r) for u, r in readers.items()}
        self.torch_steps = any(step.kernel.needs_torch_stream for step in state.steps)
        # by-reference tensors that every launch reads through the table: moving them keeps a graph
        self.table_only = set(table.slots) - set(state.baked) if table else set()
        self.autograph = AutoGraph(self)
        self._collect()

    def _collect(self) -> None:
        self.calls = [c for launcher in self.launchers for c in launcher.calls]
        self.preludes = list(self.binding.preludes.values())

    def step_calls(self, i: int) -> list[Any]:
        return list(self.launchers[i].calls)

    def sync(self, binder: PackBinder, force_table: bool = False) -> None:
        """Bring the binding up to the binder's values: rewrite the slots of what moved."""
        table = self.table
        if binder.version != self.version:
            b = self.binding
            changed = [u for u, p in binder.pointers.items() if b.pointers.get(u) != p]
            changed += [u for u in binder.pass_by_value if u in binder.values and b.buffers.get(u) != binder.values[u]]
            if self.workspace is not None and self.ws_range[1] > self.ws_range[0]:
                self._check_workspace(changed, binder)
            for u in changed:
                b.buffers[u] = binder.values[u]
                if u in binder.pointers:
                    b.pointers[u] = binder.pointers[u]
            recollect = False
            moved: dict[int, list[int]] = {}  # step -> the changed tensors it reads or writes
            for u in changed:
                for i in self.readers.get(u, ()):
                    moved.setdefault(i, []).append(u)
            for i in sorted(moved):
                recollect |= bool(self.launchers[i].rebind(moved[i]))
            if recollect:
                self._collect()
            self.version = binder.version
            if changed and not all(u in self.table_only for u in changed):
                self.autograph.invalidate()  # a launch holds one of them by value
            if table and (force_table or any(u in table.slots for u in changed)):
                table.update_from(b.pointers, force=force_table)
        elif table and (force_table or table.exposed):
            table.update_from(self.binding.pointers, force=force_table)

    def _check_workspace(self, changed: list[int], binder: PackBinder) -> None:
        lo, hi = self.ws_range
        graph = self.state.graph
        for u in changed:
            ptr = binder.pointers.get(u)
            if ptr is None:
                continue
            if ptr < hi and lo < ptr + graph.tensors[u].nbytes:
                raise VariantPackError(
                    "the workspace overlaps the buffer bound to this tensor",
                    tensor=graph.tensors[u],
                    rule="pack.workspace_overlap",
                    hint="give the workspace memory of its own",
                )

    def run(self) -> None:
        for fn, args in self.preludes:
            fn(*args)
        for fn, args in self.calls:
            rc = fn(*args)
            if rc:
                self._fail(args, rc)

    def _fail(self, args: Any, rc: Any) -> None:
        """A launch answered a CUDA error code: name the step."""
        what = f"CUDA error {rc}"
        if isinstance(rc, int):
            try:
                from ..engines.triton import native

                what = native.driver().error(rc)
            except Exception:  # noqa: BLE001 - the code alone then
                pass
        for i, launcher in enumerate(self.launchers):
            if any(call[1] is args for call in launcher.calls):
                step = self.state.steps[i]
                raise ExecutionError(
                    f"step {i} ({step.config.engine}) failed to launch: {what}",
                    op=step.piece.nodes[0].label(),
                    rule="execute.launch",
                    hint="run with CUDA_LAUNCH_BLOCKING=1 to find the kernel that faulted",
                )
        raise ExecutionError(f"a launch failed: {what}", rule="execute.launch")
