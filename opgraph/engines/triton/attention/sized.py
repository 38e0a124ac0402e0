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
from .spec import AttnSpec, Operand, Paged, Ragged


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


def _ragged(r: Ragged, sizes: Sizes) -> Ragged:
    return dataclasses.replace(r, offsets=_operand(r.offsets, sizes), tokens=_wrap(r.tokens, sizes))


def _paged(p: Paged, sizes: Sizes) -> Paged:
    rows = _ragged(p.rows, sizes) if p.rows is not None else None
    return dataclasses.replace(p, table=_operand(p.table, sizes), pages=_wrap(p.pages, sizes), rows=rows)


def sized_spec(spec: AttnSpec, sizes: Sizes) -> AttnSpec:
    """The spec of a symbolic piece with its dynamic sizes as `Size`s (of parameters of `sizes`): the
    packed tensors' token counts and the page tables' operands too."""
    changes: dict[str, Any] = {"sizes": sizes}
    for f in dataclasses.fields(spec):
        value = getattr(spec, f.name)
        if isinstance(value, Operand):
            changes[f.name] = _operand(value, sizes)
        elif isinstance(value, Expr):
            changes[f.name] = Size(value, sizes)
        elif f.name == "bias_dims" and value is not None:
            changes[f.name] = tuple(_wrap(d, sizes) for d in value)
    changes["ragged"] = tuple((role, _ragged(r, sizes)) for role, r in spec.ragged)
    changes["paged"] = tuple((role, _paged(p, sizes)) for role, p in spec.paged)
    return dataclasses.replace(spec, **changes)


__all__ = ["Size", "divides", "nonzero", "sized_spec", "symint", "upper"]
