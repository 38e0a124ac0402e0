"""The values of a graph's dynamic dims at run time, from the sizes a variant pack's buffers have:
each size the graph declares (an int or an expression of Dims, opgraph.core.symbolic) against the
one its buffer has. A symbol comes from the simplest size that gives it alone (a dim that is the
symbol, or linear in it: 2*seq, seq + 1); every other size is checked once the values it uses are
known; every value must lie in its dim's range. Errors name the place, the dim and the range."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .errors import ShapeError, VariantPackError
from .symbolic import Dim, Expr, Ranges, SymInt, evaluate, free_symbols, substitute


@dataclass(frozen=True)
class Observed:
    """A size the graph declares (`expr`) and the one a bound buffer has (`value`), at `where` (e.g.
    "dim 1 of tensor 'x' (uid 3)")."""

    expr: SymInt
    value: int
    where: str


def _bare(e: SymInt) -> Dim | None:
    return e.symbol if isinstance(e, Expr) else None


def _linear(e: Expr) -> tuple[Dim, int, int] | None:
    """(s, a, b) where e is a*s + b for one symbol s; None otherwise."""
    a, b, sym = 0, 0, None
    for mono, coef in e.terms:
        if mono == ():
            b = coef
        elif len(mono) == 1 and isinstance(mono[0], Dim) and (sym is None or sym == mono[0]):
            sym, a = mono[0], coef
        else:
            return None
    return None if sym is None else (sym, a, b)


def solve(
    observed: Sequence[Observed],
    error: type[ShapeError] | type[VariantPackError] = VariantPackError,
    ranges: Ranges | None = None,
) -> dict[str, int]:
    """The value of every symbol the observed sizes determine, each in its range (or in `ranges`), and
    every observed size consistent with them. A size linear in its one unknown symbol (batch, 2*seq,
    seq + 1) gives that symbol; the others are checked once the values they use are known. Raises
    `error` naming the place, the dim and the range: a size outside the range, sizes that disagree,
    a symbol nothing determines alone (seen only in products of unknowns)."""
    known: dict[str, int] = {}
    source: dict[str, str] = {}
    # bare symbols first, then by how many symbols a size uses: each symbol is taken from its simplest
    # size, and a disagreement is reported against that one
    pending = sorted(observed, key=lambda ob: (_bare(ob.expr) is None, len(free_symbols(ob.expr))))
    while pending:
        left: list[Observed] = []
        for ob in pending:
            e = substitute(ob.expr, known)
            if isinstance(e, int):
                if e != ob.value:
                    _disagree(ob, e, known, source, error)
                continue
            found = _linear(e)
            if found is None:
                left.append(ob)
                continue
            sym, a, b = found
            lo, hi = (ranges or {}).get(sym.name, (sym.min, sym.max))
            value, rest = divmod(ob.value - b, a)
            if rest or not lo <= value <= hi:
                _out_of_range(ob, e, sym, (lo, hi), bool(rest), error)
            known[sym.name] = value
            source[sym.name] = ob.where
        if len(left) == len(pending):
            names = sorted({d.name for ob in left for d in free_symbols(substitute(ob.expr, known))})
            raise error(
                f"the sizes do not determine the dim(s) {names}: {left[0].where} is {substitute(left[0].expr, known)}",
                rule="pack.dim_unknown",
                hint="give some input a dim that is the symbol alone (or linear in it)",
            )
        pending = left
    return known


def _out_of_range(
    ob: Observed,
    e: Expr,
    sym: Dim,
    span: tuple[int, int],
    inexact: bool,
    error: type[ShapeError] | type[VariantPackError],
) -> None:
    lo, hi = span
    if inexact:
        shown = str(ob.expr) if ob.expr == e else f"{ob.expr} ({e} with the dims known)"
        what = f"which {shown} is for no integer '{sym.name}'"
    elif e == sym:
        what = f"outside the range of dim '{sym.name}' ({lo}..{hi})"
    else:
        ends = sorted((evaluate(e, {sym.name: lo}), evaluate(e, {sym.name: hi})))
        what = f"outside the range of {e} ({ends[0]}..{ends[1]}: dim '{sym.name}' in {lo}..{hi})"
    raise error(
        f"{ob.where} is {ob.value}, {what}",
        rule="pack.dim_range",
        hint=f"bind a buffer whose size there is in range, or build with a wider range for '{sym.name}'",
    )


def _disagree(
    ob: Observed,
    want: int,
    known: Mapping[str, int],
    source: Mapping[str, str],
    error: type[ShapeError] | type[VariantPackError],
) -> None:
    used = sorted(d.name for d in free_symbols(ob.expr))
    given = ", ".join(f"'{n}' = {known[n]} (from {source.get(n, 'the ranges')})" for n in used)
    raise error(
        f"{ob.where} is {ob.value}, but {ob.expr} is {want} with {given}",
        rule="pack.dim_mismatch",
        hint="bind buffers whose sizes agree: tensors that share a dynamic dim must have the same size there",
    )
