"""The classifier training-step workload's dry run on the CPU (tiny ResNet-18, reference engine, eager
PyTorch): every output (loss, each gradient read from the step's momentum buffers in the parameters'
layout, each updated parameter, each running statistic) is checked against the float64 step, for
opgraph and the eager peer alike. (The GPU smoke run of 2026-11-26 found this workload reading a
`TrainStep` attribute that no longer exists: a dry run catches that on the CPU.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_dry_run_of_the_resnet18_training_step(tmp_path):
    env = {**os.environ, "PYTHONPATH": ROOT}
    cmd = [sys.executable, "-m", "bench.run", "--dry-run", "--suite", "training-resnet18", "--repeats", "1",
           "--out", str(tmp_path)]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (json_file,) = [p for p in os.listdir(tmp_path) if p.endswith(".json")]
    (w,) = json.load(open(tmp_path / json_file))["runs"][0]["workloads"]
    assert not w["error"], w["error"]
    names = [o[0] for o in w["outputs"]]
    n_params = sum(n.startswith("grad:") for n in names)
    n_stats = sum(n.startswith("stat:") for n in names)
    assert names[0] == "loss" and n_params == 62 and n_stats == 40 and len(names) == 1 + 2 * n_params + n_stats
    impls = {i["impl"]: i for i in w["impls"]}
    for name in ("opgraph", "torch eager"):
        i = impls[name]
        assert i["status"] == "ok" and set(i["errors"]) == set(names), (name, i["error"])
        assert all(e is not None and e < 0.5 for e in i["errors"].values()), (name, i["errors"])
        assert i["verdict"]["passed"], (name, i["verdict"])
