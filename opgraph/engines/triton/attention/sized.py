"""Attention kernels taking their sizes at run time (a dynamic plan's bucket kernel: ../sizes.py).

The spec of the piece's symbolic origin holds expressions of the dynamic dims where the static spec
holds ints (batch, Sq, Skv and the strides they set). `sized_spec` wraps each one in a `Size`: it
computes like its expression (`num_m - 1`, `B * H`), prints in the kernel's text as the size parameter
holding its value (sizes.Sizes.text: `sz0`; a multiple of a constant, such as a stride `64*seq`, as
`(sz0 * 64)` so that Triton knows the offsets' alignment: gemm.template.divisible_text), and has no
truth value and no order, so that a decision
the generator makes by a size raises TypeError (the template then generates the piece at its shape)
unless it says how over the bucket (`divides`, `upper`, `nonzero`). The kernel's launch grid is then
an expression evaluated per shape (KernelText.launch)."""

from __future__ import annotations

import dataclasses
from typing import Any, cast

from ....core.symbolic import Expr, SymInt
from ..gemm.template import divisible_text
from ..sizes import Sizes
from ..sizes import divides as divides_size
from .spec import AttnSpec, Operand


class Size:
    """A dynamic size in the generator (see the module docstring)."""

    __slots__ = ("expr", "sizes")

    def __init__(self, expr: Expr, sizes: Sizes) -> None:
        self.expr, self.sizes = expr, sizes

    def _wrap(self, value: SymInt) -> Any:
        return Size(value, self.sizes) if isinstance(value, Expr) else value

    def __str__(self) -> str:
        return divisible_text(self.sizes)(self.expr)

    def __format__(self, spec: str) -> str:
        return str(self)

    def __repr__(self) -> str:
        return f"Size({self.expr})"

    def __add__(self, other: Any) -> Any:
        return self._wrap(self.expr + symint(other))

    __radd__ = __add__

    def __sub__(self, other: Any) -> Any:
        return self._wrap(self.expr - symint(other))

    def __rsub__(self, other: Any) -> Any:
        return self._wrap(symint(other) - self.expr)

    def __mul__(self, other: Any) -> Any:
        return self._wrap(self.expr * symint(other))

    __rmul__ = __mul__

    def __floordiv__(self, other: Any) -> Any:
        return self._wrap(self.expr // symint(other))

    def __mod__(self, other: Any) -> Any:
        return self._wrap(self.expr % symint(other))

    def __neg__(self) -> Any:
        return self._wrap(-self.expr)

    def __bool__(self) -> bool:
        raise TypeError(f"the truth of the dynamic size {self.expr} is decided per shape")

    def __eq__(self, other: object) -> bool:
        raise TypeError(f"the dynamic size {self.expr} is compared per shape")

    __ne__ = __eq__

    def __hash__(self) -> int:
        return hash(self.expr)


def symint(value: Any) -> SymInt:
    """A size as an int or an expression (a Size's expression)."""
    return value.expr if isinstance(value, Size) else value


def divides(n: int, value: Any) -> bool:
    """Whether `n` divides a size at every shape (tiles needing no bounds mask)."""
    return divides_size(n, symint(value))


def upper(value: Any) -> int:
    """The largest a size gets (in the bucket, for a Size)."""
    return value.sizes.max(value.expr) if isinstance(value, Size) else value


def nonzero(stride: Any) -> bool:
    """Whether a stride steps (a dynamic one always does: 0 only stands for a broadcast axis)."""
    return isinstance(stride, Size) or stride != 0


def _wrap(value: Any, sizes: Sizes) -> Any:
    return Size(value, sizes) if isinstance(value, Expr) else value


def _operand(op: Operand, sizes: Sizes) -> Operand:
    return dataclasses.replace(
        op, strides=tuple(_wrap(s, sizes) for s in op.strides), offset=cast(int, _wrap(op.offset, sizes))
    )


def _sized(value: Any, sizes: Sizes) -> Any:
    """`value` (a spec field) with every dynamic size in it a `Size`, nested ones included: an operand's
    strides and offset, a packed tensor's token count, a page table's slots, a dropout mask's operand.
    (A size left an expression would print as its dim's name in the kernel's text.)"""
    if isinstance(value, Expr):
        return Size(value, sizes)
    if isinstance(value, Operand):
        return _operand(value, sizes)
    if isinstance(value, tuple):
        return tuple(_sized(v, sizes) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {f.name: _sized(getattr(value, f.name), sizes) for f in dataclasses.fields(value) if f.init}
        return dataclasses.replace(value, **changes)
    return value


def sized_spec(spec: AttnSpec, sizes: Sizes) -> AttnSpec:
    """The spec of a symbolic piece with its dynamic sizes as `Size`s (of parameters of `sizes`), in
    every field and the dataclasses in them (`_sized`)."""
    changes = {f.name: _sized(getattr(spec, f.name), sizes) for f in dataclasses.fields(spec) if f.name != "sizes"}
    return dataclasses.replace(spec, sizes=sizes, **changes)


__all__ = ["Size", "divides", "nonzero", "sized_spec", "symint", "upper"]
