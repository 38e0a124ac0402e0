"""Score modifiers of attention: a small frozen sub-graph of pointwise ops on the virtual score.

`g.sdpa(..., score_mod=fn)` calls ``fn(sub, score)`` where `sub` is a `ScoreModBuilder` (every
pointwise builder of `Graph` works on it: ``sub.tanh``, ``sub.div``, ``sub.gen_index``, ...) and
`score` the virtual score tensor [B, H, Sq, Skv]. What `fn` builds is recorded, not added to the
graph, as a `ScoreMod`: a tuple of `ScoreNode`s over local references (`Ref`):

    Ref(SCORE)          the score the modifier is applied to
    Ref(GRAD)           (derivative sub-graphs only) the gradient arriving at the modified score
    Ref(NODE, i)        the output of the sub-graph's node i (nodes are in evaluation order)
    Ref(INPUT, i)       a tensor of the outer graph that `fn` read: the i-th extra input of the
                        attention node (input role ``score_mod_input{i}``), broadcast to the score
    Ref(CONST, v)       a Python number

A `ScoreMod` is hashable, prints compactly (``%0 = tanh(score) -> %0``), round-trips through the
graph JSON (a dataclass attribute) and is evaluated by `evaluate` with the pointwise ops' own
reference formulas in float64, never rounded to a storage type (kernels keep it in the compute
type). The derivative d(mod)/d(score) used by the backward is derived in autodiff/score_mod.py.
"""

from __future__ import annotations

import enum
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.errors import AttributeValueError, GraphError, ShapeError, expect
from ..core.op import BUILDERS, check_counts
from ..core.tensor import Tensor
from .pointwise import MODES, OPERAND_ROLES, Pointwise, PointwiseMode

INPUT_ROLE = "score_mod_input{}"


class Src(enum.Enum):
    SCORE = "score"
    GRAD = "grad"
    NODE = "node"
    INPUT = "input"
    CONST = "const"


@dataclass(frozen=True)
class Ref:
    """One operand of a score-modifier node (see the module docstring)."""

    src: Src
    index: int = 0
    const: float = 0.0

    def __post_init__(self) -> None:
        if type(self.index) is not int or self.index < 0:
            raise AttributeValueError(
                f"score_mod reference {self.src.value} index {self.index!r} is not a node or input number "
                "(an integer >= 0)",
                rule="sdpa.score_mod_index",
                hint="rebuild the modifier through g.sdpa(..., score_mod=fn); a file may not be edited by hand here",
            )

    def __str__(self) -> str:
        if self.src is Src.NODE:
            return f"%{self.index}"
        if self.src is Src.INPUT:
            return f"in{self.index}"
        if self.src is Src.CONST:
            return repr(self.const)
        return self.src.value


@dataclass(frozen=True)
class ScoreNode:
    """A pointwise op of the sub-graph: `operands` line up with Pointwise(mode).input_roles()
    (operands, then the mode's parameters; None where a parameter takes its default)."""

    mode: PointwiseMode
    operands: tuple[Ref | None, ...]
    axis: int | None = None  # GEN_INDEX: 2 is the query position i, 3 the key position j

    def __str__(self) -> str:
        roles = Pointwise(mode=self.mode, axis=self.axis).input_roles()
        args = [
            str(r) if i < MODES[self.mode].arity else f"{role}={r}"
            for i, (role, r) in enumerate(zip(roles, self.operands))
            if r is not None
        ]
        if self.axis is not None:
            args.append(f"axis={self.axis}")
        return f"{self.mode.value}({', '.join(args)})"


@dataclass(frozen=True)
class ScoreMod:
    """A recorded score modifier: `nodes` in evaluation order, the `result` reference and how many
    outer-graph tensors it reads (`num_inputs`, the extra inputs of the attention node)."""

    nodes: tuple[ScoreNode, ...]
    result: Ref
    num_inputs: int = 0

    def __post_init__(self) -> None:
        check_counts(num_inputs=self.num_inputs)
        for i, node in enumerate(self.nodes):
            for r in node.operands:
                if r is not None:
                    self._in_range(r, i, f"node %{i}")
        self._in_range(self.result, len(self.nodes), "result")

    def _in_range(self, r: Ref, nodes: int, where: str) -> None:
        """A reference to an earlier node (of `nodes`) or to one of the inputs: anything else would
        index from the end, or fail, when evaluated."""
        if r.src is Src.NODE and r.index >= nodes:
            what = f"node %{r.index}, not one of the {nodes} before it" if nodes else f"node %{r.index} before any"
        elif r.src is Src.INPUT and r.index >= self.num_inputs:
            what = f"input {r.index}, not one of its {self.num_inputs}"
        else:
            return
        raise AttributeValueError(
            f"score_mod {where} refers to {what}",
            rule="sdpa.score_mod_index",
            hint="rebuild the modifier through g.sdpa(..., score_mod=fn)",
        )

    def __repr__(self) -> str:
        body = "; ".join(f"%{i} = {n}" for i, n in enumerate(self.nodes))
        return "{" + (body + " " if body else "") + f"-> {self.result}" + "}"

    def input_roles(self) -> tuple[str, ...]:
        return tuple(INPUT_ROLE.format(i) for i in range(self.num_inputs))

    def reads(self, src: Src) -> bool:
        refs = [self.result, *(r for n in self.nodes for r in n.operands if r is not None)]
        return any(r.src is src for r in refs)


def evaluate(
    mod: ScoreMod, score: np.ndarray, inputs: Sequence[np.ndarray], grad: np.ndarray | None = None
) -> np.ndarray:
    """The modifier's value (float64, the score's shape) for `score`, the extra inputs (arrays that
    broadcast to the score) and, for a derivative sub-graph, the incoming `grad`."""
    values: list[np.ndarray] = []

    def value(r: Ref | None) -> np.ndarray | None:
        if r is None:
            return None
        if r.src is Src.SCORE:
            return score
        if r.src is Src.GRAD:
            assert grad is not None, "a derivative sub-graph needs the incoming gradient"
            return grad
        if r.src is Src.NODE:
            return values[r.index]
        if r.src is Src.INPUT:
            v = np.asarray(inputs[r.index], dtype=np.float64)
            return v.reshape(()) if v.size == 1 else v
        return np.asarray(r.const, dtype=np.float64)

    for node in mod.nodes:
        info = MODES[node.mode]
        ops = [value(r) for r in node.operands]
        if node.mode is PointwiseMode.GEN_INDEX:
            first = expect(ops[0], "GEN_INDEX's operand")  # (pointwise's checks)
            axis = expect(node.axis, "GEN_INDEX's axis")
            shape = np.shape(first)
            idx_shape = [1] * len(shape)
            idx_shape[axis] = shape[axis]
            values.append(np.arange(shape[axis], dtype=np.float64).reshape(idx_shape))
            continue
        params = {p: (default if v is None else v) for (p, default), v in zip(info.params, ops[info.arity :])}
        with np.errstate(all="ignore"):
            out = info.fn(*ops[: info.arity], **params)
        values.append(np.asarray(out, dtype=np.float64))
    result = value(mod.result)
    assert result is not None
    return np.broadcast_to(np.asarray(result, dtype=np.float64), score.shape)


# -- recording -----------------------------------------------------------------------------------------


class ScoreModBuilder:
    """What a score modifier function receives as its graph: the pointwise builders of `Graph`
    (``g.add``, ``g.tanh``, ``g.gen_index``, ``g.binary_select``, ...) recorded into a `ScoreMod`.
    Tensors of the outer graph (`outer`) may be used as operands; they become extra inputs."""

    def __init__(self, outer: Any, op_label: str, *, with_grad: bool = False) -> None:
        self.outer = outer
        self.op_label = op_label
        self.nodes: list[ScoreNode] = []
        self.externals: list[Tensor] = []
        self._refs: dict[int, Ref] = {}
        self._handles: list[Tensor] = []  # keeps the handles alive (ids stay unique)
        self.io_data_type = getattr(outer, "io_data_type", None)
        self.intermediate_data_type = getattr(outer, "intermediate_data_type", None)
        self.compute_data_type = getattr(outer, "compute_data_type", None)
        self.score = self._handle(Ref(Src.SCORE), "score")
        self.grad = self._handle(Ref(Src.GRAD), "grad") if with_grad else None

    # Tensor handles call these on their graph.
    def _invalidate(self) -> None:
        pass

    def _inferred(self, t: Tensor) -> None:
        return None

    def _handle(self, ref: Ref, name: str) -> Tensor:
        t = Tensor(self, name=name, is_virtual=True)
        self._refs[id(t)] = ref
        self._handles.append(t)
        return t

    def ref(self, value: Any, role: str = "input0") -> Ref | None:
        """The local reference of a builder operand (a handle of this builder, a tensor of the outer
        graph, a number or None)."""
        if value is None:
            return None
        if isinstance(value, Tensor):
            if value.graph is self:
                return self._refs[id(value)]
            if value.graph is self.outer:
                for i, t in enumerate(self.externals):
                    if t is value:
                        return Ref(Src.INPUT, i)
                self.externals.append(value)
                return Ref(Src.INPUT, len(self.externals) - 1)
            raise GraphError(
                f"score_mod operand '{role}' belongs to another graph",
                op=self.op_label,
                tensor=value,
                rule="sdpa.score_mod_operand",
                hint="a score modifier reads the score, numbers and tensors of the graph the attention is in",
            )
        if isinstance(value, (numbers.Real, np.bool_)):
            v = value.item() if isinstance(value, np.generic) else value
            return Ref(Src.CONST, const=float(v))
        raise ShapeError(
            f"score_mod operand '{role}' must be a tensor or a Python number, got {type(value).__name__}",
            op=self.op_label,
            rule="sdpa.score_mod_operand",
            hint="build the modifier from the score, numbers and tensors of the graph",
        )

    def _add_op(
        self,
        op: Any,
        inputs: Sequence[Any],
        *,
        name: str = "",
        compute_data_type: Any = None,
        outputs: Any = None,
        out_handles: Any = None,
    ) -> list[Tensor]:
        if not isinstance(op, Pointwise):
            raise AttributeValueError(
                f"a score modifier may only build pointwise ops, not '{op.kind}'",
                op=self.op_label,
                rule="sdpa.score_mod_op",
                hint="compute the non-pointwise part outside the modifier and pass its result in as a "
                "tensor of the graph (it broadcasts to [B, H, Sq, Skv])",
            )
        roles = op.input_roles()
        refs = tuple(self.ref(v, r) for v, r in zip(inputs, roles))
        if any(r is None for r in refs[: op.info.arity]):
            raise ShapeError(
                f"{op.mode.value} needs {op.info.arity} operands",
                op=self.op_label,
                rule="sdpa.score_mod_operand",
                hint="pass every operand",
            )
        self.nodes.append(ScoreNode(op.mode, refs, op.axis))
        return [self._handle(Ref(Src.NODE, len(self.nodes) - 1), name or op.mode.value)]

    def tensor(self, *args: Any, **kwargs: Any) -> Tensor:
        raise GraphError(
            "a score modifier cannot declare tensors",
            op=self.op_label,
            rule="sdpa.score_mod_tensor",
            hint="declare the tensor in the graph (g.tensor(...)) and use it inside the modifier",
        )

    tensor_like = tensor

    def __getattr__(self, name: str) -> Any:
        builder = BUILDERS.get(name)
        if builder is None:
            raise AttributeError(f"a score modifier's graph has no builder '{name}'")
        return builder.__get__(self, type(self))

    def finish(self, result: Any) -> tuple[ScoreMod, list[Tensor]]:
        if not isinstance(result, (Tensor, numbers.Real)):
            raise AttributeValueError(
                f"score_mod returned {type(result).__name__}, not a tensor",
                op=self.op_label,
                rule="sdpa.score_mod_result",
                hint="return the modified score (a tensor built from `score`)",
            )
        ref = self.ref(result, "result")
        assert ref is not None
        return ScoreMod(tuple(self.nodes), ref, len(self.externals)), list(self.externals)


def record(
    outer: Any, fn: Callable[..., Any], op_label: str, score_dim: tuple[int, ...] | None = None
) -> tuple[ScoreMod, list[Tensor]]:
    """Run the user's modifier `fn(sub, score)` on a recording builder: the ScoreMod and the outer
    tensors it reads (the extra inputs of the attention node, in order)."""
    if isinstance(fn, ScoreMod):
        raise AttributeValueError(
            "pass a recorded ScoreMod with its inputs",
            op=op_label,
            rule="sdpa.score_mod",
            hint="use opgraph.ops.score_mod.record",
        )
    if not callable(fn):
        raise AttributeValueError(
            f"score_mod must be a function score_mod(g, score) -> tensor, got {type(fn).__name__}",
            op=op_label,
            rule="sdpa.score_mod",
            hint="pass a function that builds pointwise ops on `score`",
        )
    sub = ScoreModBuilder(outer, op_label)
    if score_dim is not None:
        sub.score.set_dim(score_dim)
    return sub.finish(fn(sub, sub.score))


__all__ = [
    "INPUT_ROLE",
    "OPERAND_ROLES",
    "Ref",
    "ScoreMod",
    "ScoreModBuilder",
    "ScoreNode",
    "Src",
    "evaluate",
    "record",
]
