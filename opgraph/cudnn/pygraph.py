"""`cudnn.pygraph`: cuDNN frontend's graph object over an opgraph Graph.

The op builders are opgraph's own (their names and keywords are cuDNN's); this class adds cuDNN's
flow around them: `validate`, `build_operation_graph`, `create_execution_plans`, `check_support`,
`build_plans`, the plan-index functions, `execute(pack, workspace, handle=)`, `serialize` /
`deserialize`. What a cuDNN program relies on and opgraph's Graph would refuse is adapted here, at
validate, the way cuDNN does it:
  - a declared tensor no op uses is dropped (and ignored when bound in the variant pack);
  - `tensor_like` of a 1-element CPU tensor makes a pass-by-value scalar (as cuDNN does for every
    CPU tensor); read where a pass-by-value scalar cannot go, it is an ordinary tensor after all;
  - a pointwise output with no strides set takes the strides of the first input with the same dims
    (cuDNN's inference: results over gapped views such as q[..., :16] come out with q's strides).
The variant pack takes tensors, UIDs or names as keys and buffers (PyTorch tensors on the plan's
device, NumPy arrays and CPU tensors on the CPU, raw device pointers on CUDA) as values; None values
are skipped. An output may be bound to its input's very buffer where opgraph.aliasing allows it.
The attention API is in attention.py, execute and the variant pack's translation in running.py (both
bases of pygraph).
"""

from __future__ import annotations

import json
import numbers
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..core.device import Device, resolve_device
from ..core.dtypes import DataType
from ..core.errors import AttributeValueError, GraphError, SerializationError
from ..core.op import BUILDERS
from ..core.tensor import Tensor, TensorDesc
from ..graph.builder import Graph
from ..graph.finalize import _self_overlapping
from ..memory.buffers import buffer_info
from ..runtime.plan import ExecutionPlan
from . import enums
from .attention import AttentionGraph
from .candidates import Candidate, Planner
from .errors import cudnnGraphNotSupportedError, translated
from .handles import Handle
from .running import RunningGraph
from .tensors import adopt, tensor_attributes

# pygraph keywords of cuDNN that change nothing here (device properties, kernel caches, JIT hints)
_IGNORED_OPTIONS = frozenset(
    {
        "sm_count",
        "sm_version",
        "kernel_cache",
        "device_property",
        "is_dynamic_shape_enabled",
        "is_cuda_graph_replay_expected",
    }
)


CHECK_STRIDES = True  # the default of pygraph(check_strides=...): `opgraph.cudnn.CHECK_STRIDES = False`


class pygraph(AttentionGraph, RunningGraph):
    """A cuDNN frontend graph: build it with the op builders, then validate, plan, build and execute.

    opgraph extensions: `device=` ("cpu", "cuda", "cuda:N"; default the handle's device, else the GPU
    when usable, else the CPU), `engines=` (opgraph engine names, in order of preference) and
    `check_strides=` (default `opgraph.cudnn.CHECK_STRIDES`, True): a buffer of the tensor's logical
    dims (size-1 axes aside) whose strides contradict the declared ones (NCHW data for an
    NHWC-declared tensor) raises `[rule pack.strides]`, as opgraph's own API does, where cuDNN, which
    sees a pointer only, would read it with the declared strides. `check_strides=False` keeps cuDNN's
    trust: every dense buffer is read with the tensor's declared dims and strides."""

    def __init__(
        self,
        name: str = "test_graph",
        io_data_type: Any = None,
        intermediate_data_type: Any = None,
        compute_data_type: Any = None,
        handle: Handle | None = None,
        *,
        device: Any = None,
        engines: Sequence[str] | None = None,
        is_override_shape_enabled: bool = False,
        check_strides: bool | None = None,
        **options: Any,
    ) -> None:
        unknown = set(options) - _IGNORED_OPTIONS
        if unknown:
            raise TypeError(f"pygraph() got unexpected keyword argument(s): {', '.join(sorted(unknown))}")
        super().__init__(
            name,
            DataType.HALF if io_data_type is None else io_data_type,
            DataType.FLOAT if intermediate_data_type is None else intermediate_data_type,
            DataType.FLOAT if compute_data_type is None else compute_data_type,
        )
        self.handle = handle.check() if isinstance(handle, Handle) else None
        self._device_arg = device
        self._engines = None if engines is None else list(engines)
        self._override_shapes = bool(is_override_shape_enabled)
        if check_strides is None:
            import sys

            check_strides = bool(getattr(sys.modules.get("opgraph.cudnn"), "CHECK_STRIDES", CHECK_STRIDES))
        self._check_strides = bool(check_strides)
        self._filters: dict[str, Any] = {}
        self._cpu_scalars: set[int] = set()  # id() of tensor_like handles made pass-by-value for a CPU scalar
        self._runtime_values: dict[int, tuple[Tensor, Any]] = {}  # tensor_scalar(RUNTIME_PARAM) values
        self._dropped: list[Tensor] = []  # declared tensors no op uses (ignored in the pack)
        self._planner: Planner | None = None
        self._candidates: list[Candidate] = []
        self._built: dict[int, ExecutionPlan] = {}
        self._build_errors: dict[int, str] = {}
        self._loaded: ExecutionPlan | None = None  # a deserialized plan
        self._pack_keys: tuple | None = None  # (plan, ids and UIDs to skip, {key: TensorDesc}): execute's lookups
        self._init_attention()
        self._kept_descs: dict[int, TensorDesc] = {}  # id(handle) -> its desc at the last validate
        self._foreign: dict[int, tuple[Tensor, Tensor]] = {}  # id(another graph's handle) -> (it, its copy)
        self._override_plans: dict[tuple, tuple[ExecutionPlan, dict]] = {}  # overrides.respecialize's cache

    # -- tensors ---------------------------------------------------------------------------------
    # pygraph is opgraph's Graph under cuDNN frontend's API: where the two differ, cuDNN's signature wins
    @translated
    def tensor(  # type: ignore[override]  # cuDNN frontend's signature
        self,
        dim: Sequence[int] | None = None,
        stride: Sequence[int] | None = None,
        data_type: Any = None,
        is_virtual: bool = False,
        is_pass_by_value: bool = False,
        ragged_offset: Any = None,
        reordering_type: Any = None,
        name: str = "",
        uid: int | None = -1,
        ragged_offset_multiplier: int = 1,
        *,
        is_by_reference: bool = False,
    ) -> Tensor:
        """cuDNN's argument order; uid=-1 (cuDNN's "unset") has one assigned at validate."""
        if ragged_offset_multiplier != 1:
            raise AttributeValueError(
                "ragged_offset_multiplier is not supported",
                tensor=name,
                rule="cudnn.ragged",
                hint="give ragged offsets in elements (multiplier 1)",
            )
        if reordering_type not in (None, enums.tensor_reordering.NONE):
            raise AttributeValueError(
                f"tensor reordering {reordering_type} is not supported",
                tensor=name,
                rule="cudnn.reordering",
                hint="use tensor_reordering.NONE",
            )
        t = adopt(
            super().tensor(
                dim=dim,
                stride=stride,
                data_type=data_type,
                name=name,
                uid=None if uid is None or uid == -1 else uid,
                is_virtual=is_virtual,
                is_pass_by_value=is_pass_by_value,
                is_by_reference=is_by_reference,
            )
        )
        return t if ragged_offset is None else t.set_ragged_offset(ragged_offset)

    @translated
    def tensor_like(self, input: Any, name: str = "", uid: int | None = None) -> Tensor:
        """A tensor shaped like a tensor of any graph, a buffer (PyTorch, NumPy, DLPack) or a number.
        A 1-element CPU buffer becomes a pass-by-value scalar, as in cuDNN."""
        return adopt(self._tensor_like(input, name, uid))

    def _tensor_like(self, input: Any, name: str, uid: int | None) -> Tensor:
        if isinstance(input, Tensor):
            dim, stride, dtype = input.dim, input.stride, input.data_type
            other = input.graph
            known = getattr(other, "_kept_descs", {}).get(id(input)) if dim is None else None
            if known is not None:  # inferred by the last validate of its graph (kept, as cuDNN keeps them)
                dim, stride, dtype = known.dim, known.stride, known.data_type
            if dim is None:
                raise GraphError(
                    f"{input.label()} has no dims yet",
                    tensor=input,
                    rule="cudnn.tensor_like",
                    hint="validate its graph first (its dims are inferred then), or set them",
                )
            return super().tensor(
                dim=dim,
                stride=stride,
                data_type=dtype,
                name=name or input.name,
                uid=uid,
                is_pass_by_value=input.is_pass_by_value,
            )
        if isinstance(input, numbers.Number) and not isinstance(input, bool):
            return super().tensor_like(input, name=name, uid=uid)
        info = buffer_info(input)
        if info.device == "cpu" and int(np.prod(info.shape)) == 1:
            t = super().tensor(
                dim=info.shape or (1,),
                stride=info.strides or (1,),
                data_type=info.data_type,
                name=name,
                uid=uid,
                is_pass_by_value=True,
            )
            self._cpu_scalars.add(id(t))
            return t
        return super().tensor(
            dim=info.shape or (1,), stride=info.strides or (1,), data_type=info.data_type, name=name, uid=uid
        )

    @translated
    def tensor_scalar(self, value: float, scalar_type: Any = enums.scalar_type.COMPILE_TIME_CONST) -> Any:
        """COMPILE_TIME_CONST: the number itself (baked into the op that reads it); RUNTIME_PARAM: a
        pass-by-value tensor the shim binds to `value` at execute (no rebuild to change it)."""
        if scalar_type is enums.scalar_type.COMPILE_TIME_CONST:
            return value
        t = super().tensor_like(value)
        self._runtime_values[id(t)] = (t, value)
        return t

    def _add_op(self, op: Any, inputs: Sequence[Any], **kwargs: Any) -> list[Tensor | None]:
        return [adopt(t) for t in super()._add_op(op, inputs, **kwargs)]

    def _operand(self, value: Any, op: Any, role: str, name: str) -> Any:
        """A tensor of another cudnn.pygraph reads as a copy declared here (cuDNN's tensors belong to no
        graph); the variant pack may bind it by the other graph's handle."""
        if isinstance(value, Tensor) and isinstance(value.graph, pygraph) and value.graph is not self:
            hit = self._foreign.get(id(value))
            if hit is None:
                kept = value.graph._kept_descs.get(id(value))
                local = adopt(
                    Graph.tensor(
                        self,
                        dim=value._dim or (kept.dim if kept else None),
                        name=value.name,
                        stride=value._stride or (kept.stride if kept else None),
                        uid=value._uid,
                        data_type=value._data_type or (kept.data_type if kept else None),
                        is_pass_by_value=value.is_pass_by_value,
                    )
                )
                if id(value) in value.graph._cpu_scalars:
                    self._cpu_scalars.add(id(local))
                hit = self._foreign[id(value)] = (value, local)
            value = hit[1]
        return super()._operand(value, op, role, name)

    # -- validation: cuDNN's adaptations, then opgraph's checks -------------------------------------
    @translated
    def validate(self) -> None:  # type: ignore[override]  # cuDNN frontend's signature
        if self._loaded is not None and not self._records:
            return
        if self._final is None:
            self._adapt_attention()
            self._drop_unused()
            self._demote_cpu_scalars()
            super().validate()
            for _ in range(len(self._records)):  # a chain of pointwise ops passes strides one op per round
                if not self._cudnn_strides():
                    break
                super().validate()
            self._layouts_after_validate()
            final, uids = self.final, self._handle_uid
            self._kept_descs = {id(t): final.tensors[uids[id(t)]] for t in self._tensors if id(t) in uids}

    def _drop_unused(self) -> None:
        used = {id(v) for r in self._records for v in (*r.inputs, *r.outputs) if isinstance(v, Tensor)}
        shared = {t._uid for t in self._tensors if id(t) in used and t._uid is not None}
        keep = []
        for t in self._tensors:
            if id(t) in used or (t._uid is not None and t._uid in shared):
                keep.append(t)
            else:
                self._dropped.append(t)
        if len(keep) != len(self._tensors):
            self._tensors = keep
            self._invalidate()

    def _demote_cpu_scalars(self) -> None:
        for r in self._records:
            for role, v in zip(r.op.input_roles(), r.inputs):
                if isinstance(v, Tensor) and id(v) in self._cpu_scalars and role not in r.op.literal_inputs():
                    v.set_is_pass_by_value(False)
                    self._cpu_scalars.discard(id(v))

    def _cudnn_strides(self) -> bool:
        """cuDNN's stride rule for pointwise outputs with no strides set (see the module docstring).
        Returns whether a stride changed (the graph is then validated again)."""
        final, uids, changed = self._final, self._handle_uid, False  # set_stride invalidates both
        assert final is not None
        for r in self._records:
            if r.op.kind != "pointwise":
                continue
            for out in r.outputs:
                if out is None or out._stride is not None:
                    continue
                desc = final.tensors[uids[id(out)]]
                for v in r.inputs:
                    if not isinstance(v, Tensor):
                        continue
                    src = final.tensors[uids[id(v)]]
                    if src.dim == desc.dim:
                        if src.stride != desc.stride and not _self_overlapping(src.dim, src.stride):
                            out.set_stride(src.stride)
                            changed = True
                        break
        return changed

    @translated
    def build_operation_graph(self, handle: Handle | None = None) -> None:
        self.validate()

    # -- plans ---------------------------------------------------------------------------------------
    def _device(self) -> Device:
        if self._device_arg is not None:
            return resolve_device(self._device_arg)
        if self.handle is not None:
            return self.handle.device
        return resolve_device(None)

    def _plans_for(self) -> Planner:
        self.validate()
        if self._planner is None or self._planner.graph is not self._final:
            engines: Sequence[str] | None = self._engines
            if engines is None and os.environ.get("OPGRAPH_CUDNN_ENGINES"):
                engines = [e.strip() for e in os.environ["OPGRAPH_CUDNN_ENGINES"].split(",") if e.strip()]
            elif engines is None and self._device().is_cuda:
                engines = self.implementation_engines()
            self._planner = Planner(self.final, self._device(), engines, self._filters)
            self._candidates, self._built, self._build_errors = [], {}, {}
        return self._planner

    @translated
    def create_execution_plans(self, modes: Any = None) -> None:
        """Candidates from heuristic modes (a list of heur_mode; default [A, FALLBACK])."""
        planner = self._plans_for()
        self._candidates = planner.heuristic_candidates(modes)
        self._built, self._build_errors = {}, {}

    @translated
    def create_execution_plan(self, engine_id: int, knobs: dict | None = None) -> None:
        """Add the candidate of engine `engine_id` with knob KERNEL_CFG (default 0)."""
        cfg = 0
        for kind, value in dict(knobs or {}).items():
            if kind is not enums.knob_type.KERNEL_CFG:
                raise AttributeValueError(
                    f"knob {kind} is not one opgraph exposes",
                    rule="cudnn.knob",
                    hint="opgraph engines take KERNEL_CFG (see get_knobs_for_engine)",
                )
            cfg = int(value)
        cand = self._plans_for().engine_candidate(int(engine_id), cfg)
        if cand not in self._candidates:
            self._candidates.append(cand)

    @translated
    def get_engine_count(self) -> int:
        return len(self._plans_for().engines)

    @translated
    def get_knobs_for_engine(self, engine_id: int) -> list[enums.knob]:
        configs = self._plans_for().engine_configs(int(engine_id))
        return [enums.knob(enums.knob_type.KERNEL_CFG, max(len(c) for c in configs) - 1, 0, 1)]

    def _check_index(self, index: int) -> int:
        if not self._candidates:
            raise cudnnGraphNotSupportedError(
                "the graph has no execution plan candidates",
                rule="cudnn.no_plans",
                hint="call create_execution_plans([heur_mode.A, heur_mode.FALLBACK]) (or create_execution_plan) first",
            )
        if not 0 <= int(index) < len(self._candidates):
            raise AttributeValueError(
                f"there is no plan {index} (the graph has {len(self._candidates)})",
                rule="cudnn.plan_index",
                hint=f"pick an index in [0, {len(self._candidates) - 1}]",
            )
        return int(index)

    @translated
    def check_support(self, handle: Handle | None = None) -> None:
        if self._loaded is None:
            self._check_index(0)

    @translated
    def build_plan_at_index(self, index: int) -> None:
        i = self._check_index(index)
        if i not in self._built:
            self._built[i] = self._planner.build(self._candidates[i])  # type: ignore[union-attr]

    @translated
    def build_plans(self, policy: Any = enums.build_plan_policy.HEURISTICS_CHOICE) -> None:
        """HEURISTICS_CHOICE builds candidates in order until one builds; ALL builds every one."""
        self._check_index(0)
        for i in range(len(self._candidates)):
            if i in self._built:
                if policy is not enums.build_plan_policy.ALL:
                    return
                continue
            try:
                self.build_plan_at_index(i)
            except GraphError as err:
                self._build_errors[i] = str(err)
                continue
            if policy is not enums.build_plan_policy.ALL:
                return
        if not self._built:
            raise cudnnGraphNotSupportedError(
                "no execution plan built: " + "; ".join(f"plan {i}: {e}" for i, e in self._build_errors.items()),
                rule="cudnn.build_plans",
                hint="try other heuristic modes or engines",
            )

    @translated
    def build(self, modes: Any = None) -> None:  # type: ignore[override]  # cuDNN frontend's signature
        """With modes: validate, plan, check and build (HEURISTICS_CHOICE); without: validate only."""
        self.validate()
        if modes is None:
            return
        self.create_execution_plans(modes)
        self.check_support()
        self.build_plans()

    @translated
    def get_execution_plan_count(self) -> int:
        return 1 if self._loaded is not None else len(self._candidates)

    def _selected(self) -> ExecutionPlan:
        if self._loaded is not None:
            return self._loaded
        if not self._built:
            raise GraphError(
                "no execution plan is built",
                rule="cudnn.not_built",
                hint="call create_execution_plans(...), check_support() and build_plans() first",
            )
        return self._built[min(self._built)]

    def _plan_at(self, index: int) -> ExecutionPlan:
        if self._loaded is not None and index == 0:
            return self._loaded
        i = self._check_index(index)
        if i not in self._built:
            raise GraphError(
                f"plan {i} is not built",
                rule="cudnn.not_built",
                hint=f"call build_plan_at_index({i}) (or build_plans(build_plan_policy.ALL))",
            )
        return self._built[i]

    @translated
    def get_workspace_size(
        self, handle: Any = None, override_uids: Any = None, override_shapes: Any = None, override_strides: Any = None
    ) -> int:
        self._no_overrides(override_uids, override_shapes, override_strides)
        return self._selected().workspace_size

    @translated
    def get_workspace_size_plan_at_index(
        self,
        index: int,
        handle: Any = None,
        override_uids: Any = None,
        override_shapes: Any = None,
        override_strides: Any = None,
    ) -> int:
        self._no_overrides(override_uids, override_shapes, override_strides)
        i = self._check_index(index) if self._loaded is None else 0
        plan = self._loaded if self._loaded is not None else self._built.get(i)
        return 0 if plan is None else plan.workspace_size

    def _candidate(self, index: int) -> Candidate:
        if self._loaded is not None:
            return Candidate(tuple(s.config for s in self._loaded.steps))
        return self._candidates[self._check_index(index)]

    @translated
    def get_behavior_notes(self) -> list[Any]:
        plan = self._selected()
        return sorted(Candidate(tuple(s.config for s in plan.steps)).behavior_notes, key=lambda n: n.name)

    @translated
    def get_behavior_notes_for_plan_at_index(self, index: int) -> list[Any]:
        return sorted(self._candidate(index).behavior_notes, key=lambda n: n.name)

    @translated
    def get_numerical_notes_for_plan_at_index(self, index: int) -> list[Any]:
        return sorted(self._candidate(index).numerical_notes, key=lambda n: n.name)

    @translated
    def get_plan_name_at_index(self, index: int) -> str:
        return self._candidate(index).name

    @translated
    def get_engine_and_knobs_at_index(self, index: int) -> tuple[int, dict]:
        cand = self._candidate(index)
        engine = (
            cand.engine
            if cand.engine >= 0
            else (self._planner.engine_index(cand.configs[0]) if self._planner is not None else -1)
        )
        return engine, {enums.knob_type.KERNEL_CFG: cand.kernel_cfg if cand.engine >= 0 else int(index)}

    # -- filters (before create_execution_plans, as in cuDNN) ---------------------------------------
    def _set_filter(self, option: str, values: Any, select: bool) -> None:
        values = list(values) if isinstance(values, (list, tuple, set, frozenset)) else [values]
        foreign = [v for v in values if type(v).__name__ in ("numerical_note", "behavior_note")]
        if foreign and select:
            raise AttributeValueError(
                f"{option}: no opgraph engine config has {', '.join(map(repr, foreign))}",
                rule="cudnn.note",
                hint="select notes opgraph configs carry",
            )
        values = [v for v in values if v not in foreign]  # deselecting what no config has changes nothing
        self._filters[option] = values
        self._planner = None

    def deselect_engines(self, engines: Sequence[str]) -> None:
        self._filters["deselect_engines"] = [engines] if isinstance(engines, str) else list(engines)
        self._planner = None

    def deselect_numeric_notes(self, notes: Any) -> None:
        self._set_filter("deselect_numeric_notes", notes, False)

    def deselect_behavior_notes(self, notes: Any) -> None:
        self._set_filter("deselect_behavior_notes", notes, False)

    def select_numeric_notes(self, notes: Any) -> None:
        self._set_filter("select_numeric_notes", notes, True)

    def select_behavior_notes(self, notes: Any) -> None:
        self._set_filter("select_behavior_notes", notes, True)

    def deselect_workspace_greater_than(self, workspace: int) -> None:
        self._filters["deselect_workspace_greater_than"] = int(workspace)
        self._planner = None

    # -- files ---------------------------------------------------------------------------------------
    @translated
    def serialize(self) -> list[int]:
        """The built plan (opgraph's versioned plan file: graph, pieces, configs) as a list of bytes."""
        return list(self._selected().to_bytes())

    @translated
    def deserialize(self, *args: Any, enforce_precompiled: bool = False) -> None:
        """deserialize(data) or deserialize(handle, data): the plan, ready to execute by UID."""
        if len(args) == 2:
            handle, data = args
            if isinstance(handle, Handle):
                self.handle = handle.check()
        elif len(args) == 1:
            (data,) = args
        else:
            raise TypeError("deserialize() takes (data) or (handle, data)")
        if isinstance(data, str):
            data = data.encode()
        try:
            raw = bytes(data)
        except (TypeError, ValueError):
            raise SerializationError(
                f"cannot read a plan from a {type(data).__name__}",
                rule="cudnn.deserialize",
                hint="pass what serialize() returned (a list of ints, bytes or str)",
            ) from None
        self._loaded = ExecutionPlan.from_bytes(raw, device=self._device())
        self._final = self._loaded.graph

    @translated
    def query_tensor_attributes_of_uid(self, uid: int) -> tensor_attributes:
        graph = self._loaded.graph if self._loaded is not None else self.final
        if uid not in graph.tensors:
            raise GraphError(
                f"UID {uid} is not a tensor of this graph",
                rule="cudnn.uid",
                hint=f"known UIDs: {sorted(graph.tensors)}",
            )
        return tensor_attributes(graph.tensors[uid])

    @translated
    def key(self) -> int:  # type: ignore[override]  # cuDNN frontend's signature
        return int(super().key()[:15], 16)

    def __repr__(self) -> str:
        try:
            graph = self._loaded.graph if self._loaded is not None else self.final
            from ..graph.serialize import graph_to_json

            return graph_to_json(graph, indent=4)
        except GraphError as err:
            return json.dumps({"name": self.name, "invalid": err.detail})


for _name, _builder in BUILDERS.items():  # op builders raise cuDNN-catchable errors too
    if _name not in vars(AttentionGraph):  # (cuDNN's signatures of sdpa and sdpa_backward)
        setattr(pygraph, _name, translated(_builder))


__all__ = ["pygraph", "tensor_attributes"]
