"""Symbolic dimensions: a tensor dim (or stride) that is not one number but any value of a range.

    batch = Dim("batch", 1, 256)            # a symbol: its name and its range, both ends included
    seq = Dim("seq", 1, 8192)
    stride = seq * 4096                     # an Expr: sums of products of symbols and ints
    out = (seq + 2 - 3) // 2 + 1            # floor division by a positive int (conv, pooling)

A dim is a `SymInt`: a Python int or an `Expr`. Arithmetic on symbols gives an `Expr` in a canonical
form, or an int where the symbols cancel (`seq - seq` is 0): a sum of monomials (an int coefficient
times a product of atoms: symbols and floor divisions). Expressions whose canonical forms are equal
(`==`) are equal for every value of their symbols; two polynomials (sums of products of symbols) are
equal as polynomials exactly when their forms are, so inference proves `K of A == K of B` by `==` and
refuses what it cannot prove. A floor division keeps outside what its divisor
divides exactly, cancels common factors and merges nested divisions: `(4*s + 6)//4` is `s + 1`,
`(2*s + 2)//4` is `(s + 1)//2`, `s//2//3` is `s//6`.

An expression has no truth value and no order (`bool(e)`, `e < 3` and `int(e)` raise TypeError): code
that decides by a size must say how over the whole range (`bounds`, `provably_le`, `known_divisor`)
or evaluate at a shape (`evaluate`, `lambdify`). At run time `symbolic_solve.solve` finds the
symbols' values from the dims a variant pack's buffers have, checking each against its range.

Symbols are named by Python identifiers; `str(e)` is a Python expression of them (`to_json` /
`from_json` keep that text), parsed back without `eval` (`parse`)."""

from __future__ import annotations

import ast
import keyword
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from .errors import SerializationError, ShapeError

INT64_MAX = 2**63 - 1
MAX_NAME = 64  # characters of a symbol's name
MAX_TEXT = 1000  # characters of an expression's text (graph and plan files)
MAX_TERMS = 256  # monomials of one expression: a dim is never bigger; a hostile text could be

Ranges = Mapping[str, tuple[int, int]]  # symbol name -> (lowest, highest), e.g. a bucket's


@dataclass(frozen=True, eq=False)
class Dim:
    """A dynamic dimension: any int in [min, max] (both >= 1). Equal names mean one dimension: a graph
    whose tensors give one name two ranges is refused where the graph is finalized."""

    name: str
    min: int
    max: int

    def __post_init__(self) -> None:
        if (
            not isinstance(self.name, str)
            or not self.name.isidentifier()
            or keyword.iskeyword(self.name)
            or len(self.name) > MAX_NAME
        ):
            raise ShapeError(
                f"a dynamic dim's name must be a Python identifier of at most {MAX_NAME} characters, got {self.name!r}",
                rule="dim.name",
                hint="name it like a variable: 'batch', 'seq_q'",
            )
        for end in (self.min, self.max):
            if isinstance(end, bool) or not isinstance(end, int):
                raise ShapeError(
                    f"dim '{self.name}': the range ends must be ints, got min={self.min!r}, max={self.max!r}",
                    rule="dim.range",
                    hint="e.g. Dim('batch', 1, 256)",
                )
        if not 1 <= self.min <= self.max <= INT64_MAX:
            raise ShapeError(
                f"dim '{self.name}': the range [{self.min}, {self.max}] is empty or not within [1, 2**63 - 1]",
                rule="dim.range",
                hint="give 1 <= min <= max, e.g. Dim('seq', 1, 8192)",
            )

    def contains(self, value: int) -> bool:
        return self.min <= value <= self.max

    def describe(self) -> str:
        return f"'{self.name}' (range {self.min}..{self.max})"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "min": self.min, "max": self.max}

    @classmethod
    def from_json(cls, doc: Any) -> Dim:
        if not isinstance(doc, dict) or set(doc) != {"name", "min", "max"}:
            raise SerializationError(
                f"a dynamic dim is {{'name', 'min', 'max'}}, got {str(doc)[:200]}",
                rule="symbolic.json",
                hint="write dims as Dim.to_json() does",
            )
        try:
            return cls(doc["name"], doc["min"], doc["max"])
        except ShapeError as err:
            raise SerializationError(err.detail, rule="symbolic.json", hint=err.hint) from None

    # a Dim is the expression of itself
    def __eq__(self, other: object) -> bool:
        if isinstance(other, Dim):
            return (self.name, self.min, self.max) == (other.name, other.min, other.max)
        if isinstance(other, Expr):
            return other == self
        return False

    def __hash__(self) -> int:
        return hash(("Dim", self.name, self.min, self.max))

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"Dim({self.name!r}, {self.min}, {self.max})"

    def __add__(self, other: Any) -> SymInt:
        return Expr.of(self) + other

    def __radd__(self, other: Any) -> SymInt:
        return Expr.of(self) + other

    def __sub__(self, other: Any) -> SymInt:
        return Expr.of(self) - other

    def __rsub__(self, other: Any) -> SymInt:
        return other - Expr.of(self)

    def __mul__(self, other: Any) -> SymInt:
        return Expr.of(self) * other

    def __rmul__(self, other: Any) -> SymInt:
        return Expr.of(self) * other

    def __floordiv__(self, other: Any) -> SymInt:
        return Expr.of(self) // other

    def __mod__(self, other: Any) -> SymInt:
        return Expr.of(self) % other

    def __neg__(self) -> SymInt:
        return -Expr.of(self)


@dataclass(frozen=True)
class FloorDiv:
    """An atom: `num // den` with den >= 2, in lowest terms (see `floordiv`)."""

    num: Expr
    den: int


Atom: TypeAlias = "Dim | FloorDiv"
Monomial = tuple[Atom, ...]  # atoms in canonical order, a power as a repeat; () is the constant


def _atom_key(atom: Atom) -> tuple:
    if isinstance(atom, Dim):
        return (0, atom.name, atom.min, atom.max)
    return (1, str(atom.num), atom.den)


def _mono_key(mono: Monomial) -> tuple:
    return (-len(mono), tuple(_atom_key(a) for a in mono))


def _make(terms: Mapping[Monomial, int]) -> SymInt:
    """The canonical value of a sum: an int when only the constant is left, else an Expr."""
    kept = {m: c for m, c in terms.items() if c}
    if len(kept) > MAX_TERMS:
        raise ValueError(f"a symbolic expression of {len(kept)} terms is beyond {MAX_TERMS}: no dim is that big")
    if not kept or set(kept) == {()}:
        return kept.get((), 0)
    return Expr(tuple(sorted(kept.items(), key=lambda mc: _mono_key(mc[0]))))


def _terms(value: SymInt) -> dict[Monomial, int]:
    if isinstance(value, int):
        return {(): value} if value else {}
    return dict(value.terms)


def _operand(value: Any) -> SymInt | None:
    """`value` as a SymInt, or None where arithmetic with it is not defined (the caller says NotImplemented)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, Expr)):
        return value
    if isinstance(value, Dim):
        return Expr.of(value)
    return None


@dataclass(frozen=True, eq=False)
class Expr:
    """A symbolic int: the sum of `coefficient * product of atoms` over `terms`, in canonical form
    (never a constant: constants are ints). Build it with arithmetic on `Dim`s and ints."""

    terms: tuple[tuple[Monomial, int], ...]

    @staticmethod
    def of(dim: Dim) -> Expr:
        return Expr((((dim,), 1),))

    @property
    def symbol(self) -> Dim | None:
        """The Dim this expression is exactly (a bare symbol), else None."""
        if len(self.terms) == 1:
            ((mono, coef),) = self.terms
            if coef == 1 and len(mono) == 1 and isinstance(mono[0], Dim):
                return mono[0]
        return None

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Dim):
            return self.symbol == other
        return isinstance(other, Expr) and self.terms == other.terms

    def __hash__(self) -> int:
        dim = self.symbol
        return hash(dim) if dim is not None else hash(self.terms)

    def __bool__(self) -> bool:
        raise TypeError(
            f"the truth value of the dynamic size {self} depends on its symbols' values: decide over "
            "the whole range (opgraph.core.symbolic.bounds, provably_le) or at one shape (evaluate)"
        )

    def __str__(self) -> str:
        return _print(self)

    def __repr__(self) -> str:
        return f"Expr({str(self)!r})"

    def __add__(self, other: Any) -> SymInt:
        o = _operand(other)
        if o is None:
            return NotImplemented
        terms = _terms(self)
        for m, c in _terms(o).items():
            terms[m] = terms.get(m, 0) + c
        return _make(terms)

    __radd__ = __add__

    def __neg__(self) -> SymInt:
        return _make({m: -c for m, c in self.terms})

    def __sub__(self, other: Any) -> SymInt:
        o = _operand(other)
        return NotImplemented if o is None else self + (-o)

    def __rsub__(self, other: Any) -> SymInt:
        o = _operand(other)
        return NotImplemented if o is None else o + (-self)

    def __mul__(self, other: Any) -> SymInt:
        o = _operand(other)
        if o is None:
            return NotImplemented
        terms: dict[Monomial, int] = {}
        for m1, c1 in self.terms:
            for m2, c2 in _terms(o).items():
                m = tuple(sorted(m1 + m2, key=_atom_key))
                terms[m] = terms.get(m, 0) + c1 * c2
        return _make(terms)

    __rmul__ = __mul__

    def __floordiv__(self, other: Any) -> SymInt:
        if isinstance(other, bool) or not isinstance(other, int):
            return _not_int_divisor("//", other)
        return floordiv(self, other)

    def __mod__(self, other: Any) -> SymInt:
        if isinstance(other, bool) or not isinstance(other, int):
            return _not_int_divisor("%", other)
        return self - other * floordiv(self, other)


SymInt: TypeAlias = "int | Expr"  # a dim or stride: an int, or an expression of Dims


def _not_int_divisor(op: str, other: Any) -> Any:
    if isinstance(other, (Dim, Expr)):
        raise TypeError(
            f"'{op}' by the dynamic size {other} is not supported: divide by an int "
            "(a symbolic divisor has no canonical form here)"
        )
    return NotImplemented


def as_symint(value: Any) -> SymInt:
    """An int, a Dim or an Expr as a SymInt (a Dim as its Expr); TypeError for anything else."""
    found = _operand(value)
    if found is None:
        raise TypeError(f"a dim is an int, a Dim or an expression of Dims, got {type(value).__name__} {value!r}")
    return found


def is_symbolic(value: Any) -> bool:
    return isinstance(value, (Expr, Dim))


def floordiv(value: SymInt | Dim, den: int) -> SymInt:
    """`value // den` (den >= 1) in canonical form: every term whose coefficient `den` divides goes
    outside (floor((den*q + r) / den) = q + floor(r / den) for any integer q), so the numerator left
    has coefficients in [0, den); a factor common to it and `den` cancels; a constant numerator below
    `den` is 0; a floor division of a floor division is one (floor(floor(x/a)/b) = floor(x/(a*b)))."""
    if isinstance(den, bool) or not isinstance(den, int) or den < 1:
        raise ValueError(f"a symbolic floor division takes an int divisor >= 1, got {den!r}")
    v = as_symint(value)
    if isinstance(v, int):
        return v // den
    if den == 1:
        return v
    outside: dict[Monomial, int] = {}
    inside: dict[Monomial, int] = {}
    for mono, coef in v.terms:
        q, r = divmod(coef, den)
        if q:
            outside[mono] = q
        if r:
            inside[mono] = r
    if not inside or set(inside) == {()}:  # a remainder in [0, den): floor(r / den) = 0
        return _make(outside)
    common = math.gcd(den, *inside.values())
    if common > 1:
        inside = {m: c // common for m, c in inside.items()}
        den //= common
    num = _make(inside)  # (den >= 2 still: each coefficient left is below den, so gcd(den, ...) < den)
    if isinstance(num, Expr) and len(num.terms) == 1:
        ((mono, coef),) = num.terms
        if coef == 1 and len(mono) == 1 and isinstance(mono[0], FloorDiv):
            return _make(outside) + floordiv(mono[0].num, mono[0].den * den)
    assert isinstance(num, Expr)
    return _make(outside) + Expr((((FloorDiv(num, den),), 1),))


def cdiv(value: SymInt | Dim, den: int) -> SymInt:
    """`ceil(value / den)` for den >= 1: the number of blocks of `den` that cover `value`."""
    return floordiv(as_symint(value) + (den - 1), den)


# -- printing and parsing ---------------------------------------------------------------------------


def _print_atom(atom: Atom) -> str:
    if isinstance(atom, Dim):
        return atom.name
    num = str(atom.num)
    return f"{num}//{atom.den}" if atom.num.symbol is not None else f"({num})//{atom.den}"


def _print(e: Expr) -> str:
    parts: list[str] = []
    for mono, coef in e.terms:
        mag = abs(coef)
        atoms = [_print_atom(a) for a in mono]
        # a floor division multiplied by anything, or negated, is parenthesized: `2*x//3` would read
        # as (2*x)//3 and `-x//2` as (-x)//2
        alone = len(mono) == 1 and mag == 1 and (coef > 0 or parts)
        atoms = [t if isinstance(a, Dim) or alone else f"({t})" for a, t in zip(mono, atoms)]
        factors = ([str(mag)] if mag != 1 or not mono else []) + atoms
        text = "*".join(factors)
        if not parts:
            parts.append(text if coef > 0 else "-" + text)
        else:
            parts.append((" + " if coef > 0 else " - ") + text)
    return "".join(parts)


def parse(text: str, symbols: Mapping[str, Dim]) -> SymInt:
    """The SymInt that `text` (as `str(expr)` writes it: ints, symbol names, + - * // % and
    parentheses) means, its names looked up in `symbols`. A SerializationError names what is wrong;
    nothing is evaluated by Python."""
    if not isinstance(text, str) or len(text) > MAX_TEXT:
        raise SerializationError(
            f"a symbolic size is a text of at most {MAX_TEXT} characters, got {type(text).__name__} {str(text)[:80]!r}",
            rule="symbolic.parse",
            hint="write sizes as str(expr) does, e.g. 'batch*seq + 1'",
        )
    try:
        tree = ast.parse(text.strip(), mode="eval")
        return _from_ast(tree.body, symbols)
    except SerializationError:
        raise
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError) as err:
        raise SerializationError(
            f"cannot read the symbolic size {text[:80]!r}: {type(err).__name__}: {err}"[:300],
            rule="symbolic.parse",
            hint="write sizes as str(expr) does, e.g. 'batch*seq + 1', '(h + 1)//2'",
        ) from None


_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
}


def _from_ast(node: ast.AST, symbols: Mapping[str, Dim]) -> SymInt:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        if node.value > INT64_MAX:
            raise ValueError(f"the constant {node.value} is beyond int64")
        return node.value
    if isinstance(node, ast.Name):
        dim = symbols.get(node.id)
        if dim is None:
            raise SerializationError(
                f"the symbolic size names '{node.id}', which is not a declared dim (known: {sorted(symbols)[:20]})",
                rule="symbolic.unknown",
                hint="declare every dim a size names in the file's dims",
            )
        return Expr.of(dim)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = _from_ast(node.operand, symbols)
        return -inner if isinstance(node.op, ast.USub) else inner
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _from_ast(node.left, symbols), _from_ast(node.right, symbols)
        if isinstance(node.op, (ast.FloorDiv, ast.Mod)) and (not isinstance(right, int) or right < 1):
            raise ValueError(f"'//' and '%' take an int divisor >= 1, got {right}")
        return _BINARY[type(node.op)](left, right)
    raise ValueError(f"{type(node).__name__} is not part of a symbolic size (ints, names, + - * // % only)")


def to_json(value: SymInt) -> int | str:
    """An int as it is, an expression as its text (`parse` reads it back)."""
    return value if isinstance(value, int) else str(value)


def from_json(doc: Any, symbols: Mapping[str, Dim]) -> SymInt:
    if isinstance(doc, bool) or not isinstance(doc, (int, str)):
        raise SerializationError(
            f"a size is an int or the text of an expression, got {str(doc)[:80]}",
            rule="symbolic.json",
            hint="write sizes as to_json() does",
        )
    return doc if isinstance(doc, int) else parse(doc, symbols)


# -- evaluation ----------------------------------------------------------------------------------------


def free_symbols(value: SymInt | Dim) -> frozenset[Dim]:
    """The Dims `value` depends on (inside floor divisions too)."""
    v = as_symint(value)
    if isinstance(v, int):
        return frozenset()
    found: set[Dim] = set()
    for mono, _ in v.terms:
        for a in mono:
            found |= {a} if isinstance(a, Dim) else free_symbols(a.num)
    return frozenset(found)


def _fold(value: SymInt, atom: Callable[[Dim], Any]) -> Any:
    """`value` with each symbol replaced by `atom(symbol)`, computed by int or SymInt arithmetic."""
    if isinstance(value, int):
        return value
    total: Any = 0
    for mono, coef in value.terms:
        product: Any = coef
        for a in mono:
            product = product * (atom(a) if isinstance(a, Dim) else floordiv(_fold(a.num, atom), a.den))
        total = total + product
    return total


def evaluate(value: SymInt | Dim, env: Mapping[str, int]) -> int:
    """The int `value` is when each symbol has its value in `env` (by name). Ranges are not checked
    here (`solve` checks them); a missing symbol is a KeyError naming it."""

    def at(dim: Dim) -> int:
        try:
            return env[dim.name]
        except KeyError:
            raise KeyError(f"no value for the dynamic dim '{dim.name}'") from None

    return int(_fold(as_symint(value), at))


def substitute(value: SymInt | Dim, env: Mapping[str, SymInt | Dim]) -> SymInt:
    """`value` with the symbols named in `env` replaced (by ints or expressions), in canonical form."""
    return as_symint(_fold(as_symint(value), lambda d: as_symint(env[d.name]) if d.name in env else Expr.of(d)))


def lambdify(values: Sequence[SymInt], symbols: Sequence[Dim]) -> Callable[..., tuple[int, ...]]:
    """One Python function computing every value of `values` from the symbols' values, positional in
    the order of `symbols`: what a runtime calls once per new shape (compiled from the expressions'
    text, which holds only ints, validated names and + - * // %)."""
    names = [d.name for d in symbols]
    if len(set(names)) != len(names):
        raise ValueError(f"symbols named twice: {names}")
    unknown = {d.name for v in values for d in free_symbols(v)} - set(names)
    if unknown:
        raise ValueError(f"the values use symbols not given: {sorted(unknown)}")
    body = ", ".join(f"({to_json(v)})" for v in values)
    code = compile(f"lambda {', '.join(names)}: ({body}{',' if len(values) == 1 else ''})", "<opgraph sizes>", "eval")
    fn: Callable[..., tuple[int, ...]] = eval(code, {"__builtins__": {}})  # noqa: S307 - text made above
    return fn


# -- ranges ----------------------------------------------------------------------------------------


def _interval_mul(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    corners = (a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1])
    return min(corners), max(corners)


MAX_CORNERS = 10  # atoms whose every corner `bounds` tries (2**10 points)


def log_point(ranges: Ranges, t: float) -> dict[str, int]:
    """Each symbol's value at fraction `t` of its range on a log scale (0: its lowest, 1: its highest)."""
    return {name: min(hi, max(lo, round(lo ** (1 - t) * hi**t))) for name, (lo, hi) in ranges.items()}


def bounds(value: SymInt | Dim, ranges: Ranges | None = None) -> tuple[int, int]:
    """(lowest, highest) that `value` can be when each symbol is in its range (or in `ranges`, by name:
    a bucket's sub-range). Sound: every value lies inside. Exact where no atom repeats in a monomial
    and the atoms are symbols (a function linear in each atom takes its extremes at the corners of
    their box: `batch*seq - batch` is at least 0), else from interval arithmetic (a floor division
    taken as an atom of its own range, a square as a product of two ranges: looser)."""
    v = as_symint(value)
    if isinstance(v, int):
        return v, v
    given = ranges or {}
    spans: dict[Atom, tuple[int, int]] = {}
    for mono, _ in v.terms:
        for a in mono:
            if a not in spans:
                if isinstance(a, Dim):
                    spans[a] = given.get(a.name, (a.min, a.max))
                else:
                    nlo, nhi = bounds(a.num, ranges)
                    spans[a] = (nlo // a.den, nhi // a.den)
    if len(spans) <= MAX_CORNERS and all(len(set(mono)) == len(mono) for mono, _ in v.terms):
        atoms = list(spans)
        values = []
        for corner in range(1 << len(atoms)):
            at = {a: spans[a][(corner >> i) & 1] for i, a in enumerate(atoms)}
            values.append(sum(coef * math.prod(at[a] for a in mono) for mono, coef in v.terms))
        lo, hi = min(values), max(values)
    else:
        lo = hi = 0
        for mono, coef in v.terms:
            iv = (coef, coef)
            for a in mono:
                iv = _interval_mul(iv, spans[a])
            lo += iv[0]
            hi += iv[1]
    relaxed = _relaxed_bounds(v, ranges)
    if relaxed is not None:
        lo, hi = max(lo, relaxed[0]), min(hi, relaxed[1])
    floor = _dominated_floor(v, ranges)
    return (lo if floor is None else max(lo, floor)), hi


def _dominated_floor(v: Expr, ranges: Ranges | None) -> int | None:
    """A lower bound from term domination, where interval arithmetic loses the link between a power
    and its base (`t*t - t`): every atom is at least 1, so a monomial is at least any monomial that
    divides it; each negative term is paid by positive terms it divides, and what is left is at least
    the sum of its coefficients. None where an atom can be below 1 or a negative term is not paid."""
    given = ranges or {}
    for mono, _ in v.terms:
        for a in mono:
            low = given.get(a.name, (a.min, a.max))[0] if isinstance(a, Dim) else bounds(a.num, ranges)[0] // a.den
            if low < 1:
                return None
    left = {mono: coef for mono, coef in v.terms if coef > 0}
    for mono, coef in sorted(((m, -c) for m, c in v.terms if c < 0), key=lambda mc: -len(mc[0])):
        for other in sorted(left, key=len):
            if coef == 0:
                break
            if left[other] and _divides(mono, other):
                paid = min(coef, left[other])
                left[other] -= paid
                coef -= paid
        if coef:
            return None
    return sum(left.values())


def _relaxed_bounds(v: Expr, ranges: Ranges | None) -> tuple[int, int] | None:
    """Bounds that see a floor division through its numerator: with r = num mod den + 1 in [1, den],
    den * (num // den) = num - r + 1, so L * v (L the lcm of the divisors) is a polynomial of the
    symbols and the r's, bounded as any (`seq - seq//2` is at least 2 for seq >= 3, where taking
    seq//2 as an atom of its own range proves nothing). For monomials of at most one floor division
    whose numerator has none; None elsewhere."""
    divs = [a for mono, _ in v.terms for a in mono if isinstance(a, FloorDiv)]
    if (
        not divs
        or any(sum(isinstance(a, FloorDiv) for a in mono) > 1 for mono, _ in v.terms)
        or any(isinstance(a, FloorDiv) for f in divs for mono, _ in f.num.terms for a in mono)
    ):
        return None
    scale = math.lcm(*(f.den for f in divs))
    taken = {d.name for d in free_symbols(v)}
    names = (f"r{i}" for i in range(len(taken) + len(divs) + 1))
    scaled_div: dict[FloorDiv, SymInt] = {}
    for f in dict.fromkeys(divs):
        name = next(n for n in names if n not in taken)
        scaled_div[f] = (scale // f.den) * (f.num - Dim(name, 1, f.den) + 1)
    total: SymInt = 0
    for mono, coef in v.terms:
        product: SymInt = coef
        for a in mono:
            product = product * (scaled_div[a] if isinstance(a, FloorDiv) else Expr.of(a))
        total = total + (product if any(isinstance(a, FloorDiv) for a in mono) else scale * product)
    lo, hi = bounds(total, ranges)
    return -(-lo // scale), hi // scale


def _divides(mono: Monomial, other: Monomial) -> bool:
    """Whether monomial `mono` divides `other` (each atom at most as often)."""
    rest = list(other)
    for a in mono:
        if a not in rest:
            return False
        rest.remove(a)
    return True


def provably_le(a: SymInt | Dim, b: SymInt | Dim, ranges: Ranges | None = None) -> bool:
    """Whether a <= b for every value of the symbols in their ranges (False: not proven)."""
    return bounds(as_symint(b) - as_symint(a), ranges)[0] >= 0


def provably_lt(a: SymInt | Dim, b: SymInt | Dim, ranges: Ranges | None = None) -> bool:
    return bounds(as_symint(b) - as_symint(a), ranges)[0] > 0


def known_divisor(value: SymInt | Dim) -> int:
    """An int that divides `value` whatever the symbols' values (the gcd of its coefficients); 0 for
    the constant 0 (every int divides it)."""
    v = as_symint(value)
    if isinstance(v, int):
        return abs(v)
    return math.gcd(*(c for _, c in v.terms))
