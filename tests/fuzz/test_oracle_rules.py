"""The oracle's latitude rules of docs/concepts.md, each where the H100/H200 fuzz sessions of 2026-11-26
met it: the sensitivity runs (nudged) must allow what an engine may do there, and nothing else."""

from __future__ import annotations

import numpy as np

import opgraph as og

from . import oracle

DT = og.DataType
WILD = 7.0  # a value no formula here gives: where a run puts it, any answer is allowed


def _runs(final, inputs, delta=None, runs=16):
    want = oracle.evaluate(final, inputs, None)
    rng = np.random.default_rng(0)
    return want, [oracle.evaluate(final, inputs, rng, delta, wild=WILD, base=want) for _ in range(runs)]


def _uids(final, *names):
    return [final.tensor(n).uid for n in names]


def test_integer_sums_past_the_accumulators_exact_range_are_order_dependent():
    """2**62 * 4 - 2**62 * 4 + 1 summed in fp32 is 1 or 0 (seed 20261126110946); small sums stay exact."""
    g = og.Graph("isum", io_data_type=DT.INT64, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    x = g.tensor(dim=[9, 2], name="x")
    g.reduction(x, mode=og.ReductionMode.ADD, name="s").set_output(True).set_dim([1, 2]).set_data_type(DT.FLOAT)
    final = g.final
    (xu,) = _uids(final, "x")
    big = np.array([2.0**62] * 4 + [-(2.0**62)] * 4 + [1.0])
    values = np.stack([big, np.arange(9.0)], axis=1)
    want, runs = _runs(final, {xu: values})
    out = final.outputs[0]
    assert want[out][0, 0] == 1.0 and want[out][0, 1] == 36.0
    assert any(r[out][0, 0] != 1.0 for r in runs)  # the big column moves
    assert all(abs(r[out][0, 1] - 36.0) < 36.0 * 1e-4 for r in runs)  # the small one by its nudges alone


def test_exact_ops_stored_narrow_may_round_through_fp32():
    """f16(a - b) from fp32 operands: an engine computing in fp32 rounds twice, which differs at a tie
    of fp16 (seed 20261126106267); the sensitivity runs round the same way."""
    g = og.Graph("tie", io_data_type=DT.FLOAT, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    a, b = g.tensor(dim=[1], name="a"), g.tensor(dim=[1], name="b")
    g.sub(a, b, name="d").set_output(True).set_data_type(DT.HALF)
    final = g.final
    au, bu = _uids(final, "a", "b")
    a_val, b_val = np.float64(np.float32(-0.0005866065621376038)), np.float64(np.float32(-1.3956061290115662))
    want, runs = _runs(final, {au: np.array([a_val]), bu: np.array([b_val])})
    out = final.outputs[0]
    assert float(want[out][0]) == float(np.float16(a_val - b_val))  # one rounding: 1.3955
    assert all(float(r[out][0]) == float(np.float16(np.float32(a_val - b_val))) for r in runs)  # two: 1.395


def test_exact_ops_stored_as_integers_may_round_through_fp32():
    """int8(x + y) computed in fp32: -128 + 8.9e-7 is -128.0 in fp32 (int8 -128) and -127.9999991 in
    float64 (int8 -127, truncated), seed 20261129811134; the sensitivity runs round the same way."""
    g = og.Graph("tie", io_data_type=DT.FLOAT, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    a, b = g.tensor(dim=[1], name="a"), g.tensor(dim=[1], name="b")
    g.add(a, b, name="s").set_output(True).set_data_type(DT.INT8)
    final = g.final
    au, bu = _uids(final, "a", "b")
    want, runs = _runs(final, {au: np.array([-128.0]), bu: np.array([8.869503744790563e-07])})
    out = final.outputs[0]
    assert float(want[out][0]) == -127.0
    assert all(float(r[out][0]) == -128.0 for r in runs)


def test_subnormal_transcendental_results_may_flush_to_zero():
    """x * sech(x)**2 at x = -49 is -2e-41, a subnormal fp32 value a fast exp flushes to -0.0; its square
    root is NaN or -0.0 (seed 20261126207165). A normal result is not affected."""
    g = og.Graph("ftz", io_data_type=DT.FLOAT, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    x = g.tensor(dim=[2], name="x")
    g.sqrt(g.tanh_backward(x, x, name="t"), name="r").set_output(True)
    final = g.final
    (xu,) = _uids(final, "x")
    want, runs = _runs(final, {xu: np.array([-49.0, 0.5])})
    out = final.outputs[0]
    assert np.isnan(want[out][0]) and np.isfinite(want[out][1])
    assert any(np.isclose(r[out][0], np.sqrt(WILD)) for r in runs)  # the flushed-or-not value set to WILD
    assert all(np.isclose(r[out][1], want[out][1], rtol=1e-5, atol=0) for r in runs)


def test_a_periodic_function_of_an_uncertain_argument_may_be_anything():
    """tan of a weight gradient that TF32 moves by ~1.5 (seed 20261126207128), or of -7e39 (seed
    20261126200986): any value; tan of a well-known small argument is not."""
    g = og.Graph("tan", io_data_type=DT.FLOAT, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    a, b = g.tensor(dim=[3, 4], name="a"), g.tensor(dim=[4, 1], name="b")
    g.tan(g.matmul(a, b, name="mm"), name="t").set_output(True)
    final = g.final
    au, bu = _uids(final, "a", "b")
    a_val = np.array([[3323.0, -3100.0, 2544.0, 1.0], [1e38, 1e38, 1e38, 1e38], [0.1, 0.2, 0.3, 0.4]])
    b_val = np.array([[1.0], [1.0], [1.0], [1.0]])
    coarse = lambda n: 2.0**-10 if n.kind == "matmul" else oracle.F32_DELTA  # noqa: E731 - a TF32 step
    want, runs = _runs(final, {au: a_val, bu: b_val}, coarse)
    out = final.outputs[0]
    assert any(r[out][0, 0] == WILD for r in runs) and any(r[out][1, 0] == WILD for r in runs)
    assert not any(r[out][2, 0] == WILD for r in runs)
