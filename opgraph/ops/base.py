"""What every op is: a frozen dataclass of attributes plus four rules (roles, inference, checks,
reference semantics), and the registries that make an op module plug itself in.

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

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar, NoReturn, Sequence

import numpy as np

from ..dtypes import DataType
from ..errors import GraphError, ShapeError
from ..ir import Const
from ..tensor import TensorDesc, packed_strides, stride_order

if TYPE_CHECKING:
    pass

OPS: dict[str, type["Op"]] = {}
BUILDERS: dict[str, Callable[..., Any]] = {}


def register_op(cls: type[Op]) -> type[Op]:
    """Class decorator: make an op kind known to finalize, JSON loading and the engines."""
    if cls.kind in OPS and OPS[cls.kind] is not cls:
        raise RuntimeError(f"op kind {cls.kind!r} registered twice")
    OPS[cls.kind] = cls
    return cls


def graph_method(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Function decorator: attach a builder to `Graph` under the function's name."""
    BUILDERS[fn.__name__] = fn
    return fn


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
                ShapeError, f"input '{role}' must be a tensor, got {value}", rule="op.operand",
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

    def check_scalar(self, role: str, value: float) -> tuple[str, str, str] | None:
        """What is wrong with `value` given at run time (a pass-by-value tensor) for scalar input `role`:
        (message, rule, hint), or None. A literal breaking the same rule is refused by `check`; the
        variant pack applies this to pass-by-value values on every execute."""
        return None

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

    def reference(
        self, ins: list[np.ndarray | None], outs: list[TensorDesc | None]
    ) -> list[np.ndarray | None]:
        """The op's meaning: float64 arrays in logical dims in, float64 arrays out (one per output
        role; None where the output is absent). Rounding to the declared types is the engine's job."""
        raise NotImplementedError


# -- helpers shared by op modules ------------------------------------------------------------------


def strides_like(dim: Sequence[int], like: TensorDesc | None) -> tuple[int, ...]:
    """Packed strides for `dim` that keep the axis order of `like` (same rank), else row-major."""
    if like is not None and len(like.dim) == len(dim):
        return packed_strides(dim, stride_order(like.stride))
    return packed_strides(dim)


def is_scalar_operand(value: TensorDesc | Const | None) -> bool:
    return isinstance(value, Const) or (isinstance(value, TensorDesc) and value.numel == 1)


def broadcast_dims(ctx: NodeContext, roles: Sequence[str]) -> tuple[int, ...]:
    """Broadcast the dims of the tensors under `roles` (equal rank; 1-element tensors and literals
    broadcast to anything). Raises ShapeError naming the operand that does not fit."""
    present = [(r, ctx.input(r)) for r in roles if ctx.input(r) is not None]
    tensors = [(r, t) for r, t in present if isinstance(t, TensorDesc) and not t.is_scalar]
    if not tensors:
        scalars = [t for _, t in present if isinstance(t, TensorDesc)]
        return max((t.dim for t in scalars), key=len, default=(1,))
    rank = max(len(t.dim) for _, t in tensors)
    out = [1] * rank
    for role, t in tensors:
        if len(t.dim) != rank:
            ctx.error(
                ShapeError,
                f"input '{role}' has rank {len(t.dim)} (dims {list(t.dim)}) but the other operands have "
                f"rank {rank}",
                tensor=role, rule="broadcast.rank",
                hint="give every operand the same rank, with 1 in broadcast axes (a per-channel bias of "
                "an NCHW image is dims [1, C, 1, 1])",
            )
        for axis, (a, b) in enumerate(zip(out, t.dim)):
            if a != b and a != 1 and b != 1:
                ctx.error(
                    ShapeError,
                    f"input '{role}' dims {list(t.dim)} do not broadcast with {out} at axis {axis} "
                    f"({b} vs {a})",
                    tensor=role, rule="broadcast.dims",
                    hint="make the axis equal or 1 in one of the operands",
                )
            out[axis] = max(a, b)
    return tuple(out)


def first_tensor(ctx: NodeContext, roles: Sequence[str], dim: Sequence[int]) -> TensorDesc | None:
    """The first input tensor of full dims `dim`: the one whose layout an output follows."""
    for r in roles:
        t = ctx.input(r)
        if isinstance(t, TensorDesc) and t.dim == tuple(dim):
            return t
    return None
