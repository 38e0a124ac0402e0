"""Layout ops: reshape, transpose, slice, concatenate. They move data and never round it
(`MOVES_DATA_ONLY`); each output's type defaults to its input's (not to the graph's io /
intermediate type), and compute_data_type has no effect on them.

reshape(x, dim)          y has dims `dim` (or the output's set_dim when `dim` is None, as in cuDNN,
                         whose reshape takes no dims); numel(y) == numel(x). One entry of `dim` may
                         be -1 (inferred). Elements keep their logical row-major order:
                         y.flat[i] == x.flat[i] with `.flat` in row-major order of the *logical* dims,
                         whatever the strides (cuDNN's reshape_mode LOGICAL). y is packed row-major.
transpose(x, perm)       y.dim[i] = x.dim[perm[i]];  y[j_0, ..., j_r-1] = x[i] with i[perm[k]] = j_k
                         (output axis k reads input axis perm[k], like torch.permute). y's strides
                         are the input's memory order carried along with its axes: output axis k gets
                         the place in memory that input axis perm[k] had, packed. For a packed x that
                         is exactly y.stride[k] = x.stride[perm[k]], so the transpose is a copy of
                         the same bytes in the same order (a view, zero data movement in a fused
                         kernel). `strides_like(x)` would instead keep *output axis k* where *input
                         axis k* was, i.e. physically move the data; set_stride asks for that.
slice(x, slices)         y = x[s_0, s_1, ...] with Python slice semantics per axis (negative indices
                         count from the end, out-of-range bounds clamp), step >= 1; axes past the
                         given slices are taken whole. Every axis must keep >= 1 element. Stored as
                         Python's (start, stop, step) int triples, None made explicit (start 0,
                         stop 2**63 - 1, step 1); negative and out-of-range bounds are normalised
                         against the input's dims at inference (`Slice.bounds`), so the attribute
                         stays right if the input's dims change after the builder call.
                         y is packed in the input's axis order.
slice_backward(dy)       dx = zeros of dims `in_dim` with dy written where slice `slices` reads:
                         dx[s_0, s_1, ...] = dy (the gradient of slice; autodiff emits it, no
                         builder). `slices` are normalised (start, stop, step) triples, one per axis
                         of dx; dy has the slice's dims. dx is packed in dy's axis order, of the
                         graph's default type (intermediate when virtual, io when an output).
concatenate(xs, axis)    y = the inputs joined along `axis` (all other dims equal, one data type);
                         y is packed in the first input's axis order. in_place_index (cuDNN) says
                         that input already sits in its slot of y's memory, so an engine may skip
                         copying it; it does not change the values.
"""

from __future__ import annotations

import builtins
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.errors import AttributeValueError, DataTypeError, InternalError, ShapeError
from ..core.op import NodeContext, Op, TensorSpec, check_counts, graph_method, register_op
from ..core.symbolic import Dim, Expr, provably_le, provably_lt
from ..core.symbolic import bounds as size_bounds
from ..core.tensor import INT64_MAX, Tensor, TensorDesc, format_dims, packed_strides, stride_order
from .base import strides_like
from .custom import LEGACY_CUSTOM, Param

# -- reshape -----------------------------------------------------------------------------------------


@register_op
@dataclass(frozen=True, kw_only=True)
class Reshape(Op):
    """y = x's elements, in logical row-major order, in dims `dim` (see the module docstring)."""

    kind = "reshape"
    DYNAMIC = True
    INPUTS = ("input",)
    OUTPUTS = ("output",)
    MOVES_DATA_ONLY = True
    dim: tuple[int, ...] | None = None

    def _target(self, ctx: NodeContext, x: TensorDesc) -> tuple[int, ...] | None:
        if self.dim is None:
            out = ctx.output("output")
            return None if out is None or out.dim is None else tuple(out.dim)
        bad = [d for d in self.dim if isinstance(d, int) and d < 1 and d != -1]
        if not self.dim or bad or list(self.dim).count(-1) > 1:
            ctx.error(
                AttributeValueError,
                f"reshape dims {list(self.dim)} are not a shape (entries >= 1, at most one -1)",
                tensor="input",
                rule="reshape.dim",
                hint="give dims >= 1; one -1 stands for the remaining size",
            )
        if -1 not in self.dim:
            return tuple(self.dim)
        known = math.prod(d for d in self.dim if d != -1)
        left = x.numel % known if isinstance(known, int) else x.numel
        if not isinstance(left, int):  # (a dynamic element count, or a dynamic target)
            ctx.error(
                ShapeError,
                f"input dims {format_dims(x.dim)} do not provably fit dims {format_dims(self.dim)} for every "
                "value of their dynamic dims",
                tensor="input",
                rule="reshape.numel",
                hint="give the output's dims in full (set_dim) or keep the dynamic dims as whole factors",
            )
        if left:
            ctx.error(
                ShapeError,
                f"input dims {list(x.dim)} ({x.numel} elements) do not fit dims {list(self.dim)}: "
                f"{x.numel} is not a multiple of {known}",
                tensor="input",
                rule="reshape.numel",
                hint="choose dims whose product is the input's element count",
            )
        return tuple(x.numel // known if d == -1 else d for d in self.dim)

    def infer(self, ctx: NodeContext) -> list[TensorSpec]:
        x = ctx.tensor("input")
        dim = self._target(ctx, x)
        return [TensorSpec(dim, None if dim is None else packed_strides(dim), x.data_type)]

    def check(self, ctx: NodeContext) -> None:
        x = ctx.tensor("input")
        y = ctx.output("output")
        assert isinstance(y, TensorDesc)
        if y.numel != x.numel:
            ctx.error(
                ShapeError,
                f"output dims {list(y.dim)} hold {y.numel} elements but the input dims {list(x.dim)} hold {x.numel}",
                tensor="output",
                rule="reshape.numel",
                hint="choose output dims whose product is the input's element count",
            )

    def reference(self, ins, outs):
        x = ins[0]
        assert x is not None and outs[0] is not None
        return [np.reshape(x, outs[0].dim)]  # logical row-major (C) order


# -- transpose ---------------------------------------------------------------------------------------


@register_op
@dataclass(frozen=True, kw_only=True)
class Transpose(Op):
    """Output axis k is input axis permutation[k] (see the module docstring for the strides)."""

    kind = "transpose"
    DYNAMIC = True
    INPUTS = ("input",)
    OUTPUTS = ("output",)
    MOVES_DATA_ONLY = True
    permutation: tuple[int, ...]

    def infer(self, ctx: NodeContext) -> list[TensorSpec]:
        x = ctx.tensor("input")
        perm = tuple(self.permutation)
        if sorted(perm) != list(range(len(x.dim))):
            ctx.error(
                AttributeValueError,
                f"permutation {list(perm)} is not a permutation of the input's {len(x.dim)} axes (dims {list(x.dim)})",
                tensor="input",
                rule="transpose.permutation",
                hint=f"list each axis 0..{len(x.dim) - 1} exactly once; output axis k reads input axis permutation[k]",
            )
        dim = tuple(x.dim[p] for p in perm)
        # the input's memory order, carried along with its axes (a packed input: x.stride[perm[k]])
        stride = packed_strides(dim, stride_order(tuple(x.stride[p] for p in perm)))
        return [TensorSpec(dim, stride, x.data_type)]

    def reference(self, ins, outs):
        x = ins[0]
        assert x is not None
        return [np.transpose(x, self.permutation)]


# -- slice ---------------------------------------------------------------------------------------------


def _slice_triple(s: Any, axis: int, name: str) -> tuple[int, int, int]:
    if not isinstance(s, builtins.slice):
        raise AttributeValueError(
            f"slices[{axis}] is {s!r}, not a Python slice",
            op=f"slice '{name}'",
            rule="slice.type",
            hint="pass one slice object per axis, e.g. [slice(None), slice(2, 10, 2)] (an int index would drop "
            "the axis: use slice(i, i + 1))",
        )
    for what, v in (("start", s.start), ("stop", s.stop), ("step", s.step)):
        if what != "step" and isinstance(v, (Expr, Dim)):  # a dynamic bound (`seq - 1`): proved at inference
            continue
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer))):
            raise AttributeValueError(
                f"slices[{axis}].{what} is {v!r}, not an int or None",
                op=f"slice '{name}'",
                rule="slice.type",
                hint="slice bounds and steps are ints (or None)",
            )
    step = 1 if s.step is None else int(s.step)
    return (_bound(s.start, 0), _bound(s.stop, INT64_MAX), step)  # a dynamic bound is an Expr (see TensorDesc.dim)


def _bound(v: Any, default: int) -> Any:
    """A slice bound as an int, or an Expr where it is dynamic; `default` for None."""
    if v is None:
        return default
    if isinstance(v, Dim):
        return Expr.of(v)
    return v if isinstance(v, Expr) else int(v)


def _dynamic_bounds(
    ctx: NodeContext | None, axis: int, given: tuple[int, int, int], size: Expr
) -> tuple[int, int, int]:
    """(start, stop, step) on a dynamic axis, the same for its whole range: to the axis' end
    (`(start, size, 1)`, start below the smallest size), or ints within its smallest size. Negative
    indices, steps to the end and a stop past the smallest size are refused."""
    start, stop, step = given
    if (
        (isinstance(stop, Expr) or isinstance(start, Expr))
        and step == 1
        and provably_le(0, start)
        and provably_le(stop, size)
        and provably_lt(start, stop)
    ):
        # dynamic bounds within the axis over the whole range (x[:seq - 1]; x[:, seq:2*seq], a part
        # of a concatenation along a dynamic axis)
        return (start, stop, 1)
    if step == 1 and provably_le(size, stop) and 0 <= start and provably_lt(start, size):
        return (start, size, 1)  # type: ignore[return-value]  # to the end (a dynamic size: see TensorDesc.dim)
    lowest = size_bounds(size)[0]
    if (
        isinstance(stop, Expr)
        or isinstance(start, Expr)
        or start < 0
        or stop < 0
        or not provably_le(stop, size)
        or start >= stop
    ):
        if ctx is None:
            raise InternalError(f"slice bounds {given} of a dynamic axis passed validation")
        ctx.error(
            ShapeError,
            f"slices[{axis}] = {start}:{stop}:{step} on the dynamic axis {axis} (size {size}, at least "
            f"{lowest}) selects a length that depends on the size",
            tensor="input",
            rule="slice.dynamic",
            hint=f"take the whole axis, or non-negative bounds within its smallest size {lowest} (narrow the Dim's range)",
        )
    return (start, stop, step)


def slice_length(bounds: tuple[Any, Any, Any]) -> Any:
    """The elements a normalised (start, stop, step) selects: `stop - start` where a bound is dynamic
    (steps are 1 there), else len(range(...))."""
    start, stop, step = bounds
    if isinstance(start, Expr) or isinstance(stop, Expr):
        return stop - start
    return len(range(start, stop, step))


def _backward_bounds_ok(bounds: tuple[Any, Any, Any], size: Any) -> bool:
    """Whether (start, stop, step) is a normalised, non-empty slice of an axis of `size` (for every
    value of a dynamic size: step 1, int start >= 0, start < stop <= size over the whole range)."""
    start, stop, step = bounds
    if isinstance(start, Expr) or isinstance(stop, Expr) or isinstance(size, Expr):
        return step == 1 and provably_le(0, start) and provably_lt(start, stop) and provably_le(stop, size)
    return step >= 1 and builtins.slice(start, stop, step).indices(size) == bounds and bool(range(*bounds))


@register_op
@dataclass(frozen=True, kw_only=True)
class Slice(Op):
    """y = x[slices...] with Python slice semantics, step >= 1 (see the module docstring)."""

    kind = "slice"
    DYNAMIC = True
    INPUTS = ("input",)
    OUTPUTS = ("output",)
    MOVES_DATA_ONLY = True
    slices: tuple[tuple[int, int, int], ...]

    def bounds(self, ctx: NodeContext | None, dim: tuple[int, ...]) -> tuple[tuple[int, int, int], ...]:
        """The normalised (start, stop, step) of every axis of an input of dims `dim`."""
        if ctx is not None and len(self.slices) > len(dim):
            ctx.error(
                ShapeError,
                f"{len(self.slices)} slices given for an input of rank {len(dim)} (dims {list(dim)})",
                tensor="input",
                rule="slice.rank",
                hint="give at most one slice per input axis",
            )
        out = []
        for axis, size in enumerate(dim):
            if axis >= len(self.slices):
                out.append((0, size, 1))
                continue
            start, stop, step = self.slices[axis]
            if ctx is not None and step < 1:
                ctx.error(
                    AttributeValueError,
                    f"slices[{axis}] has step {step}; steps must be >= 1",
                    tensor="input",
                    rule="slice.step",
                    hint="use a positive step (reverse an axis with another op)",
                )
            if isinstance(size, Expr):
                out.append(_dynamic_bounds(ctx, axis, (start, stop, step), size))
                continue
            if isinstance(stop, Expr) or isinstance(start, Expr):
                # dynamic bounds on a static axis (a learned position table read as pos[:seq]): step 1,
                # within the axis over the whole range
                if step == 1 and provably_le(0, start) and provably_lt(start, stop) and provably_le(stop, size):
                    out.append((start, stop, 1))
                    continue
                if ctx is None:
                    raise InternalError(f"dynamic bounds {start}:{stop} on the static axis {axis} passed validation")
                ctx.error(
                    ShapeError,
                    f"slices[{axis}] = {start}:{stop}:{step} on the static axis {axis} (size {size}) is not within "
                    "the axis for every value of the dynamic dims",
                    tensor="input",
                    rule="slice.dynamic",
                    hint="give bounds 0 <= start < stop <= the axis' size over the whole range, step 1 (narrow "
                    "the Dim's range), or int bounds",
                )
            start, stop, step = builtins.slice(start, stop, step).indices(size)
            if ctx is not None and len(range(start, stop, step)) == 0:
                ctx.error(
                    ShapeError,
                    f"slices[{axis}] = {start}:{stop}:{step} selects no element of axis {axis} "
                    f"(size {size}, input dims {list(dim)})",
                    tensor="input",
                    rule="slice.empty",
                    hint="every axis of the output must keep at least one element",
                )
            out.append((start, stop, step))
        return tuple(out)

    def infer(self, ctx: NodeContext) -> list[TensorSpec]:
        x = ctx.tensor("input")
        dim = tuple(slice_length(b) for b in self.bounds(ctx, x.dim))
        return [TensorSpec(dim, strides_like(dim, x), x.data_type)]

    def reference(self, ins, outs):
        x = ins[0]
        assert x is not None
        return [x[tuple(builtins.slice(*b) for b in self.bounds(None, x.shape))]]


@register_op
@dataclass(frozen=True, kw_only=True)
class SliceBackward(Op):
    """dx = zeros of dims `in_dim`, dy written at the positions slice `slices` reads (the gradient of
    slice; see the module docstring)."""

    kind = "slice_backward"
    DYNAMIC = True  # (in_dim and slices may hold dynamic sizes: steps 1 there, bounds proved over the range)
    INPUTS = ("grad",)
    OUTPUTS = ("dx",)
    in_dim: tuple[int, ...]
    slices: tuple[tuple[int, int, int], ...]

    def infer(self, ctx: NodeContext) -> list[TensorSpec]:
        dy = ctx.tensor("grad")
        if not self.in_dim or any(size_bounds(d)[0] < 1 for d in self.in_dim) or len(self.slices) != len(self.in_dim):
            ctx.error(
                AttributeValueError,
                f"in_dim {list(self.in_dim)} with {len(self.slices)} slices: dx needs dims of "
                "at least 1 and one (start, stop, step) per axis",
                tensor="grad",
                rule="slice_backward.rank",
                hint="build it through autodiff's slice rule, which takes both from the forward slice",
            )
        for axis, (bounds, size) in enumerate(zip(self.slices, self.in_dim)):
            start, stop, step = bounds
            if not _backward_bounds_ok(bounds, size):
                ctx.error(
                    AttributeValueError,
                    f"slices[{axis}] = {start}:{stop}:{step} is not a normalised, non-empty "
                    f"slice of an axis of size {size}",
                    tensor="grad",
                    rule="slice_backward.bounds",
                    hint="give Slice.bounds' (start, stop, step): 0 <= start < size, stop <= size, step >= 1",
                )
        want = tuple(slice_length(b) for b in self.slices)
        if tuple(dy.dim) != want:
            ctx.error(
                ShapeError,
                f"dy has dims {list(dy.dim)}; the slice {list(self.slices)} of {list(self.in_dim)} has {list(want)}",
                tensor="grad",
                rule="slice_backward.dims",
                hint="pass the gradient of the slice's output",
            )
        return [TensorSpec(self.in_dim, strides_like(self.in_dim, dy))]

    def reference(self, ins, outs):
        dy = ins[0]
        assert dy is not None
        dx = np.zeros(self.in_dim)
        dx[tuple(builtins.slice(*b) for b in self.slices)] = dy
        return [dx]


def _slice_backward_from_params(params: dict[str, Param]) -> SliceBackward:
    """The legacy custom op's text parameters: bounds "start:stop:step,..." and in_dim "2,3,4"."""
    try:
        bounds = tuple(tuple(int(v) for v in item.split(":")) for item in str(params["bounds"]).split(","))
        in_dim = tuple(int(v) for v in str(params["in_dim"]).split(","))
    except (KeyError, ValueError) as err:
        raise AttributeValueError(
            f"slice_backward's parameters bounds / in_dim do not parse ({type(err).__name__}: {err})",
            rule="slice_backward.params",
            hint="bounds is 'start:stop:step' per axis and in_dim comma-separated ints",
        ) from None
    if any(len(b) != 3 for b in bounds):
        raise AttributeValueError(
            f"slice_backward's bounds {params['bounds']!r} need start:stop:step per axis",
            rule="slice_backward.params",
            hint="give three ints per axis",
        )
    return SliceBackward(in_dim=in_dim, slices=tuple((b[0], b[1], b[2]) for b in bounds))


LEGACY_CUSTOM.register(SliceBackward.kind, _slice_backward_from_params)


# the ops whose output may be a view of their input's memory: kernels read them in place (GEMM operands,
# attention's q/k/v, the pointwise template), and the graph's order places them next to their readers
# (graph/placement.py)
VIEW_KINDS = (Slice.kind, Transpose.kind, Reshape.kind)


# -- concatenate ---------------------------------------------------------------------------------------


@register_op
@dataclass(frozen=True, kw_only=True)
class Concatenate(Op):
    """y = inputs joined along `axis` (see the module docstring). Roles input0 .. input{n-1}."""

    kind = "concatenate"
    DYNAMIC = True
    OUTPUTS = ("output",)
    MOVES_DATA_ONLY = True
    num_inputs: int
    axis: int
    in_place_index: int | None = None

    def __post_init__(self) -> None:
        check_counts(num_inputs=self.num_inputs)

    def input_roles(self) -> tuple[str, ...]:
        return tuple(f"input{i}" for i in range(self.num_inputs))

    def infer(self, ctx: NodeContext) -> list[TensorSpec]:
        roles = self.input_roles()
        if not roles:
            ctx.error(
                AttributeValueError,
                "concatenate has no inputs",
                rule="concatenate.count",
                hint="pass a list of at least one tensor",
            )
        xs = [ctx.tensor(r) for r in roles]
        first = xs[0]
        rank = len(first.dim)
        if not -rank <= self.axis < rank:
            ctx.error(
                AttributeValueError,
                f"axis {self.axis} is outside the inputs' rank {rank} (dims {list(first.dim)})",
                tensor=roles[0],
                rule="concatenate.axis",
                hint=f"pick an axis in [{-rank}, {rank - 1}]",
            )
        axis = self.axis % rank
        for role, x in zip(roles[1:], xs[1:]):
            if len(x.dim) != rank:
                ctx.error(
                    ShapeError,
                    f"input '{role}' has rank {len(x.dim)} (dims {list(x.dim)}) but input0 has rank "
                    f"{rank} (dims {list(first.dim)})",
                    tensor=role,
                    rule="concatenate.rank",
                    hint="give every input the same rank",
                )
            off = [a for a in range(rank) if a != axis and x.dim[a] != first.dim[a]]
            if off:
                ctx.error(
                    ShapeError,
                    f"input '{role}' dims {list(x.dim)} differ from input0 dims {list(first.dim)} at "
                    f"axis {off[0]}, which is not the concatenation axis {axis}",
                    tensor=role,
                    rule="concatenate.dims",
                    hint=f"make every dim except axis {axis} equal across the inputs",
                )
            if x.data_type is not first.data_type:
                ctx.error(
                    DataTypeError,
                    f"input '{role}' has type {x.data_type.name} but input0 has "
                    f"{first.data_type.name}; concatenate moves data, it does not convert it",
                    tensor=role,
                    rule="concatenate.data_type",
                    hint="cast the inputs to one type first (e.g. g.identity)",
                )
        if self.in_place_index is not None and not 0 <= self.in_place_index < len(roles):
            ctx.error(
                AttributeValueError,
                f"in_place_index {self.in_place_index} is not an input index (there are {len(roles)} inputs)",
                tensor=roles[0],
                rule="concatenate.in_place_index",
                hint=f"pick an index in [0, {len(roles) - 1}] or leave it None",
            )
        dim = list(first.dim)
        dim[axis] = sum(x.dim[axis] for x in xs)
        dim_t = tuple(dim)
        return [TensorSpec(dim_t, strides_like(dim_t, first), first.data_type)]

    def reference(self, ins, outs):
        assert all(x is not None for x in ins)
        return [np.concatenate(ins, axis=self.axis % ins[0].ndim)]


# -- builders (names and keyword arguments as in cuDNN frontend's Python API) -----------------------


def _dims(value: Any, name: str) -> tuple[int, ...]:
    try:
        out = tuple(value)
    except TypeError:
        out = None
    if out is None or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in out):
        raise AttributeValueError(
            f"dim must be a list of ints, got {value!r}",
            op=f"reshape '{name}'",
            rule="reshape.dim",
            hint="pass dims such as [8, -1] or leave dim=None and set_dim the output",
        )
    return tuple(int(v) for v in out)


@graph_method
def reshape(self, input, dim=None, compute_data_type=None, name=""):
    """The input's elements in new dims, in logical row-major order (cuDNN's LOGICAL reshape).

    Shapes: input x -> y with dims `dim` (one entry may be -1, inferred), numel(y) == numel(x).

    Layouts: any input strides; y is packed row-major. Elements keep their order in the *logical*
    dims, whatever the input's strides (an NHWC input is read as N, C, H, W).

    Types: y has the input's type (layout ops never round); compute_data_type has no effect.

    Formula: `y.flat[i] = x.flat[i]`, `.flat` in row-major order of the logical dims.

    Args:
        input: x.
        dim: the output's dims; None (cuDNN's way) leaves them to the output's `set_dim`.
        compute_data_type: unused (kept for cuDNN frontend compatibility).
        name: the op's name.

    Returns:
        y, a virtual tensor.

    Example:
        ```python
        heads = g.reshape(x, [8, 128, 12, 64])       # x [8, 128, 768]
        ```
    """
    op = Reshape(dim=None if dim is None else _dims(dim, name))
    return self._add_op(op, [input], name=name, compute_data_type=compute_data_type)[0]


@graph_method
def transpose(self, input, permutation, compute_data_type=None, name=""):
    """The input's axes permuted, like `torch.permute`.

    Shapes: input x of rank r -> y with `y.dim[k] = x.dim[permutation[k]]`.

    Layouts: y keeps the input's memory order carried along with the axes (for a packed x,
    `y.stride[k] = x.stride[permutation[k]]`: the same bytes, a view a fused kernel reads in place);
    set y's strides to make a physical copy in another order.

    Types: y has the input's type.

    Formula: `y[j_0, ..., j_{r-1}] = x[i]` with `i[permutation[k]] = j_k`.

    Args:
        input: x.
        permutation: output axis k reads input axis permutation[k].
        compute_data_type: unused.
        name: the op's name.

    Returns:
        y, a virtual tensor.

    Example:
        ```python
        kt = g.transpose(k, [0, 2, 1])               # [B, T, D] -> [B, D, T], no copy
        scores = g.matmul(q, kt)
        ```
    """
    try:
        perm = tuple(int(p) for p in permutation)
    except (TypeError, ValueError):
        raise AttributeValueError(
            f"permutation must be a list of ints, got {permutation!r}",
            op=f"transpose '{name}'",
            rule="transpose.permutation",
            hint="pass e.g. [0, 2, 3, 1]",
        ) from None
    return self._add_op(Transpose(permutation=perm), [input], name=name, compute_data_type=compute_data_type)[0]


@graph_method
def slice(self, input, slices, compute_data_type=None, name=""):  # noqa: A001 (cuDNN's name)
    """A strided window of the input, with Python slice semantics per axis.

    Shapes: y's dims are the slices' lengths; axes past the given slices are taken whole. Negative
    indices count from the end, out-of-range bounds clamp, steps >= 1, every axis keeps >= 1 element.

    Layouts: y is packed in the input's axis order; generated kernels read the slice in place.

    Types: y has the input's type.

    Formula: `y = x[s_0, s_1, ...]`.

    Args:
        input: x.
        slices: a Python slice or a list of them, one per leading axis.
        compute_data_type: unused.
        name: the op's name.

    Returns:
        y, a virtual tensor.

    Example:
        ```python
        first_half = g.slice(x, [slice(None), slice(0, 384)])     # x [B, 768] -> [B, 384]
        ```
    """
    if isinstance(slices, builtins.slice):
        slices = [slices]
    triples = tuple(_slice_triple(s, a, name) for a, s in enumerate(slices))
    return self._add_op(Slice(slices=triples), [input], name=name, compute_data_type=compute_data_type)[0]


@graph_method
def concatenate(self, inputs, axis, in_place_index=None, name=""):
    """The inputs joined along one axis.

    Shapes: inputs of one rank with equal dims except along `axis` -> y with their sizes summed there.

    Layouts: any input strides; y is packed in the first input's axis order.

    Types: all inputs of one type, which y has.

    Formula: `y[..., o_i + j, ...] = inputs[i][..., j, ...]`, o_i the sum of the earlier sizes.

    Args:
        inputs: the tensors to join, a list.
        axis: the axis to join along (negative counts from the end).
        in_place_index: cuDNN's hint that this input already sits in its slot of y's memory (an
            engine may skip copying it; values are unchanged).
        name: the op's name.

    Returns:
        y, a virtual tensor.

    Example:
        ```python
        y = g.concatenate([a, b], axis=1)          # [N, 32, H, W] + [N, 64, H, W] -> [N, 96, H, W]
        ```
    """
    if isinstance(inputs, Tensor) or not isinstance(inputs, (list, tuple)) or not inputs:
        raise AttributeValueError(
            f"inputs must be a non-empty list of tensors, got {inputs!r}",
            op=f"concatenate '{name}'",
            rule="concatenate.count",
            hint="pass the tensors to join as a list: g.concatenate([a, b], axis=1)",
        )
    op = Concatenate(
        num_inputs=len(inputs), axis=int(axis), in_place_index=None if in_place_index is None else int(in_place_index)
    )
    return self._add_op(op, list(inputs), name=name)[0]
