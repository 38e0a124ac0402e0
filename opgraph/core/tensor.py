"""Tensors: the mutable handle a user builds with (`Tensor`) and the frozen descriptor a finalized
graph is made of (`TensorDesc`).

Dims are logical (N, C, spatial... for images; batch..., M, K for matmul); the layout is the strides
alone, so NHWC is dims [N, C, H, W] with strides [H*W*C, 1, W*C, C].
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from .dtypes import DataType, as_data_type
from .errors import GraphError, ShapeError, printable
from .symbolic import Dim, Expr, SymInt, bounds, free_symbols

INT64_MAX = 2**63 - 1


def packed_strides(dim: Sequence[int], order: Sequence[int] | None = None) -> tuple[int, ...]:
    """Strides of a packed tensor. `order` lists axes from outermost to innermost (default: row-major).
    Dynamic dims (opgraph.core.symbolic) give expressions: [batch, seq, 64] -> [64*seq, 64, 1]."""
    order = list(range(len(dim))) if order is None else list(order)
    strides: list[Any] = [0] * len(dim)
    step: Any = 1
    for axis in reversed(order):
        strides[axis] = step
        d = dim[axis]
        step = step * (d if isinstance(d, (Expr, Dim)) else max(int(d), 1))  # a dynamic dim is >= 1
    return tuple(strides)


def order_value(value: SymInt) -> int:
    """A size as an int to order by: itself, or a dynamic size at its range's maximum (finalize proves
    that the order of a tensor's strides is the same over the whole range, so any point would do)."""
    return value if isinstance(value, int) else bounds(value)[1]


def stride_order(stride: Sequence[int]) -> tuple[int, ...]:
    """Axes from outermost to innermost by stride (ties keep the logical order). A broadcast axis
    (stride 0) has no place in memory: it keeps its logical place among the others, as PyTorch's
    TensorIterator orders them, where sorting it innermost would make an expanded operand's layout
    (ViT's class token, [1, 1, D] expanded over the batch) batch-innermost for everything after it."""
    values = [order_value(s) for s in stride]
    perm = list(range(len(stride)))
    for i in range(1, len(perm)):  # insertion sort; pairs with a broadcast axis compare as unordered
        at = i
        for j in range(i - 1, -1, -1):
            outer, inner = values[perm[j]], values[perm[at]]
            if outer == 0 or inner == 0:
                continue
            if outer >= inner:
                break
            perm[j], perm[at] = perm[at], perm[j]
            at = j
    return tuple(perm)


def format_dims(values: Sequence[Any]) -> str:
    """Dims or strides as a list, dynamic sizes as their text: `[batch, 64*seq, 1]`."""
    return "[" + ", ".join(str(v) for v in values) + "]"


def is_dynamic(values: Sequence[Any]) -> bool:
    """Whether any of the dims or strides is an expression of dynamic dims."""
    return any(isinstance(v, Expr) for v in values)


def channels_last_order(rank: int) -> tuple[int, ...]:
    """N, spatial..., C: the axis order of NHWC / NDHWC / NWC."""
    return (0, *range(2, rank), 1) if rank >= 3 else tuple(range(rank))


def layout_name(dim: Sequence[int], stride: Sequence[int], image: bool = False) -> str:
    """'row-major' for packed row-major strides; for an image tensor (its ops say its axes are N, C,
    spatial...) 'nchw' / 'nhwc' style names of packed image layouts; else the strides."""
    rank = len(dim)
    if rank == 0:
        return "scalar"
    names = {3: "ncw", 4: "nchw", 5: "ncdhw"}
    if image and rank in names:
        if tuple(stride) == packed_strides(dim):
            return names[rank]
        if tuple(stride) == packed_strides(dim, channels_last_order(rank)):
            base = names[rank]
            return base[0] + base[2:] + base[1]
    elif tuple(stride) == packed_strides(dim):
        return "row-major"
    return "strides[" + ",".join(str(s) for s in stride) + "]"


def storage_extent(dim: Sequence[int], stride: Sequence[int]) -> int:
    """Number of elements a buffer must hold for these dims and strides."""
    if any(isinstance(d, int) and d == 0 for d in dim):
        return 0
    return 1 + sum((d - 1) * s for d, s in zip(dim, stride))


def strided_view(base: np.ndarray, dim: Sequence[int], stride: Sequence[int]) -> np.ndarray:
    """A view of NumPy array `base` with these dims and element strides, from its first element.

    np.lib.stride_tricks.as_strided cannot take every ml_dtypes type (float8_e5m2's typestr '<f1'
    is not understood), so the view is made on an unsigned integer type of the same size."""
    dtype = base.dtype
    carrier = np.dtype(f"u{dtype.itemsize}")
    view = np.lib.stride_tricks.as_strided(
        base.view(carrier), shape=tuple(dim), strides=[s * dtype.itemsize for s in stride]
    )
    return view.view(dtype)


@dataclass(frozen=True)
class TensorDesc:
    """A fully known tensor of a finalized graph."""

    uid: int
    name: str
    # ints; in a graph with dynamic dims (opgraph.Dim) some are `Expr`s of them (typed int: only
    # finalize, the ops' rules and `FinalGraph.at` see such graphs; engines get `graph.at(shape)`)
    dim: tuple[int, ...]
    stride: tuple[int, ...]
    data_type: DataType
    is_virtual: bool = False
    is_pass_by_value: bool = False
    # kernels read the buffer's address from the plan's address table at run time (double buffering,
    # CUDA-graph updates without re-capture)
    is_by_reference: bool = False
    # its ops treat it as N, C, spatial... (set by finalize; only changes how its layout prints)
    is_image: bool = field(default=False, compare=False)

    @property
    def numel(self) -> int:
        return math.prod(self.dim)

    @property
    def nbytes(self) -> int:
        return storage_extent(self.dim, self.stride) * self.data_type.itemsize

    @property
    def is_dynamic(self) -> bool:
        """Whether a dim or stride depends on a dynamic dim (opgraph.Dim)."""
        return is_dynamic(self.dim) or is_dynamic(self.stride)

    def symbols(self) -> frozenset[Dim]:
        """The dynamic dims its dims and strides depend on."""
        return frozenset().union(*(free_symbols(v) for v in (*self.dim, *self.stride)))

    @property
    def is_scalar(self) -> bool:
        return self.numel == 1

    @property
    def layout(self) -> str:
        return layout_name(self.dim, self.stride, self.is_image)

    def label(self) -> str:
        return f"tensor '{printable(self.name or '<unnamed>')}' (uid {self.uid})"

    def type_str(self) -> str:
        dims = ",".join(str(d) for d in self.dim)
        text = f"{self.data_type.short}[{dims}]"
        if len(self.dim) > 1:
            text += f" {self.layout}"
        return text

    def __str__(self) -> str:
        flags = [
            f
            for f, on in (
                ("virtual", self.is_virtual),
                ("by-value", self.is_pass_by_value),
                ("by-reference", self.is_by_reference),
            )
            if on
        ]
        extra = f" ({', '.join(flags)})" if flags else ""
        return f"%{self.uid} '{printable(self.name)}': {self.type_str()}{extra}"


def _check_int_tuple(values: Any, what: str, tensor: Any, *, allow_zero: bool) -> tuple[int, ...]:
    try:
        items = tuple(values)
    except TypeError:
        raise ShapeError(
            f"{what} must be a sequence of ints, got {values!r}",
            tensor=tensor,
            rule=f"tensor.{what}",
            hint=f"pass {what} as a list such as [32, 64, 56, 56]",
        ) from None
    out: list[Any] = []  # ints and dynamic sizes (see TensorDesc.dim)
    for v in items:
        if isinstance(v, (Dim, Expr)):
            out.append(_check_symbolic(v, items, what, tensor, allow_zero=allow_zero))
            continue
        if isinstance(v, bool) or not hasattr(v, "__index__"):
            raise ShapeError(
                f"{what} must hold ints, got {values!r}",
                tensor=tensor,
                rule=f"tensor.{what}",
                hint=f"pass {what} as a list of Python ints",
            )
        v = int(v)
        if v < 0 or (v == 0 and not allow_zero) or v > INT64_MAX:
            raise ShapeError(
                f"{what} {list(items)} has an entry out of range ({v})",
                tensor=tensor,
                rule=f"tensor.{what}",
                hint="dims must be >= 1 and strides >= 0",
            )
        out.append(v)
    return tuple(out)


def _check_symbolic(value: Dim | Expr, items: tuple, what: str, tensor: Any, *, allow_zero: bool) -> SymInt:
    """A dynamic dim or stride: its lowest value over the range must be >= 1 (>= 0 for a stride)."""
    e: SymInt = Expr.of(value) if isinstance(value, Dim) else value
    if isinstance(e, int):
        return e
    lo, hi = bounds(e)
    if lo < (0 if allow_zero else 1) or hi > INT64_MAX:
        shown = [str(v) for v in items]
        raise ShapeError(
            f"{what} {shown} has the entry {e}, which can be {lo if lo < 1 else hi} within its dims' ranges",
            tensor=tensor,
            rule=f"tensor.{what}",
            hint="dims must be >= 1 and strides >= 0 for every value of their dynamic dims: narrow the Dim's "
            "range or change the expression",
        )
    return e


class Graph(Protocol):
    """What a Tensor handle needs of the graph that owns it (opgraph.Graph is one; the builder lives in
    the graph layer above this one)."""

    def _invalidate(self) -> None: ...

    def _inferred(self, t: Tensor) -> TensorDesc | None: ...


class Tensor:
    """A tensor of a graph under construction, as returned by `Graph.tensor` and every op builder.

    Setters return the tensor so they chain: ``y.set_output(True).set_data_type(HALF)``.
    """

    __slots__ = (
        "_graph",
        "_uid",
        "_name",
        "_dim",
        "_stride",
        "_data_type",
        "_is_virtual",
        "_is_pass_by_value",
        "_is_by_reference",
    )

    def __init__(
        self,
        graph: Graph,
        *,
        dim: Sequence[int] | None = None,
        stride: Sequence[int] | None = None,
        data_type: Any = None,
        name: str = "",
        uid: int | None = None,
        is_virtual: bool = False,
        is_pass_by_value: bool = False,
        is_by_reference: bool = False,
    ) -> None:
        self._graph = graph
        self._uid: int | None = None
        self._name = ""
        self._dim: tuple[int, ...] | None = None
        self._stride: tuple[int, ...] | None = None
        self._data_type: DataType | None = None
        self._is_virtual = bool(is_virtual)
        self._is_pass_by_value = bool(is_pass_by_value)
        self._is_by_reference = bool(is_by_reference)
        self.set_name(name)
        if uid is not None:
            self.set_uid(uid)
        if dim is not None:
            self.set_dim(dim)
        if stride is not None:
            self.set_stride(stride)
        if data_type is not None:
            self.set_data_type(data_type)

    # -- read access -------------------------------------------------------------------------
    @property
    def graph(self) -> Graph:
        return self._graph

    def _final_desc(self) -> TensorDesc | None:
        return self._graph._inferred(self)

    @property
    def uid(self) -> int | None:
        """The int64 UID; assigned by `Graph.validate()` when the user set none."""
        if self._uid is None and (d := self._final_desc()) is not None:
            return d.uid
        return self._uid

    @property
    def name(self) -> str:
        return self._name

    @property
    def dim(self) -> tuple[int, ...] | None:
        if self._dim is None and (d := self._final_desc()) is not None:
            return d.dim
        return self._dim

    @property
    def stride(self) -> tuple[int, ...] | None:
        if self._stride is None and (d := self._final_desc()) is not None:
            return d.stride
        return self._stride

    @property
    def data_type(self) -> DataType | None:
        if self._data_type is None and (d := self._final_desc()) is not None:
            return d.data_type
        return self._data_type

    @property
    def is_virtual(self) -> bool:
        return self._is_virtual

    @property
    def is_pass_by_value(self) -> bool:
        return self._is_pass_by_value

    @property
    def is_output(self) -> bool:
        return not self._is_virtual

    def get_uid(self) -> int | None:
        return self.uid

    def get_name(self) -> str:
        return self._name

    def get_dim(self) -> list[int] | None:
        return None if self.dim is None else list(self.dim)

    def get_stride(self) -> list[int] | None:
        return None if self.stride is None else list(self.stride)

    def get_data_type(self) -> DataType | None:
        return self.data_type

    def get_is_virtual(self) -> bool:
        return self._is_virtual

    def get_is_pass_by_value(self) -> bool:
        return self._is_pass_by_value

    def label(self) -> str:
        uid = "unassigned" if self.uid is None else self.uid
        return f"tensor '{self._name or '<unnamed>'}' (uid {uid})"

    # -- where the value must be known (set, or inferred by `Graph.validate()`) -------------------
    def _unknown(self, what: str) -> GraphError:
        return GraphError(
            f"the {what} is not known yet",
            tensor=self,
            rule="tensor.unknown",
            hint="set it, or validate the graph (g.validate()) so that it is inferred",
        )

    def known_uid(self) -> int:
        """`uid`, which must be known here: the user's, or the one `Graph.validate()` assigned."""
        uid = self.uid
        if uid is None:
            raise self._unknown("UID")
        return uid

    def known_dim(self) -> tuple[int, ...]:
        """`dim`, which must be known here (set or inferred)."""
        dim = self.dim
        if dim is None:
            raise self._unknown("dims")
        return dim

    def known_stride(self) -> tuple[int, ...]:
        """`stride`, which must be known here (set or inferred)."""
        stride = self.stride
        if stride is None:
            raise self._unknown("strides")
        return stride

    def known_data_type(self) -> DataType:
        """`data_type`, which must be known here (set or inferred)."""
        data_type = self.data_type
        if data_type is None:
            raise self._unknown("data type")
        return data_type

    # -- chainable setters ---------------------------------------------------------------------
    def _touch(self) -> Tensor:
        self._graph._invalidate()
        return self

    def set_output(self, is_output: bool = True) -> Tensor:
        """Mark a tensor as a graph output (non-virtual, bound in the variant pack) or back to virtual."""
        self._is_virtual = not bool(is_output)
        return self._touch()

    def set_is_virtual(self, is_virtual: bool = True) -> Tensor:
        self._is_virtual = bool(is_virtual)
        return self._touch()

    @property
    def is_by_reference(self) -> bool:
        return self._is_by_reference

    def set_is_by_reference(self, is_by_reference: bool = True) -> Tensor:
        """Generated kernels read this buffer's address from the plan's address table at run time, so
        a new address (plan.set_address) redirects even a captured CUDA graph."""
        self._is_by_reference = bool(is_by_reference)
        return self._touch()

    def set_is_pass_by_value(self, is_pass_by_value: bool = True) -> Tensor:
        self._is_pass_by_value = bool(is_pass_by_value)
        return self._touch()

    def set_uid(self, uid: int) -> Tensor:
        if isinstance(uid, bool) or not hasattr(uid, "__index__") or not (0 <= int(uid) <= INT64_MAX):
            from .errors import DuplicateUIDError

            raise DuplicateUIDError(
                f"UID must be an int in [0, 2**63 - 1], got {uid!r}",
                tensor=self,
                rule="tensor.uid",
                hint="pick a non-negative int64 UID, or leave uid=None to have one assigned",
            )
        self._uid = int(uid)
        return self._touch()

    def set_name(self, name: str) -> Tensor:
        self._name = str(name)
        return self._touch()

    def set_dim(self, dim: Sequence[Any]) -> Tensor:
        """The dims: ints, dynamic dims (`opgraph.Dim`) or expressions of them (`batch * seq`)."""
        self._dim = _check_int_tuple(dim, "dim", self, allow_zero=False)
        return self._touch()

    def set_stride(self, stride: Sequence[Any]) -> Tensor:
        self._stride = _check_int_tuple(stride, "stride", self, allow_zero=True)
        return self._touch()

    def set_data_type(self, data_type: Any) -> Tensor:
        self._data_type = as_data_type(data_type)
        return self._touch()

    def __repr__(self) -> str:
        dims = "?" if self._dim is None else ",".join(str(d) for d in self._dim)
        dt = "?" if self._data_type is None else self._data_type.short
        kind = "virtual" if self._is_virtual else "io"
        return f"<Tensor {self.label()} {dt}[{dims}] {kind}>"


def _smaller(a: Any, b: Any) -> str | None:
    """Which of two unequal products of dims to extend by the next dim ("a" or "b"): the smaller int;
    over dynamic dims the one of lower degree (b vs b*s), None where that does not tell (b vs s). A
    wrong guess cannot make a wrong view: the groups must end exactly equal."""
    if isinstance(a, int) and isinstance(b, int):
        return "a" if a < b else "b"
    da, db = _degree(a), _degree(b)
    return None if da == db else "a" if da < db else "b"


def _degree(x: Any) -> int:
    if isinstance(x, int):
        return 0
    terms = getattr(x, "terms", None)
    return 1 if terms is None else max(len(mono) for mono, _ in terms)


def reshape_strides(old: Sequence[int], strides: Sequence[int], new: Sequence[int]) -> tuple[int, ...] | None:
    """Strides that show memory of dims `old` / `strides` as dims `new` (same elements, logical
    row-major order), or None where the axes merged or split are not one run in memory (numpy's
    no-copy reshape rule)."""
    src = [(d, s) for d, s in zip(old, strides) if d != 1]
    axes = [i for i, d in enumerate(new) if d != 1]
    out = [0] * len(new)
    i = j = 0
    while i < len(src) and j < len(axes):
        i_end, j_end, a, b = i, j, src[i][0], new[axes[j]]
        while a != b:
            grow = _smaller(a, b)
            if grow is None:
                return None
            if grow == "a" and i_end + 1 < len(src):
                i_end += 1
                a *= src[i_end][0]
            elif grow == "b" and j_end + 1 < len(axes):
                j_end += 1
                b *= new[axes[j_end]]
            else:
                return None
        if any(src[k][1] != src[k + 1][1] * src[k + 1][0] for k in range(i, i_end)):
            return None
        step = src[i_end][1]
        for k in range(j_end, j - 1, -1):
            out[axes[k]] = step
            step *= new[axes[k]]
        i, j = i_end + 1, j_end + 1
    if i != len(src) or j != len(axes):
        return None
    step = 1
    for k in range(len(new) - 1, -1, -1):  # unit axes: the stride a packed layout would give them
        if new[k] == 1:
            out[k] = step
        else:
            step = out[k] * new[k]
    return tuple(out)
