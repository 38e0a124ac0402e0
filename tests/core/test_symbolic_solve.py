"""Solving a variant pack's sizes for the dynamic dims (opgraph.core.symbolic_solve): sizes made from
random expressions (tests/core/test_symbolic.py's generator) solved back, and the errors."""

from __future__ import annotations

import random

import pytest

from opgraph.core.errors import ShapeError, VariantPackError
from opgraph.core.symbolic import Expr, SymInt, evaluate
from opgraph.core.symbolic_solve import Observed, solve

from .test_symbolic import B, H, S, _cases, _env


def test_solve_finds_the_symbols_from_bare_and_linear_sizes():
    obs = [
        Observed(B * S, 12, "dim 0 of 'y'"),
        Observed(2 * S + 1, 7, "dim 1 of 'x'"),
        Observed(B, 4, "dim 0 of 'x'"),
        Observed(16, 16, "dim 2 of 'x'"),
        Observed((S + 1) // 2, 2, "dim 1 of 'z'"),
    ]
    assert solve(obs) == {"batch": 4, "seq": 3}


def test_solve_random_packs():
    rng = random.Random(31)
    for _ in range(200):
        env = _env(rng)
        exprs: list[SymInt] = [Expr.of(B), Expr.of(S), 3 * H + 2] + [e for e, _ in _cases(rng.randint(0, 10**6), 3)]
        obs = [Observed(e, evaluate(e, env), f"size {i}") for i, e in enumerate(exprs)]
        rng.shuffle(obs)
        assert solve(obs) == env
        k = rng.randrange(len(obs))
        if not isinstance(obs[k].expr, int) and obs[k].value > 1:
            wrong = obs[:k] + [Observed(obs[k].expr, obs[k].value + 1, obs[k].where)] + obs[k + 1 :]
            try:
                other = solve(wrong)
            except VariantPackError as err:
                assert err.rule in ("pack.dim_range", "pack.dim_mismatch")
            else:  # (a symbol no other size uses may take the new value: then every size must agree)
                assert other != env and all(evaluate(o.expr, other) == o.value for o in wrong)


def test_solve_errors_name_the_place_the_dim_and_the_range():
    with pytest.raises(
        VariantPackError, match=r"dim 0 of 'x' is 17, outside the range of dim 'batch' \(1..16\)"
    ) as err:
        solve([Observed(B, 17, "dim 0 of 'x'")])
    assert err.value.rule == "pack.dim_range" and "wider range for 'batch'" in err.value.hint
    with pytest.raises(VariantPackError, match=r"outside the range of seq \+ 100 \(103..140"):
        solve([Observed(S + 100, 7, "dim 1 of 'x'")])
    with pytest.raises(VariantPackError, match="for no integer 'seq'"):
        solve([Observed(2 * S, 7, "dim 1 of 'x'")])
    with pytest.raises(
        VariantPackError,
        match=r"dim 0 of 'y' is 13, but batch\*seq is 12 with 'batch' = 4 "
        r"\(from dim 0 of 'x'\), 'seq' = 3 \(from dim 1 of 'z'\)",
    ) as err:
        solve([Observed(B * S, 13, "dim 0 of 'y'"), Observed(B, 4, "dim 0 of 'x'"), Observed(S, 3, "dim 1 of 'z'")])
    assert err.value.rule == "pack.dim_mismatch"
    with pytest.raises(VariantPackError, match=r"do not determine the dim\(s\) \['batch', 'seq'\]") as err:
        solve([Observed(B * S, 12, "dim 0 of 'y'")])
    assert err.value.rule == "pack.dim_unknown"
    with pytest.raises(VariantPackError, match="is 5, but 4 is 4"):
        solve([Observed(4, 5, "dim 3 of 'x'")])
    with pytest.raises(ShapeError, match="outside"):  # the error type a caller asks for, and a bucket's range
        solve([Observed(B, 9, "dim 0 of 'x'")], error=ShapeError, ranges={"batch": (1, 8)})
