"""Synthetic result records for the benchmark's CPU tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.core.floors import Ceilings, Floor
from bench.core.records import ImplResult, RunRecord, WorkloadResult

META = {
    "date": "2026-11-26",
    "device": "NVIDIA H100 80GB HBM3",
    "driver": "580.1",
    "hostname": "gpu-a",
    "cpu": "Xeon",
    "torch": "2.11.0",
    "triton": "3.6.0",
    "cuda": "13.0",
    "cudnn": 91900,
    "python": "3.12",
    "opgraph_commit": "abc123",
    "settings": "s",
    "gpu_count": 1,
}


def impl(
    name: str,
    role: str,
    *,
    device: float | None = None,
    execute: float | None = None,
    err: float | None = 1e-4,
    tuned: bool | None = None,
    engine: str = "",
    replay: float | None = None,
    status: str = "ok",
    error: str = "",
) -> ImplResult:
    metrics = {
        k: v
        for k, v in (
            ("device_us", device),
            ("execute_us", execute),
            ("replay_us", replay),
            ("latency_us", execute and execute * 2),
            ("setup_s", 1.0),
        )
        if v is not None
    }
    return ImplResult(
        name,
        role,
        tuned,
        engine or ("triton:conv_fprop" if role == "ours" else "cuDNN"),
        status,
        error,
        {"y": err} if status == "ok" else {},
        {"y": err} if device is not None else {},
        metrics,
    )


def run(repeat: int, scale: float = 1.0, *, meta: dict | None = None, ours_err: float = 1e-4) -> RunRecord:
    w = WorkloadResult(
        "conv.a.fp16", "conv A fp16", "conv-fp16", "kernel", [("y", "float16")], Floor(bytes=3e6, flops=660e6 * 5)
    )
    w.impls = [
        impl("opgraph", "ours", device=10.0 * scale, execute=20.0 * scale, tuned=False, err=ours_err),
        impl("opgraph tuned", "ours", device=8.0 * scale, execute=18.0 * scale, tuned=True),
        impl("generated", "ours", device=12.0 * scale, execute=22.0 * scale, tuned=False),
        impl("torch eager", "peer", device=16.0 * scale, execute=40.0 * scale, err=2e-3),
        impl("cuDNN FE tuned", "peer", device=9.0 * scale, execute=30.0 * scale, err=1e-3, tuned=True),
        impl("torch.compile (CUDA graphs)", "peer", replay=11.0 * scale, err=2e-3),
        impl("torch.compile", "peer", status="unavailable", error="needs compile"),
    ]
    w2 = WorkloadResult("conv.b.fp16", "conv B fp16", "conv-fp16", "kernel", [("y", "float16")], Floor(bytes=3e6))
    w2.impls = [
        impl("opgraph", "ours", device=5.0 * scale, execute=9.0, tuned=False),
        impl("torch eager", "peer", device=4.0 * scale, execute=8.0, err=1e-3),
    ]
    return RunRecord(dict(meta or META), Ceilings(3000.0 * scale, {"float16": 660.0}), [w, w2], repeat)


ROOT = Path(__file__).resolve().parents[2]


def dry_run(out: Path, *args: str, timeout: float = 600) -> dict[str, Any]:
    """`python -m bench.run --dry-run ARGS --out OUT` in a subprocess (the whole pipeline on the CPU): it
    must exit 0; the JSON of the one results file it writes."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "bench.run", "--dry-run", *args, "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (json_file,) = [p for p in os.listdir(out) if p.endswith(".json")]
    return json.load(open(out / json_file))


def dry_run_step(out: Path, group: str) -> tuple[dict[str, Any], list[str], int]:
    """One repeat of a training-step group's dry run: its timed workload (which must not have failed), its
    output names and how many parameters it checks (the `grad:` outputs). The group's other workloads
    (a float32 check) are under the returned workload's "others" key, by id."""
    data = dry_run(out, "--suite", group, "--repeats", "1")
    ws = data["runs"][0]["workloads"]
    for w in ws:
        assert not w["error"], (w["id"], w["error"])
    (w,) = [v for v in ws if v.get("timed", True)]
    w["others"] = {v["id"]: v for v in ws if v is not w}
    names = [o[0] for o in w["outputs"]]
    return w, names, sum(n.startswith("grad:") for n in names)


def assert_step_checked(
    w: dict[str, Any], names: list[str], max_err: float, impls: tuple[str, ...] = ("opgraph", "torch eager")
) -> dict[str, dict[str, Any]]:
    """Every output of a training step's workload `w` checked for each of `impls`, all within `max_err`
    and the tolerance rule; the implementations by name."""
    by_name = {i["impl"]: i for i in w["impls"]}
    for name in impls:
        i = by_name[name]
        assert i["status"] == "ok" and set(i["errors"]) == set(names), (name, i["error"])
        assert all(e is not None and e < max_err for e in i["errors"].values()), (name, i["errors"])
        assert i["verdict"]["passed"], (name, i["verdict"])
    return by_name
