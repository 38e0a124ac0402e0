"""Dynamic shapes of an exported program: torch.export's symbolic sizes (sympy expressions over the
program's shape symbols, with ranges in `program.range_constraints`) as opgraph `Dim`s and `Expr`s.

`symbol_table(program, args, dynamic_shapes)` names each symbol after the user's
`torch.export.Dim` at its position in `dynamic_shapes` (the bare symbol of an input's axis, or the root
of a derived dim such as `2*seq`), with the range torch.export inferred; an unnamed symbol keeps
torch's name (`s77`). An unbounded range (`Dim.AUTO`, `Dim.DYNAMIC`, a `Dim` without `max=`) is refused
with the input, the axis and the fix; a range starting at 0 starts at 1 (opgraph holds no empty
tensor; the importer notes it).

`to_symint(value)` converts an int, a `torch.SymInt` or a sympy expression with the table of the
import in progress (`active(table)`): sums, products, integer powers, torch's `FloorDiv`, `CeilDiv`,
`PythonMod`/`Mod` by an int; anything else (`Max`, `Min`, `Piecewise`, a rational) is an
`UnsupportedGraphError` naming the expression. Outside a dynamic import a symbolic size is an error,
never silently its example value (what `int(SymInt)` would give).
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from ..core.errors import UnsupportedGraphError
from ..core.symbolic import INT64_MAX, Dim, Expr, SymInt, floordiv


@dataclass
class SymbolTable:
    """torch.export's shape symbols (sympy) -> opgraph Dims, and notes for the import report."""

    dims: dict[Any, Dim] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


_ACTIVE: contextvars.ContextVar[SymbolTable | None] = contextvars.ContextVar("opgraph_torch_symbols", default=None)


@contextlib.contextmanager
def active(table: SymbolTable | None) -> Iterator[None]:
    """Convert symbolic sizes with `table` while the block runs (the import in progress)."""
    token = _ACTIVE.set(table)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def is_dynamic() -> bool:
    table = _ACTIVE.get()
    return table is not None and bool(table.dims)


def to_symint(value: Any) -> SymInt:
    """An int, a torch.SymInt or a sympy expression as an opgraph size (an int where static)."""
    if isinstance(value, (int, Expr)) and not isinstance(value, bool):
        return value
    if isinstance(value, Dim):
        return Expr.of(value)
    import torch

    table = _ACTIVE.get()
    if isinstance(value, torch.SymInt):
        if table is None:  # not a dynamic import (torch.compile's graphs): its traced value, as before
            return int(value)
        expr = value.node.expr
    elif hasattr(value, "free_symbols"):  # a sympy expression
        expr = value
    else:
        return int(value)
    if not expr.free_symbols:
        return int(expr)
    if table is None:
        raise UnsupportedGraphError(
            f"a symbolic size {expr} where the importer expects a static one",
            rule="import.dynamic",
            hint="import with from_torch(..., dynamic_shapes=...) for dynamic sizes, or export with static shapes",
        )
    return _convert(expr, table)


def to_shape(shape: Any) -> tuple[int, ...]:
    """A torch shape's sizes as opgraph sizes (annotated `int` as `TensorDesc.dim` is: the entries of
    a dynamic import may be `Expr`s)."""
    return cast(tuple[int, ...], tuple(to_symint(d) for d in shape))


def _convert(expr: Any, table: SymbolTable) -> SymInt:
    import sympy  # type: ignore[import-untyped]
    from torch.utils._sympy import functions as F

    def refuse(what: str) -> UnsupportedGraphError:
        return UnsupportedGraphError(
            f"the symbolic size {expr} holds {what}, which opgraph's sizes (sums and products of dims, "
            "floor division and remainder by an int) cannot express",
            rule="import.dynamic_expr",
            hint="make the size a sum or product of the dynamic dims (e.g. no min/max of sizes), or export "
            "the dims it depends on as static",
        )

    def walk(e: Any) -> SymInt:
        if isinstance(e, sympy.Integer):
            return int(e)
        if isinstance(e, sympy.Symbol):
            dim = table.dims.get(e)
            if dim is None:
                raise UnsupportedGraphError(
                    f"the symbolic size {expr} uses symbol {e}, which no input's dynamic dim defines",
                    rule="import.dynamic_symbol",
                    hint="give every dynamic size through an input's torch.export.Dim (no data-dependent sizes)",
                )
            return Expr.of(dim)
        if isinstance(e, sympy.Add):
            total: SymInt = 0
            for a in e.args:
                total = total + walk(a)
            return total
        if isinstance(e, sympy.Mul):
            product: SymInt = 1
            for a in e.args:
                product = product * walk(a)
            return product
        if isinstance(e, sympy.Pow) and isinstance(e.exp, sympy.Integer) and int(e.exp) >= 1:
            base = walk(e.base)
            out: SymInt = 1
            for _ in range(int(e.exp)):
                out = out * base
            return out
        divisions: tuple[Any, ...] = tuple(c for c in (F.FloorDiv, getattr(F, "CeilDiv", None)) if c is not None)
        if isinstance(e, divisions) and isinstance(e.args[1], sympy.Integer):
            num, den = walk(e.args[0]), int(e.args[1])
            if den < 1:
                raise refuse(f"a division by {den}")
            if isinstance(e, F.FloorDiv):
                return floordiv(num, den) if den > 1 else num
            return floordiv(num + den - 1, den) if den > 1 else num
        mods = tuple(m for m in (getattr(F, "PythonMod", None), getattr(F, "Mod", None), sympy.Mod) if m is not None)
        if isinstance(e, mods) and isinstance(e.args[1], sympy.Integer) and int(e.args[1]) >= 1:
            return walk(e.args[0]) % int(e.args[1])
        raise refuse(type(e).__name__)

    return walk(expr)


# -- naming the symbols --------------------------------------------------------------------------------


def _dim_specs(module: Any, args: tuple, dynamic_shapes: Any) -> list[Any]:
    """The `dynamic_shapes` entry of each input leaf, in pytree leaf order (None where none)."""
    if dynamic_shapes is None:
        return []
    if isinstance(dynamic_shapes, Mapping):
        try:
            bound = inspect.signature(module.forward).bind(*args)
        except TypeError:
            return []
        specs = [dynamic_shapes.get(name) for name in bound.arguments]
    else:
        specs = list(dynamic_shapes)
    out: list[Any] = []

    def walk(arg: Any, spec: Any) -> None:
        import torch

        if isinstance(arg, torch.Tensor):
            out.append(spec)
        elif isinstance(arg, (list, tuple)):
            for i, a in enumerate(arg):
                walk(a, spec[i] if isinstance(spec, (list, tuple)) and i < len(spec) else None)
        elif isinstance(arg, dict):
            for k, a in arg.items():
                walk(a, spec.get(k) if isinstance(spec, Mapping) else None)
        else:
            out.append(None)

    for i, arg in enumerate(args):
        walk(arg, specs[i] if i < len(specs) else None)
    return out


def _axis_spec(spec: Any, axis: int) -> Any:
    if isinstance(spec, Mapping):
        return spec.get(axis)
    if isinstance(spec, (list, tuple)) and axis < len(spec):
        return spec[axis]
    return None


def symbol_table(
    program: Any, module: Any, args: tuple, dynamic_shapes: Any, inputs: list[tuple[str, Any]]
) -> SymbolTable:
    """The Dims of an exported program's shape symbols. `inputs`: (name, traced value) of each user
    input placeholder, in order."""
    import torch

    table = SymbolTable()
    ranges = {}
    for sym, vr in program.range_constraints.items():
        ranges[sym] = vr
    specs = _dim_specs(module, args, dynamic_shapes)
    named: dict[Any, str] = {}
    where: dict[Any, str] = {}
    for i, (name, value) in enumerate(inputs):
        if not isinstance(value, torch.Tensor):
            continue
        spec = specs[i] if i < len(specs) else None
        for axis, d in enumerate(value.shape):
            if not isinstance(d, torch.SymInt):
                continue
            expr = d.node.expr
            if not expr.free_symbols:
                continue
            entry = _axis_spec(spec, axis)
            label = getattr(entry, "__name__", None)
            root = getattr(entry, "root", None)
            if root is not None:  # a derived dim (2*seq): its root names the symbol
                label = getattr(root, "__name__", None)
            for sym in expr.free_symbols:
                where.setdefault(sym, f"dim {axis} of input '{name}'")
                if isinstance(label, str) and label.isidentifier() and len(expr.free_symbols) == 1:
                    named.setdefault(sym, label)
    used: set[str] = set()
    for sym in where:  # in the order the inputs give them
        vr = ranges.get(sym)
        lower = _finite(vr.lower) if vr is not None else None
        upper = _finite(vr.upper) if vr is not None else None
        label = named.get(sym) or _fallback_name(str(sym), where[sym])
        if upper is None or upper > INT64_MAX:
            raise UnsupportedGraphError(
                f"the dynamic size of {where[sym]} ('{label}') has no upper bound in the exported program",
                rule="import.dynamic_unbounded",
                hint="give it a bounded torch.export.Dim: dynamic_shapes={..: {axis: Dim('"
                + label
                + "', min=1, max=N)}} (Dim.AUTO / Dim.DYNAMIC and Dim without max= give no bound)",
            )
        lower = 0 if lower is None else lower
        if lower < 1:
            table.notes.append(
                f"dim '{label}' ({where[sym]}): torch.export's range starts at {lower}; opgraph's starts at 1 "
                "(no empty tensors)"
            )
            lower = 1
        if label in used:
            label = f"{label}_{sym}"
        used.add(label)
        table.dims[sym] = Dim(label, lower, upper)
    return table


def _finite(bound: Any) -> int | None:
    """A range end as an int, None where it is infinite (torch's int_oo, sympy's oo)."""
    if bound is None or getattr(bound, "is_finite", None) is False or "oo" in str(bound):
        return None
    try:
        return int(bound)
    except (TypeError, ValueError, OverflowError, AttributeError):
        return None


def _fallback_name(sym: str, where: str) -> str:
    return sym if sym.isidentifier() else "d_" + "".join(c if c.isalnum() else "_" for c in where)


# -- torch.compile's dynamic graphs --------------------------------------------------------------------

MIN_OPEN_UPPER = 16  # the least provisional upper end of a dim torch.compile left unbounded


def open_upper(size: int) -> int:
    """The provisional upper end of a dim with no upper bound, for `size` (the largest met): the next
    power of two at least twice it (so a range grows a few times over a workload, never per shape)."""
    return max(MIN_OPEN_UPPER, 1 << (2 * max(size, 1) - 1).bit_length())


def fx_symbol_table(values: Sequence[Any], seen: Mapping[str, int] | None = None) -> SymbolTable:
    """The Dims of the shape symbols in the placeholder values of a graph torch.compile made dynamic
    (fake tensors with symbolic sizes, `torch.SymInt`s), named as torch names them (`s77`), ranges from
    the graph's ShapeEnv (`torch._dynamo.mark_dynamic(x, axis, min=, max=)` sets them). A symbol with
    no upper bound (`dynamic=True`, automatic dynamic shapes) gets a provisional one, `open_upper` of
    the larger of its hint and `seen[name]` (the sizes a call outside the last range met)."""
    import torch

    seen = seen or {}
    found: dict[Any, Any] = {}  # symbol -> its ShapeEnv, in order of first appearance
    for value in values:
        sizes: list[Any] = []
        if isinstance(value, torch.SymInt):
            sizes = [value]
        elif isinstance(value, torch.Tensor):
            sizes = [*value.shape, *value.stride()]
        for d in sizes:
            if isinstance(d, torch.SymInt):
                for sym in sorted(d.node.expr.free_symbols, key=str):
                    found.setdefault(sym, d.node.shape_env)
    table = SymbolTable()
    for sym, env in found.items():
        vr = env.var_to_range.get(sym)
        lower = _finite(vr.lower) if vr is not None else None
        upper = _finite(vr.upper) if vr is not None else None
        name = str(sym)
        if upper is None or upper > INT64_MAX:
            hints = getattr(env, "backed_var_to_val", None) or getattr(env, "var_to_val", {})
            hint = _finite(hints.get(sym)) or 1
            upper = open_upper(max(hint, seen.get(name, 0)))
        lower = max(1, lower or 1)
        table.dims[sym] = Dim(name, lower, max(lower, upper))
    return table
