"""Sizes as values: `exact_quotient` (a division of sizes that is exact over the whole range) and
`SizeValue` (a number that is a ratio of sizes, such as a mean's 1/count: a literal of a graph with
dynamic dims, a float in the static graph at each shape)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import SerializationError
from .symbolic import Dim, Expr, SymInt, as_symint, evaluate, floordiv, from_json, known_divisor, to_json


@dataclass(frozen=True)
class SizeValue:
    """A number that is a ratio of sizes: `scale * num / den` (a mean's 1/count, a loss's 2/numel, the
    count of positions a broadcast gradient stands for). A literal operand of a graph with dynamic
    dims (`Const(SizeValue(...))`); the static graph at a shape (`FinalGraph.at`) holds its float.
    Build it with `size_value`, which gives a plain float where the sizes are ints."""

    scale: float
    num: SymInt
    den: SymInt = 1

    def at(self, env: Mapping[str, int]) -> float:
        return self.scale * evaluate(self.num, env) / evaluate(self.den, env)

    def __mul__(self, other: Any) -> Any:
        if isinstance(other, bool) or not isinstance(other, (int, float)):
            return NotImplemented
        return SizeValue(self.scale * float(other), self.num, self.den)

    __rmul__ = __mul__

    def __truediv__(self, other: Any) -> Any:
        if isinstance(other, bool) or not isinstance(other, (int, float)):
            return NotImplemented
        return SizeValue(self.scale / float(other), self.num, self.den)

    def __str__(self) -> str:
        scale = "" if self.scale == 1.0 else f"{self.scale!r}*"
        den = "" if isinstance(self.den, int) and self.den == 1 else f"/({self.den})"
        return f"{scale}({self.num}){den}"

    def to_json(self) -> dict[str, Any]:
        return {"scale": self.scale, "num": to_json(self.num), "den": to_json(self.den)}

    @classmethod
    def from_json(cls, doc: Any, symbols: Mapping[str, Dim]) -> SizeValue:
        if (
            not isinstance(doc, dict)
            or set(doc) != {"scale", "num", "den"}
            or isinstance(doc["scale"], bool)
            or not isinstance(doc["scale"], (int, float))
        ):
            raise SerializationError(
                f"a size value is {{'scale', 'num', 'den'}}, got {str(doc)[:200]}",
                rule="symbolic.json",
                hint="write size values as SizeValue.to_json() does",
            )
        return cls(float(doc["scale"]), from_json(doc["num"], symbols), from_json(doc["den"], symbols))


def size_value(num: SymInt | Dim, den: SymInt | Dim = 1, scale: float = 1.0) -> float | SizeValue:
    """`scale * num / den` as a float when both sizes are ints, else a `SizeValue` (see there). The
    quotient is taken in canonical form first: `size_value(batch*seq*64, batch*seq)` is 64.0."""
    n, d = as_symint(num), as_symint(den)
    if isinstance(d, Expr):
        q = exact_quotient(n, d)
        if q is not None:
            n, d = q, 1
    if isinstance(n, Expr) and isinstance(d, Expr):
        q = exact_quotient(d, n)  # (a mean's 1/count: numel(y) / numel(x))
        if q is not None:
            n, d = 1, q
    if isinstance(n, int) and isinstance(d, int):
        return scale * n / d
    return SizeValue(float(scale), n, d)


def exact_quotient(num: SymInt | Dim, den: SymInt | Dim) -> SymInt | None:
    """num / den where it is exact for every value of the symbols: ints that divide, or a monomial
    `den` dividing each term of `num` (`batch*seq*64 / seq` is `64*batch`); else None."""
    n, d = as_symint(num), as_symint(den)
    if isinstance(d, int):
        if d == 0 or known_divisor(n) % d:
            return None
        return floordiv(n, d) if d > 0 else -floordiv(n, -d)
    if isinstance(n, int):
        return 0 if n == 0 else None
    if len(d.terms) != 1:
        return None
    ((dmono, dcoef),) = d.terms
    total: SymInt = 0
    for mono, coef in n.terms:
        rest = list(mono)
        for a in dmono:
            if a not in rest:
                return None
            rest.remove(a)
        if coef % dcoef:
            return None
        term: SymInt = coef // dcoef
        for a in rest:
            term = term * (Expr.of(a) if isinstance(a, Dim) else Expr((((a,), 1),)))
        total = total + term
    return total
