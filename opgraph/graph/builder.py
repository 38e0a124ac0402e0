"""`Graph`: where users declare tensors and ops. Op builders (conv_fprop, add, batchnorm, ...) are
attached from the op modules' registry; validation lives in `finalize.py`, JSON in `serialize.py`,
planning in `plan.py`.
"""

from __future__ import annotations

import logging
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import ops as _ops  # noqa: F401  (registers every op family)
from ..core.dtypes import DataType, as_data_type
from ..core.errors import GraphError, ShapeError
from ..core.ir import Const, FinalGraph
from ..core.op import BUILDERS, Op
from ..core.symbolic_value import SizeValue
from ..core.tensor import Tensor

log = logging.getLogger("opgraph.finalize")

if TYPE_CHECKING:
    from ..build.heuristics import PieceConfigs
    from ..build.options import BuildOptions
    from ..core.config import HeurMode
    from ..runtime.plan import ExecutionPlan


@dataclass
class OpRecord:
    """An op as the user added it: handles, not UIDs (UIDs may still change until validate)."""

    op: Op
    name: str
    inputs: list[Tensor | Const | None]
    outputs: list[Tensor | None]
    compute_data_type: DataType | None


class Graph:
    """An operation graph under construction.

    >>> g = Graph(io_data_type=DataType.HALF)
    >>> x = g.tensor(dim=[8, 16], name="x")
    >>> y = g.relu(x).set_output(True)
    """

    def __init__(
        self,
        name: str = "",
        io_data_type: Any = DataType.HALF,
        intermediate_data_type: Any = DataType.FLOAT,
        compute_data_type: Any = DataType.FLOAT,
    ) -> None:
        self.name = str(name)
        self.io_data_type = as_data_type(io_data_type, what="io_data_type")
        self.intermediate_data_type = as_data_type(intermediate_data_type, what="intermediate_data_type")
        self.compute_data_type = as_data_type(compute_data_type, what="compute_data_type")
        self._tensors: list[Tensor] = []
        self._records: list[OpRecord] = []
        self._final: FinalGraph | None = None
        self._handle_uid: dict[int, int] = {}  # id(Tensor) -> uid, valid while _final is
        self._plan: ExecutionPlan | None = None

    # -- tensors ---------------------------------------------------------------------------------
    def tensor(
        self,
        dim: Sequence[int] | None = None,
        stride: Sequence[int] | None = None,
        data_type: Any = None,
        name: str = "",
        uid: int | None = None,
        is_virtual: bool = False,
        is_pass_by_value: bool = False,
        is_by_reference: bool = False,
    ) -> Tensor:
        """Declare a tensor. Strides default to packed row-major over `dim`; the data type defaults to
        the graph's io_data_type (or intermediate_data_type when virtual). A dim may be dynamic: an
        `opgraph.Dim` (a name and a range) or an expression of them (`batch * seq`), and so may a
        stride; the plan then runs every shape in the ranges (docs/design/dynamic-shapes.md)."""
        t = Tensor(
            self,
            dim=dim,
            stride=stride,
            data_type=data_type,
            name=name,
            uid=uid,
            is_virtual=is_virtual,
            is_pass_by_value=is_pass_by_value,
            is_by_reference=is_by_reference,
        )
        self._tensors.append(t)
        return t

    def tensor_like(self, like: Any, name: str = "", uid: int | None = None) -> Tensor:
        """A tensor with the dims, strides and type of a NumPy array, PyTorch tensor or DLPack object.
        A Python number gives a pass-by-value scalar of the graph's compute type."""
        from ..memory.buffers import buffer_info

        if isinstance(like, numbers.Number) and not isinstance(like, bool):
            return self.tensor(
                dim=[1], stride=[1], data_type=self.compute_data_type, name=name, uid=uid, is_pass_by_value=True
            )
        info = buffer_info(like)
        dim = info.shape or (1,)
        stride = info.strides or (1,)
        return self.tensor(dim=dim, stride=stride, data_type=info.data_type, name=name, uid=uid)

    # -- ops ---------------------------------------------------------------------------------------
    def _operand(self, value: Any, op: Op, role: str, name: str) -> Tensor | Const | None:
        if value is None:
            if role not in op.optional_inputs():
                raise ShapeError(
                    f"input '{role}' is required",
                    op=f"{op.kind} '{name}'",
                    rule="op.missing_input",
                    hint=f"pass a tensor as '{role}'",
                )
            return None
        if isinstance(value, Tensor):
            if value.graph is not self:
                raise GraphError(
                    f"input '{role}' belongs to another graph",
                    op=f"{op.kind} '{name}'",
                    tensor=value,
                    rule="op.foreign_tensor",
                    hint="declare the tensor in this graph (g.tensor / g.tensor_like); UIDs may repeat across graphs",
                )
            return value
        if isinstance(value, SizeValue) and role in op.literal_inputs():  # a ratio of dynamic sizes
            return Const(value)  # type: ignore[arg-type]  # (a dynamic graph's literal: see Const)
        if isinstance(value, (numbers.Real, np.bool_)) and role in op.literal_inputs():
            v = value.item() if isinstance(value, np.generic) else value
            return Const(v if isinstance(v, (bool, int)) else float(v))
        kind = "a tensor or a Python number" if role in op.literal_inputs() else "a tensor"
        raise ShapeError(
            f"input '{role}' must be {kind}, got {type(value).__name__} {value!r}",
            op=f"{op.kind} '{name}'",
            rule="op.operand",
            hint=f"pass {kind} made in this graph as '{role}'",
        )

    def _add_op(
        self,
        op: Op,
        inputs: Sequence[Any],
        *,
        name: str = "",
        compute_data_type: Any = None,
        outputs: Sequence[str] | None = None,
        out_handles: Sequence[Tensor | None] | None = None,
    ) -> list[Tensor | None]:
        """Record `op` reading `inputs` (one per input role) and return its output handles, one per
        output role; roles not in `outputs` (default: all) are absent (None). `out_handles` gives
        existing handles instead (graph loading)."""
        name = name or f"{op.kind}_{len(self._records)}"
        roles = op.input_roles()
        if len(inputs) != len(roles):
            raise TypeError(f"{op.kind} takes {len(roles)} inputs {roles}, got {len(inputs)}")
        operands = [self._operand(v, op, r, name) for v, r in zip(inputs, roles)]
        wanted = set(op.output_roles() if outputs is None else outputs)
        outs: list[Tensor | None] = []
        for i, role in enumerate(op.output_roles()):
            if out_handles is not None:
                outs.append(out_handles[i])
            elif role in wanted:
                t = Tensor(self, name=f"{name}::{role}", is_virtual=True)
                self._tensors.append(t)
                outs.append(t)
            else:
                outs.append(None)
        cdt = None if compute_data_type is None else as_data_type(compute_data_type, what="compute_data_type")
        self._records.append(OpRecord(op, name, operands, outs, cdt))
        self._invalidate()
        return outs

    def __getattr__(self, name: str) -> Any:
        # Builders registered after Graph was defined (e.g. custom ops) are found here.
        builder = BUILDERS.get(name)
        if builder is None:
            from ..core.suggest import did_you_mean

            raise AttributeError(f"'Graph' has no attribute or op builder '{name}'{did_you_mean(name, BUILDERS)}")
        return builder.__get__(self, Graph)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(BUILDERS))

    # -- finalize ----------------------------------------------------------------------------------
    def _invalidate(self) -> None:
        self._final = None
        self._handle_uid = {}

    def validate(self) -> Graph:
        """Derive the dataflow, sort, infer and check everything. Idempotent; raises GraphError."""
        if self._final is None:
            from .finalize import finalize

            self._final, self._handle_uid = finalize(self)
            log.info(
                "finalize '%s': %d ops, %d tensors (%d inputs, %d outputs)",
                self.name,
                len(self._final.nodes),
                len(self._final.tensors),
                len(self._final.inputs),
                len(self._final.outputs),
            )
            log.debug("%s", self._final)
        return self

    @property
    def final(self) -> FinalGraph:
        """The validated, frozen graph (validates first if needed)."""
        self.validate()
        assert self._final is not None
        return self._final

    def _inferred(self, t: Tensor):  # -> TensorDesc | None
        if self._final is None:
            return None
        uid = self._handle_uid.get(id(t))
        return None if uid is None else self._final.tensors.get(uid)

    def key(self) -> str:
        """A stable hash of the graph (its JSON form)."""
        from .serialize import graph_key

        return graph_key(self.final)

    # -- JSON -------------------------------------------------------------------------------------
    def to_json(self, indent: int | None = 2) -> str:
        from .serialize import graph_to_json

        return graph_to_json(self.final, indent=indent)

    @classmethod
    def from_json(cls, text: str | bytes) -> Graph:
        from .serialize import graph_from_json

        return graph_from_json(text)

    # -- plans --------------------------------------------------------------------------------------
    def engine_configs(
        self,
        heur_mode: HeurMode | Sequence[HeurMode] | None = None,
        device: str | None = None,
        engines: Sequence[str] | None = None,
    ) -> list[PieceConfigs]:
        """Ranked engine configs per piece of the graph, for the given heuristic modes."""
        from ..build.planner import engine_configs

        return engine_configs(self.final, heur_mode=heur_mode, device=device, engines=engines)

    def build(
        self,
        heur_mode: HeurMode | Sequence[HeurMode] | None = None,
        device: str | None = None,
        engines: Sequence[str] | None = None,
        allow_partition: bool = True,
        autotune: bool = False,
        *,
        options: BuildOptions | None = None,
        **keywords: Any,
    ) -> ExecutionPlan:
        """Validate, partition, choose an engine config per piece and compile: an ExecutionPlan.

        device None picks CUDA when a GPU is usable, else "cpu" (the reference engine). More options
        as keywords: `by_reference=True` (every bound tensor read through the address table), and
        cuDNN's config filters `select_numeric_notes`, `deselect_numeric_notes`,
        `select_behavior_notes`, `deselect_behavior_notes` (NumericalNote / BehaviorNote values or
        names), `deselect_engines` and `deselect_workspace_greater_than` (bytes), applied to
        heuristics and autotuning alike; `compile`: "parallel" (default: every kernel compiled now,
        in worker processes, each distinct kernel once), "serial" (now, in this process) or "lazy"
        (each at its first execute). Or all of them at once as `options=opgraph.BuildOptions(...)`;
        keywords given as well override those of `options` (a parameter left at its default does
        not). An unknown keyword is a BuildOptionError (with a did-you-mean). A graph with dynamic
        dims (opgraph.Dim) gets one plan for every shape in their ranges (opgraph.runtime.dynamic)."""
        from ..build.options import merged
        from ..runtime.plan import build_plan

        given = dict(
            heur_mode=heur_mode,
            device=device,
            engines=engines,
            allow_partition=allow_partition,
            autotune=autotune,
            **keywords,
        )
        self._plan = build_plan(self.final, merged(options, given, _BUILD_DEFAULTS))
        return self._plan

    def get_workspace_size(self) -> int:
        return self._require_plan().workspace_size

    def execute(self, variant_pack: dict[Any, Any], workspace: Any = None, **kwargs: Any) -> None:
        """Run the last plan built with `build`."""
        self._require_plan().execute(variant_pack, workspace, **kwargs)

    def _require_plan(self) -> ExecutionPlan:
        if self._plan is None or self._plan.graph != self._final:
            raise GraphError(
                "the graph has no plan built since its last change",
                rule="plan.missing",
                hint="call g.build() (or g.build(device='cpu')) before g.execute(...)",
            )
        return self._plan

    # -- printing -----------------------------------------------------------------------------------
    def __str__(self) -> str:
        try:
            return str(self.final)
        except GraphError as err:
            lines = [f"graph '{self.name}' (not valid yet: {err.detail})"]
            for r in self._records:
                ins = ", ".join("-" if v is None else str(v) if isinstance(v, Const) else v.label() for v in r.inputs)
                lines.append(f"    {r.op.kind} '{r.name}'({ins})")
            return "\n".join(lines)

    def __repr__(self) -> str:
        return (
            f"<opgraph.Graph '{self.name}': {len(self._tensors)} tensors, {len(self._records)} ops"
            f"{', validated' if self._final is not None else ''}>"
        )


_BUILD_DEFAULTS = {"heur_mode": None, "device": None, "engines": None, "allow_partition": True, "autotune": False}

for _name, _builder in BUILDERS.items():
    setattr(Graph, _name, _builder)
