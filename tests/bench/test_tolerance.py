"""The benchmark's one tolerance rule (bench.core.tolerance), on the CPU."""

from __future__ import annotations

import math

import pytest

from bench.core import tolerance as tol


def test_three_times_the_best_peer():
    t = tol.output_tolerance({"torch eager": 2e-3, "cuDNN FE tuned": 1e-3, "torch.compile": 5e-3}, "float16")
    assert t.value == pytest.approx(3e-3)
    assert t.basis == "3 x cuDNN FE tuned"


def test_unit_roundoff_floor_when_peers_are_exact():
    t = tol.output_tolerance({"torch eager": 0.0}, "float16")
    assert t.value == 3 * 2.0**-11 and t.basis == "3 x unit roundoff (float16)"
    # a peer whose scalar rounded the right way (error below one unit roundoff) sets no tighter bar
    assert tol.output_tolerance({"torch eager": 1e-9}, "float32").value == 3 * 2.0**-24
    # one float32 ulp off a correctly rounded peer passes; two units of fp16 rounding past it fail
    assert 6.4e-8 <= tol.output_tolerance({"torch eager": 3e-9}, "float32").value
    assert 2.0**-9 > tol.output_tolerance({"torch eager": 0.0}, "float16").value


def test_fallback_when_no_peer_computes_the_output():
    t = tol.output_tolerance({"torch eager": None, "torch.compile": float("nan")}, "bfloat16")
    assert t.value == tol.FALLBACK["bfloat16"] and "no peer" in t.basis


def test_only_peers_set_the_tolerance():
    errors = {"opgraph": {"y": 1e-6}, "torch eager": {"y": 8e-4}}
    tols = tol.tolerances(errors, {"torch eager"}, {"y": "float16"})
    assert tols["y"].value == pytest.approx(2.4e-3)


def test_judge_reports_the_worst_output():
    tols = {"y": tol.Tolerance(1e-3, "3 x p"), "mean": tol.Tolerance(1e-6, "3 x p")}
    ok = tol.judge({"y": 5e-4, "mean": 9e-7}, tols)
    assert ok.passed and ok.worst_output == "mean" and ok.worst_ratio == pytest.approx(0.9)
    bad = tol.judge({"y": 5e-4, "mean": 2e-6}, tols)
    assert not bad.passed and bad.worst_output == "mean" and "mean" in bad.reason


@pytest.mark.parametrize("value", [None, float("nan"), float("inf")])
def test_missing_or_nonfinite_output_fails(value):
    tols = {"y": tol.Tolerance(1e-3, "x"), "sum": tol.Tolerance(1e-3, "x")}
    v = tol.judge({"y": 1e-4, "sum": value}, tols)
    assert not v.passed and v.worst_output == "sum" and math.isinf(v.worst_ratio)
    assert not tol.judge({"y": 1e-4}, tols).passed  # an output not produced at all


def test_sane_gates_timing():
    assert tol.sane({"y": 0.01, "m": 0.3})
    assert not tol.sane({"y": 0.01, "m": 0.9})
    assert not tol.sane({"y": float("nan")})
    assert not tol.sane({"y": None})
    assert not tol.sane({})
    assert tol.sane({"y": 5.0}, limit=float("inf")) and not tol.sane({"y": float("inf")}, limit=float("inf"))


def test_an_exactly_zero_output_is_judged_by_absolute_error():
    """An output zero in exact arithmetic (its float64 reference is rounding noise) gets an absolute
    tolerance, 3 x the best peer's absolute error, floored at float64 rounding, and its basis says so; a
    relative error over the noise once made such tolerances 1e14 (MobileNetV2 training, 2026-11-26)."""
    errs = {"torch eager": {"g": 2e-6}, "torch.compile": {"g": 5e-6}, "opgraph": {"g": 1e-9}}
    t = tol.tolerances(errs, {"torch eager", "torch.compile"}, {"g": "float16"}, frozenset({"g"}))["g"]
    assert t.value == pytest.approx(6e-6) and "absolute" in t.basis and "torch eager" in t.basis
    # far below fp16's unit roundoff: the relative floor does not apply to an absolute error
    exact = tol.output_tolerance({"torch eager": 0.0}, "float16", absolute=True)
    assert exact.value == tol.ABSOLUTE_FLOOR and "absolute" in exact.basis
    assert not tol.judge({"g": 1e-5}, {"g": t}).passed and tol.judge({"g": 5e-6}, {"g": t}).passed
