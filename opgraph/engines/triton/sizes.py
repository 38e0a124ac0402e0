"""How a generated kernel spells its sizes (docs/design/dynamic-shapes.md, "Kernel specialisation").

A piece of a static graph spells every size as its literal, as templates always did (so static
sources stay byte for byte what they were). A piece that a dynamic plan planned for one shape of a
bucket (its graph's `origin`: opgraph.core.ir.ShapeOrigin) may be generated from the symbolic graph
instead: an int is still its literal, an expression of the dynamic dims becomes an int parameter
`sz<i>` of the kernel (one per distinct canonical expression, i32 or i64 by the bucket's bound) whose
value at the plan's shape the launch passes (ArgKind.SIZE). Decisions read the bucket, not the shape:
`hint` for heuristics, `max` for int64 indexing. The source then holds no dynamic size, so every
shape of a bucket gets the same source and the same compiled binary (one spec key).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TypeVar

from ...core.config import Support
from ...core.ir import ShapeOrigin
from ...core.piece import Piece
from ...core.symbolic import Expr, SymInt, bounds, evaluate, known_divisor
from ...core.tensor import TensorDesc
from ..shared.symbolic import symbolic_piece
from .templates.base import INT32_LIMIT, Arg, ArgKind, Params

SIZES_NAME = "_OG_SIZES"  # a generated module's tuple of size parameters (compile_worker: do_not_specialize)


class Sizes:
    """The size parameters of one generated kernel (see the module docstring), in first-use order."""

    def __init__(self, origin: ShapeOrigin) -> None:
        self.origin = origin
        self.env = origin.env
        self.ranges = origin.bucket.range_map
        self.hints = origin.bucket.hint_map
        self._names: dict[Expr, str] = {}

    def text(self, value: SymInt) -> str:
        """A size as kernel text: an int's literal, or the parameter holding an expression."""
        if not isinstance(value, Expr):
            return str(value)
        name = self._names.get(value)
        if name is None:
            name = self._names[value] = f"sz{len(self._names)}"
        return name

    def hint(self, value: SymInt) -> int:
        """A size at the bucket's hint (for heuristics: the same choice for every shape of the bucket)."""
        return evaluate(value, self.hints)

    def max(self, value: SymInt) -> int:
        """The largest a size gets in the bucket."""
        return bounds(value, self.ranges)[1]

    def least(self, value: SymInt) -> int:
        """The smallest a size gets in the bucket."""
        return bounds(value, self.ranges)[0]

    def needs_int64(self, descs: Iterable[TensorDesc], lanes: int = 0) -> bool:
        """Whether offsets into `descs` (an extent, or the element count plus `lanes`) can pass int32 in
        the bucket (templates.base.offsets_need_int64, over the bucket's range)."""
        for t in descs:
            reach = 1 + sum((d - 1) * s for d, s in zip(t.dim, t.stride))
            if self.max(reach) > INT32_LIMIT or self.max(math.prod(t.dim)) + lanes > INT32_LIMIT:
                return True
        return False

    @property
    def params(self) -> list[str]:
        return list(self._names.values())

    def args(self) -> list[Arg]:
        """The launch arguments of the size parameters: each value at the plan's shape."""
        return [
            Arg(
                ArgKind.SIZE,
                value=evaluate(e, self.env),
                dtype="int64" if self.max(e) > INT32_LIMIT else "int32",
                expr=e,
            )
            for e in self._names
        ]

    def grid(self, count: SymInt, block: int) -> tuple[int, SymInt]:
        """A grid axis of `count` items (a size) in blocks of `block`: its value at the plan's shape and
        its expression (Launch.grid and Launch.grid_expr)."""
        programs = (count + block - 1) // block
        return evaluate(programs, self.env), programs

    def add_params(self, params: Params) -> None:
        """Append the size parameters (and their launch arguments) to a kernel's `params` (templates/base
        Params), after every other: its text has used all the sizes it spells."""
        for name, arg in zip(self.params, self.args()):
            params.add(name, arg)

    def declaration(self) -> str:
        """The module line listing the size parameters (Triton's JIT must not specialise on them)."""
        return f"{SIZES_NAME} = {tuple(self.params)!r}"


def divides(n: int, value: SymInt) -> bool:
    """Whether `n` divides a size at every shape (a dynamic one by its known divisor)."""
    return value % n == 0 if isinstance(value, int) else known_divisor(value) % n == 0


def above_one(d: SymInt) -> bool:
    """Whether an axis is walked (not of size 1): a dynamic dim always is (a symbol never broadcasts,
    whatever its value at run time)."""
    return True if isinstance(d, Expr) else d > 1


def is_dynamic_desc(desc: TensorDesc) -> bool:
    return any(isinstance(v, Expr) for v in (*desc.dim, *desc.stride))


A = TypeVar("A")


def bucket_analysis(
    piece: Piece, analyze: Callable[[Piece], A | Support], dynamic_io: bool = False
) -> tuple[Piece, A, ShapeOrigin] | None:
    """(the symbolic piece, `analyze` of it, the graph's origin) where the piece is of a dynamic plan's
    bucket (symbolic_piece) and `analyze` takes it: None where it answers a Support, or decides by a
    dynamic size's value (TypeError), or, with `dynamic_io`, where no input or output of the piece
    has a dynamic size; None means the kernel is generated at the piece's shape."""
    symbolic, origin = symbolic_piece(piece), piece.graph.origin
    if symbolic is None or origin is None:
        return None
    if dynamic_io and not any(is_dynamic_desc(symbolic.tensor(u)) for u in (*symbolic.inputs, *symbolic.outputs)):
        return None
    try:
        analysis = analyze(symbolic)
    except TypeError:  # a decision by a dynamic size: generated at the shape
        return None
    return None if isinstance(analysis, Support) else (symbolic, analysis, origin)
