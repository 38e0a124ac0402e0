"""Backward rules: the registry keyed by op kind, the context a rule gets, and the builder it emits
backward ops with.

A rule is a function of a `RuleContext` that returns, for each input role whose gradient is wanted
(`ctx.needs(role)`), a tensor of the backward graph holding that gradient. Adding an op's rule means
adding one function in the module of its family:

    @register_rule("my_op", inputs=("x",))          # the input roles a gradient flows into
    def my_op(ctx: RuleContext) -> dict[str, Tensor]:
        x = ctx.input("x")                           # the forward input, as the backward graph sees it
        dy = ctx.grad("y")                           # the incoming gradient of output 'y'
        return {"x": ctx.b.mul(dy, ctx.b.pw(PointwiseMode.COS, x))}

A returned gradient may have the op output's broadcast dims: the algorithm reduces it (reduction ADD)
to the input's dims. It may also be *smaller* than the input where it is constant along an axis (the
gradient of a sum is the same for every summed element): such a gradient stays in its small dims
(dims 1 in those axes) as long as the ops that read it broadcast, and is expanded only where a full
tensor is needed (`ctx.grad_full`, `GradBuilder.expand`). The rule of an op whose output is the
broadcast of its inputs (pointwise modes, batchnorm_inference: `broadcasts=True`) may return such a
small gradient for an input broadcast along those axes too: it stands for the output's dims, so the
input's gradient is the reduction times the positions it stands for (`GradBuilder.unbroadcast`'s `over`).

Rules never read forward tensors from a buffer directly: `ctx.input` / `ctx.output` give a handle
that the algorithm later resolves to a saved tensor (an input of the backward graph) or to a
recomputation (see `grad.py` for the policy).

Pointwise modes have their own registry (`register_pointwise`); custom ops theirs
(`register_custom_grad`), keyed by the registered op name.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, overload

import numpy as np

from ..core.dtypes import DataType
from ..core.errors import UnsupportedGraphError
from ..core.ir import FinalGraph, Node
from ..core.op import Op
from ..core.registry import Registry
from ..core.symbolic import SymInt
from ..core.symbolic_value import SizeValue, exact_quotient, size_value
from ..core.tensor import Tensor, TensorDesc
from ..ops.custom import Custom
from ..ops.layout import Concatenate, Reshape, Slice, Transpose, slice_length
from ..ops.pointwise import MODES, Pointwise, PointwiseMode
from ..ops.reduction import Reduction, ReductionMode

Literal = float | int | bool | SizeValue  # a number given where a tensor may go (or a ratio of dynamic sizes)
Value = Tensor | Literal  # a backward-graph tensor or a literal
OpT = TypeVar("OpT", bound=Op)
RuleFn = Callable[["RuleContext"], "dict[str, Tensor]"]
Roles = Sequence[str] | Callable[[Node], Iterable[str]]


@dataclass(frozen=True)
class Rule:
    """How one op kind is differentiated.

    `inputs(node)`: the input roles a gradient flows into (others, such as a mask, epsilon or a
    comparison's operands, get none). `outputs(node)`: the output roles whose gradient the rule can
    take (a gradient arriving at another output, e.g. batchnorm's running stats, is an error).
    `broadcasts`: the op's output is the broadcast of its inputs, so a gradient the rule returns in
    smaller dims stands for the output's (see the module docstring).
    """

    kind: str
    fn: RuleFn
    inputs: Callable[[Node], frozenset[str]]
    outputs: Callable[[Node], frozenset[str]]
    broadcasts: bool = False


def _rule_fn(rule: Rule) -> RuleFn:
    return rule.fn


RULES: Registry[str, Rule] = Registry("backward rule", same=_rule_fn)
POINTWISE_RULES: Registry[PointwiseMode, Rule] = Registry("pointwise backward rule", same=_rule_fn)
CUSTOM_RULES: Registry[str, Rule] = Registry("custom-op backward rule", same=_rule_fn)


def _roles(spec: Roles | None, default: Callable[[Node], Iterable[str]]) -> Callable[[Node], frozenset[str]]:
    if spec is None:
        return lambda node: frozenset(default(node))
    if callable(spec):
        roles_of: Callable[[Node], Iterable[str]] = spec
        return lambda node: frozenset(roles_of(node))
    fixed = frozenset(spec)
    return lambda node: fixed


def _all_inputs(node: Node) -> Iterable[str]:
    return node.op.input_roles()


def _all_outputs(node: Node) -> Iterable[str]:
    return node.op.output_roles()


def _operands(node: Node) -> Iterable[str]:
    if not isinstance(node.op, Pointwise):
        raise unsupported(
            node,
            "a pointwise rule got another op",
            "register the rule under the op's own kind",
            rule="autodiff.rule_kind",
        )
    return node.op.operand_roles()


def register_rule(
    kind: str, *, inputs: Roles | None = None, outputs: Roles | None = None, broadcasts: bool = False
) -> Callable[[RuleFn], RuleFn]:
    """Decorator: the backward rule of op kind `kind` (see the module docstring)."""

    def deco(fn: RuleFn) -> RuleFn:
        RULES.register(kind, Rule(kind, fn, _roles(inputs, _all_inputs), _roles(outputs, _all_outputs), broadcasts))
        return fn

    return deco


def register_pointwise(*modes: PointwiseMode, inputs: Roles | None = None) -> Callable[[RuleFn], RuleFn]:
    """Decorator: the backward rule of pointwise `modes` (inputs default to the operands)."""

    def deco(fn: RuleFn) -> RuleFn:
        for mode in modes:
            POINTWISE_RULES.register(
                mode,
                Rule(
                    f"pointwise {mode.name}", fn, _roles(inputs, _operands), _roles(None, _all_outputs), broadcasts=True
                ),
            )
        return fn

    return deco


def register_custom_grad(
    op_name: str, fn: RuleFn, *, inputs: Roles | None = None, outputs: Roles | None = None, replace: bool = False
) -> None:
    """The backward rule of the custom op registered as `op_name` (opgraph.register_custom_op).
    `fn(ctx)` returns {"input0": gradient, ...} like any rule. Another rule for the same op name is a
    RegistrationError unless `replace`."""
    CUSTOM_RULES.register(
        op_name,
        Rule(f"custom {op_name}", fn, _roles(inputs, _all_inputs), _roles(outputs, _all_outputs)),
        replace=replace,
    )


# Ops with no backward rule on purpose: the backward ops themselves (opgraph.grad takes first derivatives
# only). opgraph.tools.op_table checks that every other op kind and pointwise mode has a rule.
NOT_DIFFERENTIABLE: dict[str, str] = {
    kind: "a backward op: no second derivatives"
    for kind in (
        "batchnorm_backward",
        "instancenorm_backward",
        "layernorm_backward",
        "rmsnorm_backward",
        "sdpa_backward",
        "embedding_backward",
        "resample_avg_backward",
        "resample_max_backward",
        "slice_backward",
        "adalayernorm_backward",
        "causal_conv1d_backward",
    )
} | {
    kind: "a collective of a training step's gradients, made after the backward (opgraph.training.distributed)"
    for kind in ("all_reduce", "all_reduce_wait")
}
NOT_DIFFERENTIABLE_MODES: frozenset[PointwiseMode] = frozenset(m for m in PointwiseMode if m.name.endswith("_BWD"))


def rule_for(node: Node) -> Rule | None:
    """The rule that differentiates `node`, or None when there is none. An op kind's own rule comes
    first (stop_gradient is a Pointwise IDENTITY whose kind has its own rule)."""
    if node.kind in RULES:
        return RULES[node.kind]
    if isinstance(node.op, Pointwise):
        return POINTWISE_RULES.get(node.op.mode)
    if isinstance(node.op, Custom):
        return CUSTOM_RULES.get(node.op.op_name)
    return None


def call_rule(rule: Rule, ctx: RuleContext) -> dict[str, Tensor]:
    """`rule.fn(ctx)`; a rule deciding by a size that varies with the graph's dynamic dims (Python's
    TypeError from a symbolic size: no truth value, no order) is a typed error naming the op."""
    try:
        return rule.fn(ctx)
    except TypeError as err:
        symbols = ctx.graph.symbols
        if not symbols or ("dynamic size" not in str(err) and "Expr" not in str(err)):
            raise
        raise unsupported(
            ctx.node,
            f"the backward rule of {ctx.node.kind} decides by a size that varies with the dynamic dims "
            f"{', '.join(d.describe() for d in symbols.values())} ({err})",
            "differentiate the static graph of one shape: grad(graph.final.at({'batch': 4, ...}), ...), "
            "or fix the dims this op reads",
            rule="autodiff.dynamic",
        ) from None


def unsupported(node: Node, what: str, hint: str, rule: str = "autodiff.no_rule") -> UnsupportedGraphError:
    return UnsupportedGraphError(what, op=node.label(), rule=rule, hint=hint)


# -- the builder rules emit backward ops with ----------------------------------------------------------


def _numel(dim: Sequence[int]) -> int:
    return math.prod(dim)


def dim_of(t: Tensor) -> tuple[int, ...]:
    """The dims of a backward-graph tensor: set on every forward handle and on every op output the
    builder makes (`GradBuilder.op`), so a tensor without them is a bug of the algorithm."""
    dim = t.dim
    if dim is None:
        raise UnsupportedGraphError(
            f"{t.label()} has no dims in the backward graph",
            rule="autodiff.dims",
            hint="this is an opgraph bug: please report it with the graph",
        )
    return tuple(dim)


def broadcast(dims: Iterable[tuple[int, ...]]) -> tuple[int, ...]:
    """The pointwise broadcast of `dims` (equal ranks; 1-element dims broadcast to anything)."""
    dims = list(dims)
    full = [d for d in dims if _numel(d) != 1]
    if not full:
        return max(dims, key=len, default=(1,))
    rank = len(full[0])
    out: list = [1] * rank
    for d in full:
        assert len(d) == rank, f"broadcast of {dims}"
        out = [b if a == 1 else a for a, b in zip(out, d)]  # (a dynamic dim never broadcasts: equal or 1)
    return tuple(out)


def _positions(g: Value, dims: tuple[int, ...], over: tuple[int, ...]) -> SymInt:
    """How many positions of `over` one element of gradient `g` (broadcastable to `over`) stands for
    in the gradient of an operand of dims `dims` (broadcastable to `over`), beyond those its
    reduction to `dims` sums: the product of `over` along the axes where g and dims are both 1."""
    gd = dim_of(g) if isinstance(g, Tensor) else (1,)
    if _numel(dims) == 1:
        count = exact_quotient(_numel(over), _numel(gd))
        assert count is not None, f"gradient dims {gd} do not divide {over}"
        return count
    if _numel(gd) == 1:
        gd = (1,) * len(over)
    assert len(gd) == len(dims) == len(over), f"gradient dims {gd} and operand dims {dims} do not fit {over}"
    return _numel(tuple(o for a, d, o in zip(gd, dims, over) if a == 1 and d == 1))


def _fold_sizes(mode: PointwiseMode, literals: Sequence[Literal]) -> Literal:
    """A product or quotient of numbers and ratios of dynamic sizes, folded (a ratio times a number)."""
    a, *rest = literals
    if mode is PointwiseMode.MUL and len(rest) == 1:
        b = rest[0]
        if isinstance(a, SizeValue) and isinstance(b, SizeValue):
            return SizeValue(a.scale * b.scale, a.num * b.num, a.den * b.den)
        return a * b  # (a SizeValue times a number)
    if mode is PointwiseMode.DIV and len(rest) == 1 and isinstance(a, SizeValue) and not isinstance(rest[0], SizeValue):
        return a / float(rest[0])
    raise UnsupportedGraphError(
        f"a pointwise {mode.value} of ratios of dynamic sizes {[str(v) for v in literals]} has no folded value",
        rule="autodiff.dynamic_literal",
        hint="this is an opgraph bug: please report it with the graph",
    )


class GradBuilder:
    """Adds backward ops to a `Graph`, with every output's dims set (so rules know them before the
    graph is validated, and validation checks them), constant folding of literal-only pointwise ops,
    and the gradient-specific helpers (reduce to an operand's dims, expand a broadcast gradient)."""

    def __init__(self, graph: Any) -> None:
        self.g = graph
        self.dtype: DataType = graph.intermediate_data_type
        self._count = 0
        self._by_dims: dict[tuple[int, ...], Tensor] = {}  # full tensors an expand can take dims from
        self.produced: set[int] = set()  # id() of the op outputs made here
        self._expands: set[str] = set()  # names of the expand ops (their mask is a dims carrier)
        # slice_backward outputs -> (the slice's gradient, its (start, stop, step) bounds): the sum of
        # the gradients of slices that tile a tensor (a split) is their concatenation (grad.py)
        self.slice_grads: dict[int, tuple[Tensor, tuple[tuple[int, int, int], ...]]] = {}
        self.prefix = "bwd"
        self.next_uid = 1

    def new_uid(self) -> int:
        """A UID for a new tensor (the algorithm starts them above every forward UID)."""
        self.next_uid += 1
        return self.next_uid - 1

    # -- bookkeeping --------------------------------------------------------------------------------
    def name(self, tag: str) -> str:
        self._count += 1
        return f"{self.prefix}.{tag}.{self._count}"

    @staticmethod
    def dims(v: Value) -> tuple[int, ...] | None:
        return tuple(v.dim) if isinstance(v, Tensor) and v.dim is not None else None

    def note(self, t: Tensor) -> Tensor:
        """Remember `t` as a tensor whose dims an expand may borrow."""
        if t.dim is not None and not t.is_pass_by_value:
            self._by_dims.setdefault(tuple(t.dim), t)
        return t

    def op(
        self,
        op: Op,
        inputs: Sequence[Any],
        outputs: Sequence[str],
        dims: Sequence[Sequence[int]],
        *,
        tag: str,
        float_outputs: bool = False,
    ) -> list[Tensor]:
        """Add `op` with only the output roles `outputs` (of dims `dims`). `float_outputs`: give
        them the intermediate type (ops whose outputs default to FLOAT or BOOLEAN)."""
        handles = self.g._add_op(op, list(inputs), name=self.name(tag), outputs=list(outputs))
        roles = op.output_roles()
        out = []
        for role, dim in zip(outputs, dims):
            t = handles[roles.index(role)]
            t.set_dim(tuple(dim)).set_uid(self.new_uid())
            self.produced.add(id(t))
            if float_outputs:
                t.set_data_type(self.dtype)
            out.append(self.note(t))
        return out

    def value_readers(self, t: Tensor) -> int:
        """How many ops read the values of `t` (an expand reads only the dims of its mask)."""
        n = 0
        for r in self.g._records:
            expand = r.name in self._expands
            n += sum(1 for i, v in enumerate(r.inputs) if v is t and not (expand and i == 2))
        return n

    # -- pointwise ----------------------------------------------------------------------------------
    # (the overloads say what the code does: an op with a tensor operand yields a tensor, and only
    # literal-only operands fold to a number)
    @overload
    def pw(self, mode: PointwiseMode, a: Tensor, /, *operands: Value, tag: str = "", **params: Value) -> Tensor: ...
    @overload
    def pw(
        self, mode: PointwiseMode, a: Value, b: Tensor, /, *operands: Value, tag: str = "", **params: Value
    ) -> Tensor: ...
    @overload
    def pw(self, mode: PointwiseMode, /, *operands: Value, tag: str = "", **params: Value) -> Value: ...

    def pw(self, mode: PointwiseMode, /, *operands: Value, tag: str = "", **params: Value) -> Value:
        """A pointwise op (literal-only operands are folded to a number)."""
        info = MODES[mode]
        values = [params.get(p) for p, _ in info.params]
        literals = [o for o in operands if not isinstance(o, Tensor)]
        if len(literals) == len(operands) and not any(isinstance(v, Tensor) for v in values):
            if any(isinstance(o, SizeValue) for o in literals):
                return _fold_sizes(mode, literals)
            with np.errstate(all="ignore"):
                kw = {p: (d if v is None else v) for (p, d), v in zip(info.params, values)}
                numbers = [float(o) for o in literals if not isinstance(o, SizeValue)]  # (all of them: see above)
                return float(np.asarray(info.fn(*(np.float64(o) for o in numbers), **kw), dtype=np.float64))
        dims = broadcast(d for o in operands if (d := self.dims(o)) is not None)
        (out,) = self.op(
            Pointwise(mode=mode),
            [*operands, *values],
            ["output"],
            [dims],
            tag=tag or mode.value,
            float_outputs=info.bool_out,
        )
        return out

    @overload
    def add(self, a: Tensor, b: Value) -> Tensor: ...
    @overload
    def add(self, a: Value, b: Tensor) -> Tensor: ...
    @overload
    def add(self, a: Value, b: Value) -> Value: ...

    def add(self, a: Value, b: Value) -> Value:
        if not isinstance(b, Tensor) and b == 0:
            return a
        if not isinstance(a, Tensor) and a == 0:
            return b
        return self.pw(PointwiseMode.ADD, a, b)

    @overload
    def sub(self, a: Tensor, b: Value) -> Tensor: ...
    @overload
    def sub(self, a: Value, b: Tensor) -> Tensor: ...
    @overload
    def sub(self, a: Value, b: Value) -> Value: ...

    def sub(self, a: Value, b: Value) -> Value:
        if not isinstance(b, Tensor) and b == 0:
            return a
        return self.pw(PointwiseMode.SUB, a, b)

    @overload
    def mul(self, a: Tensor, b: Value) -> Tensor: ...
    @overload
    def mul(self, a: Value, b: Tensor) -> Tensor: ...
    @overload
    def mul(self, a: Value, b: Value) -> Value: ...

    def mul(self, a: Value, b: Value) -> Value:
        if not isinstance(b, Tensor) and b == 1:
            return a
        if not isinstance(a, Tensor) and a == 1:
            return b
        return self.pw(PointwiseMode.MUL, a, b)

    @overload
    def div(self, a: Tensor, b: Value) -> Tensor: ...
    @overload
    def div(self, a: Value, b: Tensor) -> Tensor: ...
    @overload
    def div(self, a: Value, b: Value) -> Value: ...

    def div(self, a: Value, b: Value) -> Value:
        if not isinstance(b, Tensor) and b == 1:
            return a
        return self.pw(PointwiseMode.DIV, a, b)

    @overload
    def neg(self, a: Tensor) -> Tensor: ...
    @overload
    def neg(self, a: Value) -> Value: ...

    def neg(self, a: Value) -> Value:
        return self.pw(PointwiseMode.NEG, a)

    @overload
    def select(self, a: Value, b: Value, mask: Tensor) -> Tensor: ...
    @overload
    def select(self, a: Value, b: Value, mask: Value) -> Value: ...

    def select(self, a: Value, b: Value, mask: Value) -> Value:
        """mask ? a : b."""
        return self.pw(PointwiseMode.BINARY_SELECT, a, b, mask)

    @overload
    def mask(self, mode: PointwiseMode, a: Tensor, b: Value) -> Tensor: ...
    @overload
    def mask(self, mode: PointwiseMode, a: Value, b: Tensor) -> Tensor: ...
    @overload
    def mask(self, mode: PointwiseMode, a: Value, b: Value) -> Value: ...

    def mask(self, mode: PointwiseMode, a: Value, b: Value) -> Value:
        """A comparison as 1.0 / 0.0 in the intermediate type."""
        return self.pw(mode, a, b)

    @overload
    def sign(self, x: Tensor) -> Tensor: ...
    @overload
    def sign(self, x: Value) -> Value: ...

    def sign(self, x: Value) -> Value:
        """sign(x) with sign(0) = 0 (PyTorch's)."""
        return self.sub(self.mask(PointwiseMode.CMP_GT, x, 0.0), self.mask(PointwiseMode.CMP_LT, x, 0.0))

    # -- reductions and layout ------------------------------------------------------------------------
    def reduce(self, t: Tensor, dims: Sequence[int], mode: ReductionMode = ReductionMode.ADD) -> Tensor:
        dims = tuple(dims)
        if dim_of(t) == dims:
            return t
        (out,) = self.op(Reduction(mode=mode), [t], ["output"], [dims], tag=f"reduce_{mode.value}", float_outputs=True)
        return out

    def reshape(self, t: Tensor, dims: Sequence[int]) -> Tensor:
        dims = tuple(dims)
        if dim_of(t) == dims:
            return t
        (out,) = self.op(Reshape(dim=dims), [t], ["output"], [dims], tag="reshape")
        return out

    def transpose(self, t: Tensor, perm: Sequence[int]) -> Tensor:
        perm = tuple(perm)
        if perm == tuple(range(len(perm))):
            return t
        dims = tuple(dim_of(t)[p] for p in perm)
        (out,) = self.op(Transpose(permutation=perm), [t], ["output"], [dims], tag="transpose")
        return out

    def slice(self, t: Tensor, bounds: Sequence[tuple[int, int, int]]) -> Tensor:
        dims = tuple(slice_length(b) for b in bounds)
        if dims == dim_of(t) and all(b[0] == 0 and b[2] == 1 for b in bounds):
            return t
        (out,) = self.op(Slice(slices=tuple((a, b, c) for a, b, c in bounds)), [t], ["output"], [dims], tag="slice")
        return out

    def concatenate(self, ts: Sequence[Tensor], axis: int) -> Tensor:
        dims = list(dim_of(ts[0]))
        dims[axis] = sum(dim_of(t)[axis] for t in ts)
        (out,) = self.op(Concatenate(num_inputs=len(ts), axis=axis), list(ts), ["output"], [dims], tag="concat")
        return out

    # -- broadcast gradients --------------------------------------------------------------------------
    @overload
    def unbroadcast(self, g: Tensor, dims: Sequence[int], over: Sequence[int] | None = None) -> Tensor: ...
    @overload
    def unbroadcast(self, g: Value, dims: Sequence[int], over: Sequence[int] | None = None) -> Value: ...

    def unbroadcast(self, g: Value, dims: Sequence[int], over: Sequence[int] | None = None) -> Value:
        """`g` reduced (ADD) over the axes where it is larger than `dims`. Axes where g is 1 and dims
        are not stay 1 (a broadcast gradient, expanded only where needed). `over`: the dims g stands
        for (a broadcasting op's output): where g is 1 and `dims` is 1 but `over` is not, each
        element of g is the gradient of `over`'s positions along that axis, so their count multiplies it."""
        dims = tuple(dims)
        if over is not None:
            count = _positions(g, dims, tuple(over))
            if count != 1:
                return self.mul(self.unbroadcast(g, dims), size_value(count))
        if not isinstance(g, Tensor):
            return g
        gd = dim_of(g)
        if gd == dims:
            return g
        if _numel(dims) == 1:
            if _numel(gd) != 1:
                g = self.reduce(g, (1,) * len(gd))
            return g
        if _numel(gd) == 1:
            return g
        assert len(gd) == len(dims), f"gradient dims {gd} do not fit {dims}"
        target = tuple(1 if d == 1 and gdim != 1 else gdim for gdim, d in zip(gd, dims))
        return self.reduce(g, target)

    def expand(self, g: Value, dims: Sequence[int], carrier: Callable[[], Tensor] | None = None) -> Tensor:
        """`g` (broadcastable to `dims`) as a tensor of exactly `dims`. The broadcast is a
        binary_select(g, g, c) whose mask c is any tensor of those dims (its values do not matter):
        one already in the backward graph if there is one, else `carrier()`."""
        dims = tuple(dims)
        if isinstance(g, Tensor) and dim_of(g) == dims:
            return g
        if isinstance(g, Tensor) and len(dim_of(g)) != len(dims):
            g = self.reshape(g, (1,) * len(dims))
            if dim_of(g) == dims:
                return g
        c = self._by_dims.get(dims)
        if c is None:
            assert carrier is not None, f"no tensor of dims {dims} to expand a gradient to"
            c = carrier()
        (out,) = self.op(Pointwise(mode=PointwiseMode.BINARY_SELECT), [g, g, c], ["output"], [dims], tag="expand")
        self._expands.add(self.g._records[-1].name)
        return out


class RuleContext:
    """What a rule sees of one forward node (implemented by the algorithm in grad.py)."""

    node: Node
    graph: FinalGraph
    b: GradBuilder

    def op_as(self, kind: type[OpT]) -> OpT:
        """The node's op as the class the rule was registered for (its attributes typed)."""
        op = self.node.op
        if not isinstance(op, kind):
            raise unsupported(
                self.node,
                f"the rule for {kind.__name__} got a {type(op).__name__}",
                "register the rule under the op's own kind",
                rule="autodiff.rule_kind",
            )
        return op

    def input_desc(self, role: str) -> TensorDesc | None:
        """The forward descriptor of input `role` (None for a literal or an absent input)."""
        v = self.node.input(role)
        return self.graph.tensors[v] if isinstance(v, int) else None

    def tensor_desc(self, role: str) -> TensorDesc:
        """The forward descriptor of input `role`, which the op's checks made a tensor."""
        d = self.input_desc(role)
        if d is None:
            raise unsupported(
                self.node, f"input '{role}' is not a tensor", "pass a tensor there", rule="autodiff.operand"
            )
        return d

    def output_desc(self, role: str) -> TensorDesc | None:
        u = self.node.output(role)
        return None if u is None else self.graph.tensors[u]

    def result_desc(self, role: str) -> TensorDesc:
        """The forward descriptor of output `role`, which the node must have (see `has_output`)."""
        d = self.output_desc(role)
        if d is None:
            raise unsupported(
                self.node, f"the op has no output '{role}'", "declare the output", rule="autodiff.operand"
            )
        return d

    def has_input(self, role: str) -> bool:
        return self.node.input(role) is not None

    def has_output(self, role: str) -> bool:
        return self.node.output(role) is not None

    def input(self, role: str) -> Value | None:  # pragma: no cover - implemented in grad.py
        raise NotImplementedError

    def value(self, role: str) -> Value:
        """`input(role)` of an input the op must have (a tensor or a literal)."""
        v = self.input(role)
        if v is None:
            raise unsupported(self.node, f"input '{role}' is not set", "pass it", rule="autodiff.operand")
        return v

    def tensor(self, role: str) -> Tensor:
        """`input(role)` of an input the op's checks made a tensor."""
        v = self.input(role)
        if not isinstance(v, Tensor):
            raise unsupported(
                self.node, f"input '{role}' is {v!r}, not a tensor", "pass a tensor there", rule="autodiff.operand"
            )
        return v

    def output(self, role: str) -> Tensor:  # pragma: no cover
        raise NotImplementedError

    def grad(self, role: str) -> Tensor | None:  # pragma: no cover
        raise NotImplementedError

    def incoming(self, role: str) -> Tensor:
        """`grad(role)` of the output a gradient arrives at (a rule runs only when one arrives, so for
        an op differentiated through one output, that output's)."""
        g = self.grad(role)
        if g is None:
            raise unsupported(
                self.node,
                f"no gradient arrives at output '{role}'",
                "differentiate the op through the outputs its rule takes",
                rule="autodiff.output",
            )
        return g

    def grad_full(self, role: str) -> Tensor:  # pragma: no cover
        raise NotImplementedError

    def needs(self, role: str) -> bool:  # pragma: no cover
        raise NotImplementedError
