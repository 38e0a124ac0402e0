"""The running part of `cudnn.pygraph`: `execute`, `execute_plan_at_index`, `populate_cuda_graph` and
`update_cuda_graph`, and what they do before the plan runs: cuDNN's variant pack translated to the plan's
(keys: tensors, UIDs or names; values: PyTorch tensors on the plan's device, NumPy arrays and CPU
tensors on the CPU, raw device pointers on CUDA; None values skipped; buffers read as declared,
packs.py), the workspace, the handle's stream, execute-time shape overrides (overrides.py), ragged
tensors (ragged.py) and bit-packed booleans (bitmask.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..core.device import Device
from ..core.dtypes import DataType
from ..core.errors import AttributeValueError, GraphError, VariantPackError
from ..core.tensor import Tensor
from ..graph.builder import Graph
from ..memory.buffers import buffer_info, tensor_from_pointer
from ..runtime.bindings import hashable, resolve_key
from ..runtime.plan import ExecutionPlan
from . import bitmask, overrides, ragged
from .errors import translated
from .handles import Handle
from .packs import as_declared


class RunningGraph(Graph):
    """The running part of `cudnn.pygraph` (a base of it; pygraph sets this state and builds the plans)."""

    handle: Handle | None
    _check_strides: bool
    _runtime_values: dict[int, tuple[Tensor, Any]]
    _dropped: list[Tensor]
    _built: dict[int, ExecutionPlan]
    _loaded: ExecutionPlan | None
    _pack_keys: tuple | None
    _foreign: dict[int, tuple[Tensor, Tensor]]
    _ragged_layouts: dict[int, ragged.RaggedLayout]

    def _selected(self) -> ExecutionPlan:
        """The plan `execute` runs (pygraph's plan flow)."""
        raise NotImplementedError

    def _plan_at(self, index: int) -> ExecutionPlan:
        """The built plan at `index` (pygraph's plan flow)."""
        raise NotImplementedError

    def _no_overrides(self, uids: Any, shapes: Any, strides: Any) -> dict[int, tuple[int, ...]]:
        """The packed tensors' new padded dims the shape overrides ask for (overrides.py); {} for none."""
        if uids is None and shapes is None and strides is None:
            return {}
        plan = self._loaded if self._loaded is not None else (self._selected() if self._built else None)
        return overrides.changes(self, plan.graph if plan is not None else self.final, uids, shapes, strides)

    def _pack(
        self, plan: ExecutionPlan, var_pack: Any, finish: list[Callable[[], None]] | None = None
    ) -> dict[Any, Any]:
        """The plan's variant pack from cuDNN's; a bit-packed boolean output's packing goes to `finish`."""
        if not isinstance(var_pack, dict):
            raise VariantPackError(
                f"a variant pack is a dict, got {type(var_pack).__name__}",
                rule="pack.type",
                hint="pass {tensor_or_uid: buffer, ...}",
            )
        if self._pack_keys is None or self._pack_keys[0] is not plan:
            skip_ids = {id(t) for t in self._dropped}
            skip_uids = {t._uid for t in self._dropped if t._uid is not None and t._uid not in plan.graph.tensors}
            self._pack_keys = (plan, skip_ids, skip_uids, {})
        _, skip_ids, skip_uids, descs = self._pack_keys
        pack: dict[Any, Any] = {}
        for key, value in var_pack.items():
            if key is None or value is None or id(key) in skip_ids or (type(key) is int and key in skip_uids):
                continue
            if id(key) in self._foreign and self._foreign[id(key)][0] is key:
                key = self._foreign[id(key)][1]
            desc = descs.get(key) if hashable(key) else None
            if desc is None:
                try:
                    desc = plan.graph.tensors[resolve_key(plan.graph, key)]
                except GraphError:
                    pack[key] = value  # bind() names the problem
                    continue
                if hashable(key) and len(descs) < 4096:
                    descs[key] = desc
            check = plan.device if self._check_strides else None
            if bitmask.is_packed(desc, value):
                value = bitmask.bind(desc, value, desc.uid in plan.graph.outputs, finish)
            if self._ragged_layouts and self._loaded is None:
                pack[desc.uid] = value if desc.uid in self._ragged_layouts else as_declared(desc, value, check)
            else:
                pack[key] = as_declared(desc, value, check)
        for t, value in self._runtime_values.values():
            if plan.graph.handle_uid(t) is not None and t not in pack:
                pack[t] = value
        return pack

    def _workspace(self, plan: ExecutionPlan, workspace: Any) -> Any:
        if workspace is None or plan.workspace_size == 0:
            return None
        if isinstance(workspace, (int, np.integer)) and not isinstance(workspace, bool):
            if not plan.device.is_cuda:
                return None  # a raw host address cannot be checked; the plan uses its own workspace
            return tensor_from_pointer(int(workspace), (plan.workspace_size,), (1,), DataType.UINT8, plan.device.index)
        if not plan.device.is_cuda and type(workspace).__module__.startswith("torch"):
            return buffer_info(workspace).obj  # the NumPy view the reference engine computes on
        return workspace

    def _stream(self, handle: Any) -> Any:
        h = handle if isinstance(handle, Handle) else self.handle
        return None if h is None else h.check().stream

    def _run(
        self,
        plan: ExecutionPlan,
        var_pack: Any,
        workspace: Any,
        handle: Any,
        changed: dict[int, tuple[int, ...]] | None = None,
    ) -> None:
        stream = self._stream(handle) if plan.device.is_cuda else None
        finish: list[Callable[[], None]] = []
        pack = self._pack(plan, var_pack, finish)
        layouts = self._ragged_layouts
        if changed:
            plan, layouts = overrides.respecialize(self, plan, changed)
        done = ragged.prepare(layouts, plan.graph.tensors, pack) if layouts and self._loaded is None else None
        if finish and stream is not None:  # bit-packed booleans (un)packed on PyTorch's stream, not the plan's
            _synchronize(plan.device)
        plan.execute(pack, self._workspace(plan, workspace), stream=stream)
        if done is not None:
            done()
        if finish and stream is not None:
            _synchronize(plan.device)
        for pack_bits in finish:
            pack_bits()

    @translated
    def execute(  # type: ignore[override]  # cuDNN frontend's signature
        self,
        var_pack: dict,
        workspace: Any = None,
        handle: Any = None,
        override_uids: Any = None,
        override_shapes: Any = None,
        override_strides: Any = None,
    ) -> None:
        """Run the first built plan. Keys: tensors, UIDs or names; entries with a None key or value
        (an optional tensor not used) are skipped."""
        changed = self._no_overrides(override_uids, override_shapes, override_strides)
        self._run(self._selected(), var_pack, workspace, handle, changed)

    @translated
    def execute_plan_at_index(
        self,
        var_pack: dict,
        workspace: Any,
        index: int,
        handle: Any = None,
        override_uids: Any = None,
        override_shapes: Any = None,
        override_strides: Any = None,
    ) -> None:
        changed = self._no_overrides(override_uids, override_shapes, override_strides)
        self._run(self._plan_at(int(index)), var_pack, workspace, handle, changed)

    @translated
    def populate_cuda_graph(self, handle: Any, var_pack: dict, workspace: Any = None, cuda_graph: Any = None) -> Any:
        """Capture the built plan on these buffers; returns the torch.cuda.CUDAGraph (replay it). A raw
        cudaGraph_t cannot be filled from Python here: pass cuda_graph=None and keep the result."""
        if cuda_graph is not None:
            raise AttributeValueError(
                "populate_cuda_graph captures into a torch.cuda.CUDAGraph it returns, not a raw cudaGraph_t",
                rule="cudnn.cuda_graph",
                hint="call g = graph.populate_cuda_graph(handle, pack, workspace) and g.replay()",
            )
        plan = self._selected()
        return plan.populate_cuda_graph(self._pack(plan, var_pack), self._workspace(plan, workspace))

    @translated
    def update_cuda_graph(self, handle: Any, var_pack: dict, workspace: Any, cuda_graph: Any) -> Any:
        """Re-point a graph from populate_cuda_graph at new buffers (see opgraph.runtime.cudagraph)."""
        plan = self._selected()
        return plan.update_cuda_graph(cuda_graph, self._pack(plan, var_pack), self._workspace(plan, workspace))


def _synchronize(device: Device) -> None:
    import torch

    torch.cuda.synchronize(device.torch_name)


__all__ = ["RunningGraph"]
