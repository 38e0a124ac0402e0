"""The whole benchmark pipeline on the CPU (python -m bench.run --dry-run): worker processes, checks,
timing stand-ins, repeat aggregation, files. Wiring only: the numbers mean nothing here."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_dry_run_writes_checked_tables(tmp_path):
    env = {**os.environ, "PYTHONPATH": ROOT}
    cmd = [sys.executable, "-m", "bench.run", "--dry-run", "--suite", "memory.pointwise_dag.fp16",
           "conv.r50_1x1_c256_k64.fp16", "host.execute_tiny_conv", "--repeats", "2", "--no-tune", "--warm-first",
           "--out", str(tmp_path)]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    md_files = [p for p in os.listdir(tmp_path) if p.endswith(".md")]
    json_files = [p for p in os.listdir(tmp_path) if p.endswith(".json")]
    assert len(md_files) == 1 and len(json_files) == 1
    data = json.load(open(tmp_path / json_files[0]))
    assert len(data["runs"]) == 2 and {r["repeat"] for r in data["runs"]} == {1, 2}
    assert data["warm"]["meta"]["warm"] and len(data["warm"]["workloads"]) == 3
    md = open(tmp_path / md_files[0]).read()
    assert "2 process-level repeat(s)" in md and "### Execute: plain calls" in md and "### Host time" in md
    assert "### Setup in the warm-up pass" in md
    for run in data["runs"]:
        by_id = {w["id"]: w for w in run["workloads"]}
        assert set(by_id) == {"memory.pointwise_dag.fp16", "conv.r50_1x1_c256_k64.fp16", "host.execute_tiny_conv"}
        dag = {i["impl"]: i for i in by_id["memory.pointwise_dag.fp16"]["impls"]}
        # every output of every implementation that ran was checked, ours and the peers' alike
        for name in ("opgraph", "generated", "torch eager"):
            assert set(dag[name]["errors"]) == {"y1", "y2"}, name
            assert dag[name]["verdict"]["passed"], (name, dag[name]["verdict"])
        assert dag["generated"]["engine"].startswith("triton")
        assert dag["torch.compile"]["status"] == "unavailable"
        assert "execute_us" in dag["opgraph"]["metrics"] and "setup_s" in dag["opgraph"]["metrics"]
        host = {i["impl"]: i for i in by_id["host.execute_tiny_conv"]["impls"]}
        assert "host_us" in host["opgraph"]["metrics"] and host["opgraph"]["verdict"]["passed"]
    # re-rendering the file gives the same tables
    again = subprocess.run([sys.executable, "-m", "bench.report", str(tmp_path / json_files[0])], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=120, check=False)
    assert again.returncode == 0 and "### CUDA graph: device time" in again.stdout


def test_spread_jobs_order_repeats_and_keep_host_rows_alone():
    from bench import workloads
    from bench.core import registry
    from bench.run import spread_jobs

    workloads.load()
    specs = registry.REGISTRY.select(["memory.pointwise_dag.fp16", "conv.r50_1x1_c256_k64.fp16",
                                      "host.execute_tiny_conv"])
    jobs = spread_jobs(specs, 3, "/raw", warm_first=True)
    assert [j.repeat for j in jobs] == [0] * 3 + [1] * 3 + [2] * 3 + [3] * 3
    for r in (1, 2, 3):  # the host-time group last in each round, alone
        round_ = [j for j in jobs if j.repeat == r]
        assert round_[-1].group == "host" and round_[-1].alone and not any(j.alone for j in round_[:-1])
    assert not any(j.alone for j in jobs if j.repeat == 0)
    assert len({j.raw for j in jobs}) == len(jobs)


@pytest.mark.slow
def test_dry_run_spread_over_two_gpus_merges_repeats(tmp_path):
    """--gpus 2: one worker process per (repeat, group), two at a time; the tables as from one worker per
    repeat (each repeat holds every workload), the header says how the run was spread."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    cmd = [sys.executable, "-m", "bench.run", "--dry-run", "--suite", "memory.pointwise_dag.fp16",
           "conv.r50_1x1_c256_k64.fp16", "host.execute_tiny_conv", "--repeats", "2", "--no-tune", "--warm-first",
           "--gpus", "2", "--out", str(tmp_path)]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    json_files = [p for p in os.listdir(tmp_path) if p.endswith(".json")]
    data = json.load(open(tmp_path / json_files[0]))
    assert sorted(r["repeat"] for r in data["runs"]) == [1, 2]
    for run in data["runs"]:
        assert {w["id"] for w in run["workloads"]} == {"memory.pointwise_dag.fp16", "conv.r50_1x1_c256_k64.fp16",
                                                       "host.execute_tiny_conv"}
        assert run["meta"]["spread_gpus"] == 2
    assert len(data["warm"]["workloads"]) == 3
    md = open(tmp_path / json_files[0].replace(".json", ".md")).read()
    assert "2 process-level repeat(s)" in md and "Spread over 2 GPUs" in md
