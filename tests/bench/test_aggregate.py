"""Repeat aggregation (bench.core.aggregate) and result records (bench.core.records), on the CPU."""

from __future__ import annotations

import math

import pytest

from bench.core.aggregate import MixedMachinesError, aggregate, stat
from bench.core.records import ImplResult, RunRecord

from .helpers import META, run


def test_stat_ignores_missing_and_nan():
    s = stat([3.0, None, 1.0, float("nan"), 2.0])
    assert (s.median, s.lo, s.hi, s.n) == (2.0, 1.0, 3.0, 3)
    assert stat([None]) is None


def test_median_min_max_over_repeats():
    agg = aggregate([run(2, 1.2), run(1, 1.0), run(3, 0.9)])
    assert agg.repeats == 3 and agg.meta["repeats"] == 3
    s = agg.workloads[0].impl("opgraph").metrics["device_us"]
    assert (s.median, s.lo, s.hi, s.n) == pytest.approx((10.0, 9.0, 12.0, 3))
    assert agg.ceilings.copy_gbps == pytest.approx(3000.0)


def test_verdicts_are_recomputed_from_the_worst_repeat():
    agg = aggregate([run(1), run(2, ours_err=5e-3)])  # tolerance: 3 x 1e-3 (cuDNN FE tuned)
    w = agg.workloads[0]
    assert w.tolerances["y"].value == pytest.approx(3e-3)
    assert not w.impl("opgraph").passed and w.impl("opgraph").errors["y"] == pytest.approx(5e-3)
    assert w.impl("opgraph tuned").passed


def test_an_unavailable_peer_has_no_verdict_and_keeps_its_reason():
    w = aggregate([run(1)]).workloads[0]
    i = w.impl("torch.compile")
    assert i.verdict is None and i.status == "unavailable" and "compile" in i.error


def test_a_workload_missing_from_a_repeat_counts_fewer():
    r2 = run(2)
    r2.workloads = r2.workloads[:1]
    agg = aggregate([run(1), r2])
    assert agg.workloads[1].repeats == 1 and agg.workloads[0].repeats == 2


@pytest.mark.parametrize("key", ["device", "driver", "hostname"])
def test_one_machine_per_table(key):
    other = dict(META, **{key: "other"})
    with pytest.raises(MixedMachinesError):
        aggregate([run(1), run(2, meta=other)])


def test_records_round_trip_through_json_nan_included():
    r = run(1)
    r.workloads[0].impls[0].errors["y"] = float("nan")
    back = RunRecord.from_json(r.to_json())
    assert back.meta == r.meta and back.ceilings == r.ceilings
    assert math.isnan(back.workloads[0].impls[0].errors["y"])
    assert back.workloads[0].floor == r.workloads[0].floor
    assert back.workloads[1].impls[1].metrics == r.workloads[1].impls[1].metrics


def test_combined_errors_take_the_worse_mode():
    i = ImplResult("x", "ours", errors={"y": 1e-4, "s": 1e-5}, graph_errors={"y": 3e-4, "s": None})
    assert i.combined_errors() == {"y": 3e-4, "s": None}
    j = ImplResult("x", "ours", errors={"y": float("nan")}, graph_errors={"y": 1e-4})
    assert math.isnan(j.combined_errors()["y"])


def test_schema_mismatch_is_refused():
    with pytest.raises(ValueError):
        RunRecord.from_json('{"schema": 1, "meta": {}, "workloads": []}')


def test_times_below_the_math_floor_at_the_datasheet_peak_are_dropped_with_a_note():
    """A peer whose call launched nothing (0 µs) or less than the work's flops at the dense peak allow is
    not a time of the work: the number is dropped (no ratio, never the best peer) and the row says why."""
    from bench.core.aggregate import least_us
    from bench.core.render import best_peer

    r = run(1)
    w = r.workloads[0]  # 3.3 GFLOP: 3.3 µs at an H100's 989 TFLOP/s
    w.impls[4].metrics["device_us"] = 1.0  # cuDNN FE tuned: impossible
    w.impls[5].metrics["replay_us"] = 0.0  # torch.compile (CUDA graphs): nothing ran
    agg = aggregate([r])
    a = agg.workloads[0]
    assert least_us(a.floor, META["device"]) == pytest.approx(660e6 * 5 / 989.4e6)
    fe, cg = a.impl("cuDNN FE tuned"), a.impl("torch.compile (CUDA graphs)")
    assert "device_us" not in fe.metrics and "execute_us" in fe.metrics and "below the math floor" in fe.notes
    assert "replay_us" not in cg.metrics and "dropped: no time at all" in cg.notes
    assert best_peer(a, "device_us").impl == "torch eager"
    assert "device_us" in a.impl("opgraph").metrics  # 10 µs: possible, kept
