"""Custom ops (plugins): a user-registered op lives in graphs, JSON and plans like any other.

    def swiglu_ref(x, g):                      # the reference: float64 NumPy arrays in and out
        return x * g / (1 + np.exp(-g))

    og.register_custom_op(
        "swiglu", num_inputs=2, reference=swiglu_ref,
        infer=lambda x, g: [x.dim],            # output dims from the input descriptors
        torch=lambda x, g: x * torch.nn.functional.silu(g),   # optional device implementation
        triton=swiglu_tl, pointwise=True,      # optional @triton.jit elementwise function: fusable
    )
    y = g.custom("swiglu", x, gate)

`infer(*input_descs, **params)` returns one entry per output: dims, or (dims, data_type). A pointwise
custom op (elementwise with broadcasting, outputs of the broadcast dims) given as a Triton function
`f(*values, **params)` of compute-type values is fused into generated kernels like a built-in mode.
Graph files name the op; loading one needs the op registered first (the error says so).

Legacy custom ops: opgraph once emitted some of its own ops as custom ops (pooling's and slice's
backward, stop_gradient), which are typed ops now. Graph and plan files written then name them as
`{"op": "custom", "attrs": {"op_name": "slice_backward", "params": [...]}}`; `upgrade_entry` turns such
an entry into the typed op's at load (the op's module registers how, in `LEGACY_CUSTOM`), and
`g.custom(name, ...)` under such a name builds the typed op too, unless a custom op of that name is
registered (then it is the user's).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from ..core.attrs import encode_attrs
from ..core.errors import AttributeValueError, GraphError, SerializationError, ShapeError
from ..core.op import NodeContext, Op, TensorSpec, check_counts, graph_method, register_op
from ..core.registry import Registry
from ..core.tensor import TensorDesc
from .base import broadcast_dims, first_tensor, strides_like

Param = int | float | str | bool


@dataclass(frozen=True)
class CustomOpDef:
    name: str
    num_inputs: int
    num_outputs: int
    reference: Callable[..., Any]
    infer: Callable[..., Any] | None = None
    torch: Callable[..., Any] | None = None
    triton: Any = None
    pointwise: bool = False


CUSTOM_OPS: Registry[str, CustomOpDef] = Registry("custom op")


def register_custom_op(
    name: str,
    *,
    num_inputs: int,
    reference: Callable[..., Any],
    num_outputs: int = 1,
    infer: Callable[..., Any] | None = None,
    torch: Callable[..., Any] | None = None,
    triton: Any = None,
    pointwise: bool = False,
    replace: bool = False,
) -> CustomOpDef:
    """Register a custom op, usable in graphs, graph files and plans like a built-in op.

    Registering a name again with the same definition does nothing; with another definition it is a
    `RegistrationError` unless `replace=True` (plans built before keep the definition they were built with
    only where their kernels compiled it in: build them again).

    Args:
        name: an identifier; graphs and files name the op by it.
        num_inputs: how many tensors `g.custom(name, ...)` takes.
        reference: the op's meaning: float64 NumPy arrays in (one per input, logical dims) and the
            output array (or a list of them) out; parameters come as keywords. The reference engine
            runs it, and every other engine is checked against it.
        num_outputs: how many outputs it makes.
        infer: `infer(*input_descs, **params)` -> one entry per output: dims, or (dims, data_type);
            may be left out for pointwise ops (outputs take the inputs' broadcast dims).
        torch: an optional device implementation over PyTorch tensors (the torch engine runs it).
        triton: an optional `@triton.jit` elementwise function `f(*values, **params)` defined at a
            module's top level: a pointwise op given one is fused into generated kernels.
        pointwise: whether the op is elementwise with broadcasting.
        replace: replace a custom op already registered under `name`.

    Returns:
        The CustomOpDef registered.

    Example:
        ```python
        og.register_custom_op("softsign", num_inputs=1, reference=lambda x: x / (1 + np.abs(x)),
                              torch=lambda x: x / (1 + x.abs()), pointwise=True)
        y = g.custom("softsign", x)
        ```
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise AttributeValueError(
            f"custom op name {name!r} must be an identifier",
            rule="custom.name",
            hint="use letters, digits and underscores, e.g. 'swiglu'",
        )
    if num_inputs < 1 or num_outputs < 1:
        raise AttributeValueError(
            "a custom op takes at least one input and makes at least one output",
            rule="custom.arity",
            hint="set num_inputs and num_outputs >= 1",
        )
    if infer is None and not pointwise:
        raise AttributeValueError(
            f"custom op '{name}' needs an infer function (or pointwise=True)",
            rule="custom.infer",
            hint="pass infer=lambda *inputs: [dims, ...]",
        )
    if triton is not None and not pointwise:
        raise AttributeValueError(
            f"custom op '{name}': a Triton function is fused only for pointwise ops",
            rule="custom.triton",
            hint="set pointwise=True, or drop triton=",
        )
    definition = CustomOpDef(name, num_inputs, num_outputs, reference, infer, torch, triton, pointwise)
    return CUSTOM_OPS.register(name, definition, replace=replace)


def custom_op_def(name: str) -> CustomOpDef:
    if name not in CUSTOM_OPS:
        raise GraphError(
            f"custom op '{name}' is not registered in this process",
            rule="custom.unregistered",
            hint=f"call opgraph.register_custom_op('{name}', ...) before building or loading the graph",
        )
    return CUSTOM_OPS[name]


# op name -> the typed op that custom op now is, from its parameters (AttributeValueError if they are bad)
LegacyUpgrade = Callable[[dict[str, Param]], Op]
LEGACY_CUSTOM: Registry[str, LegacyUpgrade] = Registry("legacy custom op")


def legacy_op(op_name: str, params: dict[str, Param]) -> Op | None:
    """The typed op that built-in custom op `op_name` is now (None: not a legacy name, or a custom op of that
    name is registered, which is then the user's)."""
    upgrade = LEGACY_CUSTOM.get(op_name)
    if upgrade is None or op_name in CUSTOM_OPS:
        return None
    return upgrade(params)


def upgrade_entry(entry: Any, where: str = "op") -> Any:
    """A graph file's op entry that names a legacy custom op, as the typed op's entry: kind and attributes
    from the old parameters, roles renamed by position (input0 -> the op's first input role, ...). Any
    other entry is returned as it is."""
    if not isinstance(entry, dict) or entry.get("op") != "custom" or not isinstance(entry.get("attrs"), dict):
        return entry
    attrs = entry["attrs"]
    name, params = attrs.get("op_name"), attrs.get("params", [])
    if not isinstance(name, str) or name not in LEGACY_CUSTOM or name in CUSTOM_OPS:
        return entry
    if not isinstance(params, list) or not all(
        isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) for p in params
    ):
        raise SerializationError(
            f"{where}: the parameters of custom op '{name}' are not [name, value] pairs", rule="json.legacy_op"
        )
    try:
        op = cast(Op, legacy_op(name, {k: v for k, v in params}))
    except GraphError as err:
        raise SerializationError(
            f"{where}: custom op '{name}' (a built-in op now): {err.detail}", rule="json.legacy_op", hint=err.hint
        ) from None

    def renamed(roles: Any, new: tuple[str, ...], old: str) -> Any:
        if not isinstance(roles, dict):
            return roles
        out = {}
        for role, value in roles.items():
            index = int(role[len(old) :]) if role.startswith(old) and role[len(old) :].isdigit() else -1
            out[new[index] if 0 <= index < len(new) else role] = value
        return out

    upgraded = {k: v for k, v in entry.items() if k not in ("op", "attrs", "inputs", "outputs")}
    upgraded.update(
        op=op.kind,
        attrs=encode_attrs(op),
        inputs=renamed(entry.get("inputs"), op.input_roles(), "input"),
        outputs=renamed(entry.get("outputs"), op.output_roles(), "output"),
    )
    return upgraded


@register_op
@dataclass(frozen=True, kw_only=True)
class Custom(Op):
    """A registered custom op; its math is the registered reference function."""

    kind = "custom"
    op_name: str
    num_inputs: int
    num_outputs: int
    params: tuple[tuple[str, int | float | str | bool], ...] = ()

    def __post_init__(self) -> None:
        check_counts(num_inputs=self.num_inputs, num_outputs=self.num_outputs)

    def input_roles(self) -> tuple[str, ...]:
        return tuple(f"input{i}" for i in range(self.num_inputs))

    def output_roles(self) -> tuple[str, ...]:
        return tuple(f"output{i}" for i in range(self.num_outputs))

    def literal_inputs(self) -> frozenset[str]:
        return frozenset(self.input_roles()) if self.definition.pointwise else frozenset()

    @property
    def definition(self) -> CustomOpDef:
        return custom_op_def(self.op_name)

    def dependence(self, output: str, input: str) -> str:
        return "aligned" if self.definition.pointwise else "any"

    def infer(self, ctx: NodeContext) -> list[TensorSpec]:
        d = self.definition
        if (d.num_inputs, d.num_outputs) != (self.num_inputs, self.num_outputs):
            ctx.error(
                ShapeError,
                f"custom op '{d.name}' is registered with {d.num_inputs} inputs and "
                f"{d.num_outputs} outputs, the graph has {self.num_inputs} and {self.num_outputs}",
                rule="custom.arity",
                hint="register the op as the graph uses it",
            )
        ins = [ctx.input(r) for r in self.input_roles()]
        if d.infer is None:  # pointwise: broadcast dims, the first full-size operand's layout
            dim = broadcast_dims(ctx, self.input_roles())
            like = first_tensor(ctx, self.input_roles(), dim)
            return [TensorSpec(dim, strides_like(dim, like))] * self.num_outputs
        try:
            result = d.infer(*ins, **dict(self.params))
        except GraphError:
            raise
        except Exception as err:  # noqa: BLE001 - the user's function: report it as a graph error
            ctx.error(
                ShapeError,
                f"the infer function of custom op '{d.name}' failed: {type(err).__name__}: {err}",
                rule="custom.infer_failed",
                hint="fix the registered infer function",
            )
        if not isinstance(result, (list, tuple)) or len(result) != self.num_outputs:
            ctx.error(
                ShapeError,
                f"the infer function of '{d.name}' must return {self.num_outputs} entries, got {result!r}",
                rule="custom.infer_result",
                hint="return [dims, ...] or [(dims, dtype), ...]",
            )
        specs = []
        first = next((t for t in ins if isinstance(t, TensorDesc)), None)
        for entry in result:
            dims, dtype = (
                entry
                if isinstance(entry, tuple) and len(entry) == 2 and not isinstance(entry[1], int)
                else (entry, None)
            )
            dims = tuple(int(v) for v in dims)
            specs.append(TensorSpec(dims, strides_like(dims, first), None if dtype is None else _dtype(dtype)))
        return specs

    def reference(self, ins, outs):
        result = self.definition.reference(*ins, **dict(self.params))
        results = list(result) if isinstance(result, (list, tuple)) else [result]
        return [
            np.broadcast_to(np.asarray(r, dtype=np.float64), o.dim) if o is not None else None
            for r, o in zip(results, outs)
        ]


def _dtype(value: Any):
    from ..core.dtypes import as_data_type

    return as_data_type(value)


@graph_method
def custom(
    self, op_name: str, *inputs: Any, params: dict[str, Param] | None = None, compute_data_type=None, name: str = ""
):
    """Apply a custom op registered with `opgraph.register_custom_op`.

    Shapes: what the op's `infer` says (a pointwise op: the inputs' broadcast dims).

    Layouts: any input strides; outputs packed in the first full-size input's axis order.

    Types: what `infer` says, else the graph's intermediate type when virtual, io type when an output.

    Formula: the registered `reference` function.

    Args:
        op_name: the registered name.
        *inputs: the input tensors, as many as registered.
        params: plain parameters (ints, floats, strings, bools) passed to reference/infer/torch/triton
            as keywords; they are part of the graph (and its files).
        compute_data_type: the type its inputs are handed over in.
        name: the op's name (default: op_name).

    Returns:
        Its output, or the list of its outputs.

    Example:
        ```python
        y = g.custom("scaled_softsign", x, params={"alpha": 0.5})
        ```
    """
    items = tuple(sorted((params or {}).items()))
    legacy = legacy_op(op_name, dict(items)) if op_name in LEGACY_CUSTOM else None
    if legacy is not None:  # a built-in op once emitted as a custom op (see the module docstring)
        outs = self._add_op(legacy, list(inputs), name=name or op_name, compute_data_type=compute_data_type)
        return outs[0] if len(outs) == 1 else outs
    d = custom_op_def(op_name)
    if len(inputs) != d.num_inputs:
        raise AttributeValueError(
            f"custom op '{op_name}' takes {d.num_inputs} inputs, got {len(inputs)}",
            op=f"custom '{name or op_name}'",
            rule="custom.arity",
            hint=f"pass {d.num_inputs} tensors",
        )
    for key, value in items:
        if not isinstance(value, (int, float, str, bool)):
            raise AttributeValueError(
                f"custom op parameter {key}={value!r} is not a plain value",
                op=f"custom '{name or op_name}'",
                rule="custom.param",
                hint="parameters are ints, floats, strings or bools",
            )
    op = Custom(op_name=op_name, num_inputs=d.num_inputs, num_outputs=d.num_outputs, params=items)
    outs = self._add_op(op, list(inputs), name=name or op_name, compute_data_type=compute_data_type)
    return outs[0] if d.num_outputs == 1 else outs
