"""Symbolic dimensions (opgraph.core.symbolic): the canonical form against plain int arithmetic, the
text and JSON forms, ranges, and solving a variant pack's sizes. Property tests draw random
expressions from a seeded generator (hypothesis is not a dependency of the project)."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from opgraph.core.errors import SerializationError, ShapeError
from opgraph.core.symbolic import (
    MAX_TEXT,
    Dim,
    Expr,
    FloorDiv,
    SymInt,
    as_symint,
    bounds,
    cdiv,
    evaluate,
    floordiv,
    free_symbols,
    from_json,
    is_symbolic,
    known_divisor,
    lambdify,
    parse,
    provably_le,
    provably_lt,
    substitute,
    to_json,
)

B = Dim("batch", 1, 16)
S = Dim("seq", 3, 40)
H = Dim("h", 5, 9)
SYMBOLS = {d.name: d for d in (B, S, H)}

Env = dict[str, int]


def _env(rng: random.Random) -> Env:
    return {d.name: rng.randint(d.min, d.max) for d in SYMBOLS.values()}


def _random_expr(rng: random.Random, depth: int = 3) -> tuple[SymInt, Callable[[Env], int]]:
    """A random SymInt and the plain-int function it must equal."""
    if depth == 0 or rng.random() < 0.25:
        if rng.random() < 0.6:
            d = rng.choice(list(SYMBOLS.values()))
            return Expr.of(d), lambda env, n=d.name: env[n]
        c = rng.randint(-7, 7)
        return c, lambda env, c=c: c
    op = rng.choice(["+", "-", "*", "//", "%", "cdiv", "neg"])
    a, fa = _random_expr(rng, depth - 1)
    if op in ("//", "%", "cdiv"):
        k = rng.randint(1, 6)
        if op == "//":
            return floordiv(a, k), lambda env: fa(env) // k
        if op == "%":
            return a % k, lambda env: fa(env) % k
        return cdiv(a, k), lambda env: -(-fa(env) // k)
    if op == "neg":
        return -a, lambda env: -fa(env)
    b, fb = _random_expr(rng, depth - 1)
    if op == "+":
        return a + b, lambda env: fa(env) + fb(env)
    if op == "-":
        return a - b, lambda env: fa(env) - fb(env)
    return a * b, lambda env: fa(env) * fb(env)


def _cases(seed: int, n: int) -> list[tuple[SymInt, Callable[[Env], int]]]:
    rng = random.Random(seed)
    return [_random_expr(rng) for _ in range(n)]


# -- the canonical form computes what int arithmetic computes -----------------------------------------


def test_random_expressions_evaluate_as_int_arithmetic():
    rng = random.Random(1)
    for expr, plain in _cases(20261130, 400):
        for _ in range(6):
            env = _env(rng)
            assert evaluate(expr, env) == plain(env), (expr, env)


def test_canonical_form_identities():
    b, s, h = Expr.of(B), Expr.of(S), Expr.of(H)
    assert (b + s) * h == b * h + s * h
    assert b * (s * h) == (b * s) * h
    assert b + s == s + b and b * s == s * b
    assert (b + 1) * (b - 1) == b * b - 1
    assert b - b == 0 and isinstance(b - b, int)
    assert 2 * b - b == b and (2 * b - b).symbol == B
    assert (b + 3) - 3 == B  # a Dim is its bare expression
    assert -b + 0 == -1 * b and b * -1 + b == 0


def test_floor_division_simplifies():
    s = Expr.of(S)
    assert (4 * s + 6) // 4 == s + 1
    assert (2 * s + 2) // 4 == (s + 1) // 2
    assert s // 2 // 3 == s // 6
    assert (s - 1) // 2 == (s + 1) // 2 - 1  # one canonical form for both
    assert (6 * s) // 3 == 2 * s
    assert s // 1 == s
    assert cdiv(s, 64) == (s + 63) // 64
    assert (s + 5) % 5 == s % 5
    assert floordiv(13, 4) == 3 and cdiv(13, 4) == 4
    atom = (s + 1) // 2
    assert isinstance(atom, Expr) and isinstance(atom.terms[0][0][0], FloorDiv)


def test_expressions_have_no_truth_value_order_or_int():
    e = Expr.of(S) + 1
    with pytest.raises(TypeError, match="truth value"):
        bool(e)
    with pytest.raises(TypeError):
        e < 3  # noqa: B015 - the comparison must raise
    with pytest.raises(TypeError):
        int(e)  # type: ignore[call-overload]  # what it refuses
    with pytest.raises(TypeError, match="by the dynamic size"):
        e // B
    with pytest.raises(TypeError, match="by the dynamic size"):
        e % Expr.of(B)
    with pytest.raises(ValueError, match="divisor"):
        floordiv(e, 0)
    with pytest.raises(TypeError):
        e + 1.5  # type: ignore[operator]  # floats are not sizes
    assert e != 1 and e != S and e == S + 1


def test_dims_and_their_expressions_are_one_value_in_sets_and_dicts():
    assert Expr.of(B) == B and B == Expr.of(B) and hash(Expr.of(B)) == hash(B)
    assert {B, Expr.of(B), B + 0} == {B}
    assert {B: 1}[Expr.of(B)] == 1
    assert Dim("batch", 1, 16) == B and Dim("batch", 1, 17) != B  # a name with another range is another dim
    assert B != 1 and B + 1 != 2
    assert is_symbolic(B) and is_symbolic(B + 1) and not is_symbolic(3)
    assert as_symint(B) == B and as_symint(4) == 4
    with pytest.raises(TypeError, match="a dim is an int"):
        as_symint(True)
    assert free_symbols(B * S + (H + 1) // 2) == {B, S, H} and free_symbols(7) == frozenset()


def test_too_many_terms_is_refused():
    total: SymInt = 0
    for i in range(12):
        total = total + Dim(f"d{i}", 1, 4)
    with pytest.raises(ValueError, match="terms"):
        total * total * total


# -- dims ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, lo, hi, rule",
    [
        ("", 1, 2, "dim.name"),
        ("2x", 1, 2, "dim.name"),
        ("lambda", 1, 2, "dim.name"),
        ("a b", 1, 2, "dim.name"),
        ("x" * 65, 1, 2, "dim.name"),
        ("x", 0, 2, "dim.range"),
        ("x", 3, 2, "dim.range"),
        ("x", True, 2, "dim.range"),
        ("x", 1, 2.0, "dim.range"),
        ("x", 1, 2**63, "dim.range"),
    ],
)
def test_bad_dims_are_shape_errors(name, lo, hi, rule):
    with pytest.raises(ShapeError) as err:
        Dim(name, lo, hi)
    assert err.value.rule == rule


def test_dim_json_round_trip_and_errors():
    assert Dim.from_json(B.to_json()) == B
    assert B.contains(16) and not B.contains(17) and B.describe() == "'batch' (range 1..16)"
    for doc in ([1], {"name": "b"}, {"name": "b", "min": 1, "max": 2, "x": 0}, {"name": "if", "min": 1, "max": 2}):
        with pytest.raises(SerializationError):
            Dim.from_json(doc)


# -- text and JSON ------------------------------------------------------------------------------------


def test_printing_reads_back_as_the_same_expression():
    for expr, _ in _cases(7, 400):
        text = to_json(expr)
        assert from_json(text, SYMBOLS) == expr, text
        if isinstance(expr, Expr):
            assert isinstance(text, str) and parse(text, SYMBOLS) == expr
            assert str(expr) == text and repr(expr) == f"Expr({text!r})"
        else:
            assert text == expr


def test_printing_is_readable():
    b, s = Expr.of(B), Expr.of(S)
    assert str(4096 * b * s + s) == "4096*batch*seq + seq"
    assert str((s + 1) // 2) == "(seq + 1)//2"
    assert str(b - s // 2) == "batch - seq//2"
    assert str(-(s // 2) + 1) == "-(seq//2) + 1"
    assert str(3 * (s // 2)) == "3*(seq//2)"
    assert str(b * (s // 2)) == "batch*(seq//2)"
    assert str(1 - b) == "-batch + 1"


@pytest.mark.parametrize(
    "text",
    [
        "batch +",
        "x + 1",
        "batch ** 2",
        "f(batch)",
        "batch.real",
        "batch / 2",
        "batch // seq",
        "batch % 0",
        "1.5 * batch",
        "True",
        "batch if seq else 1",
        "[batch]",
        "9" * 30,
        "batch" + " + batch" * 200,
        "(" * 300 + "batch" + ")" * 300,
        "(batch + seq + h + 1) * " * 12 + "1",
    ],
)
def test_parse_refuses_what_is_not_a_size(text):
    with pytest.raises(SerializationError) as err:
        parse(text, SYMBOLS)
    assert err.value.rule in ("symbolic.parse", "symbolic.unknown")
    assert len(str(err.value)) < 1000


def test_parse_limits_and_unknown_names():
    with pytest.raises(SerializationError, match="at most"):
        parse("1" + " + 1" * MAX_TEXT, SYMBOLS)
    with pytest.raises(SerializationError, match="not a declared dim") as err:
        parse("batch * tokens", SYMBOLS)
    assert err.value.rule == "symbolic.unknown"
    with pytest.raises(SerializationError):
        from_json(True, SYMBOLS)
    with pytest.raises(SerializationError):
        from_json([1], SYMBOLS)
    assert parse(" 2*batch - -1 ", SYMBOLS) == 2 * B + 1


# -- evaluation ---------------------------------------------------------------------------------------


def test_substitute_then_evaluate_is_evaluate():
    rng = random.Random(3)
    for expr, plain in _cases(11, 200):
        env = _env(rng)
        partial = substitute(expr, {"batch": env["batch"]})
        assert B not in free_symbols(partial)
        assert evaluate(partial, env) == plain(env)
        assert substitute(expr, env) == plain(env)
    assert substitute(Expr.of(B) * S, {"seq": Expr.of(B) + 1}) == Expr.of(B) * B + B


def test_evaluate_names_a_missing_symbol():
    with pytest.raises(KeyError, match="'seq'"):
        evaluate(B * S, {"batch": 2})


def test_lambdify_computes_every_value_at_once():
    rng = random.Random(5)
    cases = _cases(13, 60)
    fn = lambdify([e for e, _ in cases], [B, S, H])
    for _ in range(20):
        env = _env(rng)
        assert fn(env["batch"], env["seq"], env["h"]) == tuple(plain(env) for _, plain in cases)
    assert lambdify([B * 2], [B])(3) == (6,)
    with pytest.raises(ValueError, match="not given"):
        lambdify([B * S], [B])
    with pytest.raises(ValueError, match="twice"):
        lambdify([B], [B, B])


# -- ranges -------------------------------------------------------------------------------------------


def test_bounds_hold_every_value():
    rng = random.Random(17)
    for expr, plain in _cases(19, 300):
        lo, hi = bounds(expr)
        for _ in range(8):
            assert lo <= plain(_env(rng)) <= hi, expr


def test_bounds_are_tight_for_sums_and_products_of_symbols():
    assert bounds(B) == (1, 16)
    assert bounds(B * S * 4 + S) == (1 * 3 * 4 + 3, 16 * 40 * 4 + 40)
    assert bounds((S + 2 - 3) // 2 + 1) == (2, 20)  # a pooling's output size
    assert bounds(16 - B) == (0, 15)
    assert bounds(B * S, {"batch": (2, 4)}) == (6, 160)  # a bucket's sub-range
    assert bounds(5) == (5, 5)
    assert bounds(B * S - B) == (2, 624)  # a function linear in each symbol: its corners
    assert bounds(S - S // 2) == (2, 20)  # a floor division seen through its numerator
    assert bounds(S * S) == (9, 1600)


def test_provable_comparisons():
    assert provably_le(B, B * S) and provably_lt(S, S + 1) and provably_le(S // 2, S)
    assert not provably_le(B, S)  # batch may be 16, seq 3
    assert provably_le(B, S, {"batch": (1, 3)})
    assert not provably_lt(B, B) and provably_le(B, B)


def test_known_divisor_divides_every_value():
    rng = random.Random(23)
    for expr, plain in _cases(29, 300):
        d = known_divisor(expr)
        for _ in range(5):
            value = plain(_env(rng))
            assert (d == 0 and value == 0) or (d != 0 and value % d == 0), expr
    assert known_divisor(64 * B * S + 128 * S) == 64 and known_divisor(S + 1) == 1 and known_divisor(-12) == 12


def test_a_power_is_at_least_its_base_so_packed_strides_keep_their_order():
    """Term domination (every symbol is at least 1): t*t - t >= 0, which interval arithmetic alone
    cannot see; packed strides of [n, t, t] are ordered over the whole range."""
    t, n = Dim("t", 1, 13), Dim("n", 1, 9)
    assert bounds(t * t - t)[0] == 0 and provably_le(t, t * t)
    assert bounds(n * t * t - t * n + 2)[0] == 2
    assert bounds(t * t - 10 * t)[0] <= -25  # (not dominated: the true minimum is -25)
    import opgraph as og

    g = og.Graph(io_data_type=og.DataType.FLOAT)
    g.relu(g.tensor(dim=[n, t, t], name="scores")).set_output(True)
    g.validate()
