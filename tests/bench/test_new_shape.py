"""bench.new_shape: the host time of a dynamic plan's new shapes, broken down (a CPU run of the small graph)."""

from __future__ import annotations

from bench import new_shape


def test_small_graph_reports_the_stages_and_plans_one_bucket(capsys):
    assert new_shape.main(["--graph", "small", "--engines", "reference"]) == 0
    out = capsys.readouterr().out
    assert "new shape of a used bucket" in out and "seen shape" in out
    assert "carry the bucket's plan (schedule_at)" in out and "partition" not in out  # nothing re-planned
    assert "'bucket_plans': 1" in out and "'rechosen': 0" in out
