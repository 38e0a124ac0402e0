"""Engine heuristics, engines, engine configs, knobs, execution plans and variant packs, and the calls
that run a plan: `execute(handle, plan, variant_pack)`, `populate_cuda_graph`, `update_cuda_graph`.

Engines are opgraph's engines on the handle's device, numbered as `plan.default_engines` lists them
(CUDNN_ATTR_ENGINE_GLOBAL_INDEX); their one knob is CUDNN_KNOB_TYPE_KERNEL_CFG, the rank of the
engine's config for each piece of the graph. A heuristic result is a candidate plan of
opgraph.cudnn.candidates (one config per piece).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.dtypes import DataType
from ..core.errors import GraphError
from ..core.types import UidPack
from ..cudnn.candidates import Candidate
from ..memory.buffers import tensor_from_pointer
from ..runtime.plan import ExecutionPlan
from . import names as N
from .descriptors import FINALIZERS, GETTERS, BackendError, Descriptor, _usable
from .lowering import LoweredGraph
from .names import AttributeName as A
from .names import DescriptorType as D
from .names import Status


@dataclass
class EngineState:
    graph: LoweredGraph
    index: int
    configs: list  # per piece, the engine's configs


@dataclass
class ConfigState:
    graph: LoweredGraph
    candidate: Candidate
    plan: ExecutionPlan | None = None  # built on demand (workspace size)

    def build(self, desc: Descriptor) -> ExecutionPlan:
        if self.plan is None:
            self.plan = _guard(
                lambda: self.graph.planner.build(self.candidate),
                desc,
                A.CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                Status.CUDNN_STATUS_NOT_SUPPORTED,
            )
        return self.plan


@dataclass
class PlanState:
    plan: ExecutionPlan
    graph: LoweredGraph | None  # None for a plan loaded from its JSON representation


def _guard(fn: Any, desc: Descriptor, attribute: Any, status: Any) -> Any:
    """Run fn; an opgraph error comes back as a BackendError placed at desc/attribute."""
    try:
        return fn()
    except BackendError:
        raise
    except GraphError as err:
        raise BackendError(
            err.detail,
            descriptor=desc,
            attribute=attribute,
            status=status,
            rule=err.rule,
            hint=err.hint,
            tensor=err.tensor,
        ) from None


def _graph(desc: Descriptor, attr: A) -> LoweredGraph:
    return desc.value(attr).state


def _result(kind: D, state: Any, attrs: dict | None = None) -> Descriptor:
    out = Descriptor(kind)
    out.attrs, out.state, out.finalized = dict(attrs or {}), state, True
    return out


# -- heuristics, engines, configs ------------------------------------------------------------------
def _engineheur(desc: Descriptor) -> list[Descriptor]:
    graph = _graph(desc, A.CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH)
    mode = N.HEUR_MODES[desc.value(A.CUDNN_ATTR_ENGINEHEUR_MODE)]
    candidates = _guard(
        lambda: graph.planner.heuristic_candidates([mode]),
        desc,
        A.CUDNN_ATTR_ENGINEHEUR_MODE,
        Status.CUDNN_STATUS_NOT_SUPPORTED,
    )
    return [_result(D.CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, ConfigState(graph, c)) for c in candidates]


def _engine(desc: Descriptor) -> EngineState:
    graph = _graph(desc, A.CUDNN_ATTR_ENGINE_OPERATION_GRAPH)
    index = desc.value(A.CUDNN_ATTR_ENGINE_GLOBAL_INDEX)
    configs = _guard(
        lambda: graph.planner.engine_configs(index),
        desc,
        A.CUDNN_ATTR_ENGINE_GLOBAL_INDEX,
        Status.CUDNN_STATUS_NOT_SUPPORTED,
    )
    return EngineState(graph, index, configs)


def _enginecfg(desc: Descriptor) -> ConfigState:
    engine: EngineState = desc.value(A.CUDNN_ATTR_ENGINECFG_ENGINE).state
    kernel_cfg = 0
    for choice in desc.values(A.CUDNN_ATTR_ENGINECFG_KNOB_CHOICES):
        kind = choice.value(A.CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE)
        if kind is not N.cudnnBackendKnobType_t.CUDNN_KNOB_TYPE_KERNEL_CFG:
            raise BackendError(
                f"knob {kind.name} is not one opgraph engines have",
                descriptor=desc,
                attribute=A.CUDNN_ATTR_ENGINECFG_KNOB_CHOICES,
                status=Status.CUDNN_STATUS_NOT_SUPPORTED,
                rule="backend.knob",
                hint="choose CUDNN_KNOB_TYPE_KERNEL_CFG (see the engine's KNOB_INFO)",
            )
        kernel_cfg = choice.value(A.CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE)
    cand = _guard(
        lambda: engine.graph.planner.engine_candidate(engine.index, kernel_cfg),
        desc,
        A.CUDNN_ATTR_ENGINECFG_KNOB_CHOICES,
        Status.CUDNN_STATUS_NOT_SUPPORTED,
    )
    return ConfigState(engine.graph, cand)


def _knob_info(maximum: int) -> Descriptor:
    return _result(
        D.CUDNN_BACKEND_KNOB_INFO_DESCRIPTOR,
        None,
        {
            A.CUDNN_ATTR_KNOB_INFO_TYPE: (
                N.AttributeType.CUDNN_TYPE_KNOB_TYPE,
                [N.cudnnBackendKnobType_t.CUDNN_KNOB_TYPE_KERNEL_CFG],
            ),
            A.CUDNN_ATTR_KNOB_INFO_MAXIMUM_VALUE: (N.AttributeType.CUDNN_TYPE_INT64, [maximum]),
            A.CUDNN_ATTR_KNOB_INFO_MINIMUM_VALUE: (N.AttributeType.CUDNN_TYPE_INT64, [0]),
            A.CUDNN_ATTR_KNOB_INFO_STRIDE: (N.AttributeType.CUDNN_TYPE_INT64, [1]),
        },
    )


def _notes(candidate: Candidate, numerical: bool) -> list:
    if numerical:
        return sorted((N.NUMERICAL_NOTES[n] for n in candidate.numerical_notes), key=lambda v: v.value)
    return sorted((N.BEHAVIOR_NOTES[n] for n in candidate.behavior_notes), key=lambda v: v.value)


# -- plans -------------------------------------------------------------------------------------------
def _execution_plan(desc: Descriptor) -> PlanState:
    handle = desc.value(A.CUDNN_ATTR_EXECUTION_PLAN_HANDLE)
    if desc.has(A.CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG):
        cfg: ConfigState = desc.value(A.CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG).state
        if cfg.graph.device != handle.device:
            raise BackendError(
                f"the operation graph was made for {cfg.graph.device}, the plan's handle is on {handle.device}",
                descriptor=desc,
                attribute=A.CUDNN_ATTR_EXECUTION_PLAN_HANDLE,
                rule="backend.device",
                hint="use the handle of the operation graph",
            )
        return PlanState(cfg.build(desc), cfg.graph)
    if desc.has(A.CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION):
        text = "".join(desc.values(A.CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION))
        plan = _guard(
            lambda: ExecutionPlan.from_bytes(text.encode(), device=handle.device),
            desc,
            A.CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION,
            Status.CUDNN_STATUS_BAD_PARAM,
        )
        return PlanState(plan, None)
    raise BackendError(
        "neither CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG nor ..._JSON_REPRESENTATION is set",
        descriptor=desc,
        attribute=A.CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
        rule="backend.required",
        hint="set an engine config (from heuristics or an engine), or a plan's JSON representation",
    )


def _variant_pack(desc: Descriptor) -> None:
    uids = desc.values(A.CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS)
    ptrs = desc.values(A.CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS)
    if len(uids) != len(ptrs):
        raise BackendError(
            f"{len(uids)} UIDs but {len(ptrs)} data pointers",
            descriptor=desc,
            attribute=A.CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
            rule="backend.variant_pack",
            hint="give one data pointer per UID, in the same order",
        )
    dup = sorted({u for u in uids if uids.count(u) > 1})
    if dup:
        raise BackendError(
            f"UIDs {dup} appear more than once",
            descriptor=desc,
            attribute=A.CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
            status=Status.CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES,
            rule="backend.variant_pack",
            hint="bind each tensor once",
        )


FINALIZERS.update(
    {
        D.CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR: _engineheur,
        D.CUDNN_BACKEND_ENGINE_DESCRIPTOR: _engine,
        D.CUDNN_BACKEND_ENGINECFG_DESCRIPTOR: _enginecfg,
        D.CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: _execution_plan,
        D.CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR: _variant_pack,
    }
)


def _get_graph(desc: Descriptor, name: A) -> list | None:
    if name is A.CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT:
        return [len(desc.state.planner.engines)]
    return None


def _get_engine(desc: Descriptor, name: A) -> list | None:
    st: EngineState = desc.state
    first = Candidate(tuple(c[0] for c in st.configs), st.index, 0)
    return {
        A.CUDNN_ATTR_ENGINE_KNOB_INFO: lambda: [_knob_info(max(len(c) for c in st.configs) - 1)],
        A.CUDNN_ATTR_ENGINE_NUMERICAL_NOTE: lambda: _notes(first, True),
        A.CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE: lambda: _notes(first, False),
        A.CUDNN_ATTR_ENGINE_LAYOUT_INFO: list,
    }.get(name, lambda: None)()


def _get_config(desc: Descriptor, name: A) -> list | None:
    st: ConfigState = desc.state
    if name is A.CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE:
        return [st.build(desc).workspace_size]
    if name is A.CUDNN_ATTR_ENGINECFG_INTERMEDIATE_INFO:
        return []
    if name is A.CUDNN_ATTR_ENGINECFG_ENGINE and not desc.has(name):  # a heuristic result
        cand = st.candidate
        index = cand.engine if cand.engine >= 0 else st.graph.planner.engine_index(cand.configs[0])
        configs = st.graph.planner.engine_configs(index)
        return [
            _result(
                D.CUDNN_BACKEND_ENGINE_DESCRIPTOR,
                EngineState(st.graph, index, configs),
                {A.CUDNN_ATTR_ENGINE_GLOBAL_INDEX: (N.AttributeType.CUDNN_TYPE_INT64, [index])},
            )
        ]
    return None


def _get_plan(desc: Descriptor, name: A) -> list | None:
    st: PlanState = desc.state
    if name is A.CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE:
        return [st.plan.workspace_size]
    if name is A.CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION:
        return [st.plan.to_bytes().decode()]
    if name is A.CUDNN_ATTR_EXECUTION_PLAN_COMPUTED_INTERMEDIATE_UIDS:
        return []
    return None


GETTERS.update(
    {
        D.CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: _get_graph,
        D.CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR: lambda d, n: (
            list(d.state) if n is A.CUDNN_ATTR_ENGINEHEUR_RESULTS else None
        ),
        D.CUDNN_BACKEND_ENGINE_DESCRIPTOR: _get_engine,
        D.CUDNN_BACKEND_ENGINECFG_DESCRIPTOR: _get_config,
        D.CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: _get_plan,
    }
)


# -- running -----------------------------------------------------------------------------------------
def _checked(handle: Any, plan: Descriptor, variant_pack: Descriptor) -> tuple[PlanState, UidPack, Any]:
    plan, variant_pack = _usable(plan, "the plan"), _usable(variant_pack, "the variant pack")
    for desc, kind in (
        (plan, D.CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR),
        (variant_pack, D.CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR),
    ):
        if desc.type is not kind or not desc.finalized:
            raise BackendError(
                f"expected a finalized {kind.name}, got {desc!r}",
                descriptor=desc,
                status=Status.CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED,
                rule="backend.execute",
                hint=f"finalize() a {kind.name} and pass it",
            )
    st: PlanState = plan.state
    device = st.plan.device
    pack: UidPack = {}
    tensors = st.plan.graph.tensors
    for uid, ptr in zip(
        variant_pack.values(A.CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS),
        variant_pack.values(A.CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS),
    ):
        by_value = uid in tensors and tensors[uid].is_pass_by_value
        pack[uid] = _pointer(
            ptr, device if not by_value else None, variant_pack, A.CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, uid
        )
    for uid, (how, what) in st.graph.auto.items() if st.graph is not None else ():
        if how == "alias":
            if what not in pack:
                raise BackendError(
                    f"beta reads the previous value of UID {what}, which the pack does not bind",
                    descriptor=variant_pack,
                    attribute=A.CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
                    rule="pack.missing",
                    hint=f"bind UID {what}",
                )
            pack[uid] = pack[what]
        else:
            pack[uid] = _pointer(what, device, plan, A.CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, uid)
    workspace = variant_pack.value(A.CUDNN_ATTR_VARIANT_PACK_WORKSPACE)
    if workspace is None or st.plan.workspace_size == 0:
        workspace = None
    elif isinstance(workspace, int):
        workspace = (
            tensor_from_pointer(workspace, (st.plan.workspace_size,), (1,), DataType.UINT8, device.index)
            if device.is_cuda
            else None
        )  # a host address cannot be checked: the plan uses its own workspace
    elif not device.is_cuda and hasattr(workspace, "numpy"):
        workspace = workspace.numpy()
    return st, pack, workspace


def _pointer(ptr: Any, device: Any, desc: Descriptor, attribute: Any, uid: int) -> Any:
    """The buffer for `uid`; device None: a by-value tensor, whose "pointer" is its host value's buffer."""
    if isinstance(ptr, (int, np.integer)) and device is None:
        raise BackendError(
            f"UID {uid} is a by-value tensor bound to a raw address",
            descriptor=desc,
            attribute=attribute,
            rule="backend.by_value_pointer",
            hint="pass the host value's buffer instead, e.g. np.array([1e-5], np.float32)",
        )
    if isinstance(ptr, (int, np.integer)) and not device.is_cuda:
        raise BackendError(
            f"UID {uid} is bound to a raw address, which cannot be checked on the CPU",
            descriptor=desc,
            attribute=attribute,
            rule="backend.host_pointer",
            hint="on the CPU put the NumPy array or CPU tensor itself in DATA_POINTERS; raw "
            "addresses are for CUDA device memory",
        )
    return ptr


def execute(handle: Any, plan: Descriptor, variant_pack: Descriptor) -> Any:
    """cudnnBackendExecute: run the plan on the pack's buffers, on the handle's stream."""
    st, pack, workspace = _checked(handle, plan, variant_pack)
    stream = getattr(handle, "stream", None) if st.plan.device.is_cuda else None
    _guard(
        lambda: st.plan.execute(pack, workspace, stream=stream),
        variant_pack,
        A.CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
        Status.CUDNN_STATUS_BAD_PARAM,
    )
    return Status.CUDNN_STATUS_SUCCESS


def populate_cuda_graph(handle: Any, plan: Descriptor, variant_pack: Descriptor) -> Any:
    """cudnnBackendPopulateCudaGraph: a torch.cuda.CUDAGraph running the plan on the pack (replay it)."""
    st, pack, workspace = _checked(handle, plan, variant_pack)
    return _guard(
        lambda: st.plan.populate_cuda_graph(pack, workspace),
        variant_pack,
        A.CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
        Status.CUDNN_STATUS_BAD_PARAM,
    )


def update_cuda_graph(handle: Any, plan: Descriptor, variant_pack: Descriptor, cuda_graph: Any) -> Any:
    """cudnnBackendUpdateCudaGraph: re-point a graph from populate_cuda_graph at the pack's buffers."""
    st, pack, workspace = _checked(handle, plan, variant_pack)
    return _guard(
        lambda: st.plan.update_cuda_graph(cuda_graph, pack, workspace),
        variant_pack,
        A.CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
        Status.CUDNN_STATUS_BAD_PARAM,
    )


__all__ = ["execute", "populate_cuda_graph", "update_cuda_graph"]
