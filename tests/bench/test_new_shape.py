"""bench.new_shape: the host time of a dynamic plan's new shapes, broken down (a CPU run of the small
graph, in a process of its own: the bench wraps the planner's functions for the process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_small_graph_reports_the_stages_and_plans_one_bucket():
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    run = subprocess.run(
        [sys.executable, "-m", "bench.new_shape", "--graph", "small", "--engines", "reference"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert "new shape of a used bucket" in out and "seen shape" in out
    assert "carry the bucket's plan (schedule_at)" in out and "partition" not in out  # nothing re-planned
    assert "'bucket_plans': 1" in out and "'rechosen': 0" in out
