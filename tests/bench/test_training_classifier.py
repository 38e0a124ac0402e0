"""The classifier training-step workload's dry run on the CPU (tiny ResNet-18, reference engine, eager
PyTorch): every output (loss, each gradient read from the step's momentum buffers in the parameters'
layout, each updated parameter, each running statistic) is checked against the float64 step, for
opgraph and the eager peer alike. (The GPU smoke run of 2026-11-26 found this workload reading a
`TrainStep` attribute that no longer exists: a dry run catches that on the CPU.)

The group's float32 check (the same step in float32, opgraph built without TF32, eager float32 the peer)
is checked and not timed: where fp16's own error makes the fp16 check loose, it is tight."""

from __future__ import annotations

import pytest

from .helpers import assert_step_checked, dry_run_step


@pytest.mark.slow
def test_dry_run_of_the_resnet18_training_step(tmp_path):
    w, names, n_params = dry_run_step(tmp_path, "training-resnet18")
    n_stats = sum(n.startswith("stat:") for n in names)
    assert names[0] == "loss" and n_params == 62 and n_stats == 40 and len(names) == 1 + 2 * n_params + n_stats
    assert_step_checked(w, names, 0.5)
    f32 = w["others"]["training.resnet18.b64.float32"]
    assert [o[0] for o in f32["outputs"]] == names and {o[1] for o in f32["outputs"]} == {"float32"}
    by_name = assert_step_checked(f32, names, 1e-3)
    assert set(by_name) == {"opgraph", "torch eager"}  # no compile peers in the check
    for i in by_name.values():
        assert set(i["metrics"]) == {"setup_s"}, i["metrics"]  # checked, not timed
