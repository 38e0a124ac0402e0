"""The ecosystem models' workloads (bench/workloads/zoo.py) dry-run on the CPU at tiny sizes
(reference engine, eager PyTorch): every output of every implementation is checked against the
float64 module before anything would be timed. timm's workloads skip where timm is not installed."""

from __future__ import annotations

import importlib.util

import pytest

from .helpers import dry_run, dry_run_step

pytestmark = pytest.mark.slow


def _impls(w):
    assert not w["error"], w["error"]
    return {i["impl"]: i for i in w["impls"]}


@pytest.mark.parametrize("group", ["zoo-llama-infer", "zoo-bert-infer"])
def test_inference_workload_checks_opgraph_and_eager(tmp_path, group):
    (w,) = dry_run(tmp_path, "--suite", group, "--repeats", "1")["runs"][0]["workloads"]
    impls = _impls(w)
    for name in ("opgraph", "torch eager"):
        i = impls[name]
        assert i["status"] == "ok" and set(i["errors"]) == {"out"}, (name, i["error"])
        assert i["verdict"]["passed"], (name, i["verdict"])
        assert 0 < i["errors"]["out"] < 0.02, (name, i["errors"])  # bf16 through a tiny model
    assert impls["opgraph"]["engine"] == "reference"
    assert impls["torch.compile (default mode)"]["status"] == "unavailable"


def test_llama_training_step_checks_every_gradient_and_parameter(tmp_path):
    w, names, n_params = dry_run_step(tmp_path, "zoo-llama-train")
    assert names[0] == "loss" and n_params == 21 and len(names) == 1 + 2 * n_params  # 2 layers, untied head
    impls = _impls(w)
    for name in ("opgraph", "torch eager"):
        i = impls[name]
        assert i["status"] == "ok" and set(i["errors"]) == set(names), (name, i["error"])
        # bf16 mixed precision of a tiny model: within 3% of the float64 step on every output (eager's
        # CPU autocast, the tolerance's basis here, casts differently from the CUDA rules opgraph follows)
        assert all(e is not None and e < 0.03 for e in i["errors"].values()), (name, i["errors"])


@pytest.mark.skipif(importlib.util.find_spec("timm") is None, reason="timm is not installed")
@pytest.mark.parametrize("group", ["zoo-vit-train", "zoo-convnext-infer"])
def test_timm_workloads_run(tmp_path, group):
    (w,) = [v for v in dry_run(tmp_path, "--suite", group, "--repeats", "1")["runs"][0]["workloads"]]
    assert _impls(w)["torch eager"]["status"] == "ok"
