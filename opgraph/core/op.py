"""What every op is: a frozen dataclass of attributes plus four rules (roles, inference, checks,
reference semantics), and the registries that make an op module plug itself in (the IR layer: op families live in
opgraph/ops/, one module each).

Adding an op means writing one class and one builder in an op-family module:

    @register_op
    @dataclass(frozen=True, kw_only=True)
    class MyOp(Op):
        kind = "my_op"
        INPUTS = ("x",)
        OUTPUTS = ("y",)
        def infer(self, ctx): ...
        def reference(self, ins, outs): ...

    @graph_method
    def my_op(self, x, *, name="", compute_data_type=None):
        return self._add_op(MyOp(), [x], name=name, compute_data_type=compute_data_type)[0]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NoReturn

import numpy as np

from .dtypes import DataType
from .errors import GraphError, ShapeError
from .registry import Registry
from .tensor import TensorDesc


@dataclass(frozen=True)
class Const:
    """A literal operand baked into the graph (a Python number given where a tensor may go). In a graph
    with dynamic dims it may also be a ratio of sizes, a `SizeValue` (a mean's 1/count), which the
    static graph at each shape (`FinalGraph.at`) holds as its float: engines, which see static graphs
    only, never meet one (hence the annotation)."""

    value: float | int | bool

    def __str__(self) -> str:
        return repr(self.value)


OPS: Registry[str, type[Op]] = Registry("op kind")
BUILDERS: Registry[str, Callable[..., Any]] = Registry("graph builder")


def register_op(cls: type[Op]) -> type[Op]:
    """Class decorator: make an op kind known to finalize, JSON loading and the engines."""
    return OPS.register(cls.kind, cls)


def graph_method(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Function decorator: attach a builder to `Graph` under the function's name."""
    return BUILDERS.register(fn.__name__, fn)


@dataclass(frozen=True)
class TensorSpec:
    """What inference says about one output; None where the op does not determine it."""

    dim: tuple[int, ...] | None = None
    stride: tuple[int, ...] | None = None
    data_type: DataType | None = None


@dataclass(frozen=True)
class Draft:
    """What the user set on an op output before finalize (any field may be None)."""

    uid: int | None
    name: str
    dim: tuple[int, ...] | None
    stride: tuple[int, ...] | None
    data_type: DataType | None
    is_virtual: bool
    is_by_reference: bool = False

    def label(self) -> str:
        return f"tensor '{self.name or '<unnamed>'}' (uid {self.uid})"


class NodeContext:
    """The view of one node that inference and checks get: its input descriptors (or constants),
    its output drafts, the graph's default types, and an `error` helper that fills in the op label."""

    def __init__(
        self,
        label: str,
        roles: Sequence[str],
        inputs: Sequence[TensorDesc | Const | None],
        out_roles: Sequence[str],
        outputs: Sequence[Draft | TensorDesc | None],
        compute_data_type: DataType,
        intermediate_data_type: DataType,
    ) -> None:
        self.label = label
        self._in = dict(zip(roles, inputs))
        self._out = dict(zip(out_roles, outputs))
        self.compute_data_type = compute_data_type
        self.intermediate_data_type = intermediate_data_type

    def input(self, role: str) -> TensorDesc | Const | None:
        return self._in[role]

    def tensor(self, role: str) -> TensorDesc:
        """The input under `role`, which must be a tensor (not a literal)."""
        value = self._in[role]
        if not isinstance(value, TensorDesc):
            self.error(
                ShapeError,
                f"input '{role}' must be a tensor, got {value}",
                rule="op.operand",
                hint=f"pass a tensor made with g.tensor(...) as '{role}'",
            )
        return value

    def has(self, role: str) -> bool:
        return self._in.get(role) is not None

    def output(self, role: str) -> Draft | TensorDesc | None:
        return self._out[role]

    def error(
        self, cls: type[GraphError], message: str, *, tensor: Any = None, rule: str = "", hint: str = ""
    ) -> NoReturn:
        if isinstance(tensor, str):  # a role name
            tensor = self._in.get(tensor) or self._out.get(tensor)
            if isinstance(tensor, Const):
                tensor = None
        raise cls(message, op=self.label, tensor=tensor, rule=rule, hint=hint)


MAX_ROLES = 1 << 16  # inputs or outputs of one variadic op


def check_counts(**counts: int) -> None:
    """Role counts of a variadic op, bounded before anything is sized by them (a damaged plan file's
    num_inputs of 2**40 made the role list exhaust memory: fuzz seed 20261129007449). ValueError: the
    loader turns it into a SerializationError; the builders pass real counts."""
    for name, n in counts.items():
        if type(n) is not int or not 0 <= n <= MAX_ROLES:
            raise ValueError(f"{name}={n!r} is not a count in [0, {MAX_ROLES}]")


@dataclass(frozen=True, kw_only=True)
class Op:
    """Attributes of one op instance. Subclasses set the class-level roles and override the rules."""

    kind: ClassVar[str] = ""
    INPUTS: ClassVar[tuple[str, ...]] = ()
    OUTPUTS: ClassVar[tuple[str, ...]] = ()
    OPTIONAL_INPUTS: ClassVar[frozenset[str]] = frozenset()
    # Inputs that hold one value (epsilon, momentum, a clip, a scale): a Python number (baked in), a
    # pass-by-value tensor or a 1-element tensor read from memory at run time.
    SCALAR_INPUTS: ClassVar[frozenset[str]] = frozenset()
    # The op's math is the same whatever the element type (layout ops move data, never round it).
    MOVES_DATA_ONLY: ClassVar[bool] = False
    # Its rules (normalize, infer, check) take dynamic dims (opgraph.Dim, expressions of them) and
    # decide over their whole ranges; an op without it given a dynamic input is refused by finalize
    # (rule op.dynamic_dims). `dynamic_refusal` narrows which axes may be dynamic.
    DYNAMIC: ClassVar[bool] = False

    def input_roles(self) -> tuple[str, ...]:
        return self.INPUTS

    def output_roles(self) -> tuple[str, ...]:
        return self.OUTPUTS

    def optional_inputs(self) -> frozenset[str]:
        return self.OPTIONAL_INPUTS

    def scalar_inputs(self) -> frozenset[str]:
        return self.SCALAR_INPUTS

    def literal_inputs(self) -> frozenset[str]:
        """Roles that accept a Python number (a `Const`)."""
        return self.scalar_inputs()

    def integer_inputs(self) -> frozenset[str]:
        """Scalar roles whose value is an integer that must stay exact (a random seed, a counter
        offset): the reference engine reads them as int64 (float64 is exact only below 2**53), the
        generated kernels take a pass-by-value one as an int64 argument, and the variant pack gives one
        a Python int or an integer host buffer that fits its tensor's type (rule pack.pass_by_value)."""
        return frozenset()

    def check_scalar(self, role: str, value: float) -> tuple[str, str, str] | None:
        """What is wrong with `value` given at run time (a pass-by-value tensor) for scalar input `role`:
        (message, rule, hint), or None. A literal breaking the same rule is refused by `check`; the
        variant pack applies this to pass-by-value values on every execute (an int, exact, for a role
        of `integer_inputs`)."""
        return None

    def tuning_inputs(self, tensors: Mapping[str, TensorDesc]) -> dict[str, np.ndarray]:
        """Values, by role, for inputs that random data cannot stand for when configs are timed
        (opgraph.build.autotune): lengths, offsets, indices, in the logical dims of `tensors[role]`
        (the op's input descriptors, by role, of a static piece). Empty by default: all random."""
        return {}

    def normalize(self, ctx: NodeContext) -> Op:
        """The op with attributes made explicit now that input dims are known (e.g. one padding
        value for every spatial dim expanded to a tuple). The finalized graph stores the result, so
        equal graphs have equal attributes whatever form the builder was given."""
        return self

    def infer(self, ctx: NodeContext) -> list[TensorSpec]:
        """Output dims/strides/dtypes from the inputs, one TensorSpec per output role."""
        raise NotImplementedError

    def check(self, ctx: NodeContext) -> None:
        """Rules beyond inference, run once the outputs are fully known. Raise a typed GraphError."""

    def dynamic_refusal(self, ctx: NodeContext) -> str | None:
        """Why this op, whose class is DYNAMIC, cannot take the dynamic dims its inputs have here
        (e.g. a filter-gradient convolution over dynamic spatial dims), or None when it can."""
        return None

    def dependence(self, output: str, input: str) -> str:
        """How output role `output` depends on input role `input`: "none" (not at all), "aligned" (each
        output element reads only the input's element at the same index, where the two have equal
        dims: pointwise math, a running-statistics update) or "any" (other elements too). An output
        may be bound to the very buffer of an input it depends on only through aligned steps
        (opgraph.runtime.aliasing)."""
        return "any"

    def reference(self, ins: list[np.ndarray | None], outs: list[TensorDesc | None]) -> list[np.ndarray | None]:
        """The op's meaning: float64 arrays in logical dims in, float64 arrays out (one per output
        role; None where the output is absent). Rounding to the declared types is the engine's job."""
        raise NotImplementedError
