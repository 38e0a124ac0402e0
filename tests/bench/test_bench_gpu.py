"""The benchmark's GPU-only paths (the suite's CUDA-graph helper, device time from graphs, cuDNN
frontend peers, torch.compile rows, CUDA-graph host operations) on small shapes. GPU only."""

from __future__ import annotations

import argparse

import pytest

pytestmark = pytest.mark.gpu


def _ctx(compile_: bool):
    from bench.case import Ctx
    from bench.worker import configure_torch, features

    args = argparse.Namespace(dry_run=False, no_compile=not compile_)
    configure_torch(True)
    return Ctx(
        device="cuda", scale="quick", tune=False, compile=compile_, compile_cudagraphs=compile_, features=features(args)
    )


def _run(spec_id: str, compile_: bool = False):
    from bench import measure, workloads
    from bench.core.registry import REGISTRY
    from bench.runner import run_workload

    workloads.load()
    w = run_workload(_ctx(compile_), REGISTRY.get(spec_id), measure.Budget(rounds=3, latency_calls=5))
    assert not w.error, w.error
    return w, {i.impl: i for i in w.impls}


def test_kernel_workload_every_mode_and_check():
    _, by = _run("conv.r50_3x3_c64.fp16")
    for name in ("opgraph", "generated", "torch eager", "torch.cudnn_convolution_relu"):
        i = by[name]
        assert i.status == "ok" and i.verdict["passed"], (name, i.error, i.verdict)
        assert set(i.errors) == {"y"} and set(i.graph_errors) == {"y"}  # both modes checked
        for m in ("device_us", "replay_us", "execute_us", "latency_us", "setup_s"):
            assert i.metrics[m] > 0, (name, m)
        assert i.methods["device_us"].startswith("CUDA graph of")
    assert by["generated"].engine.startswith("triton")
    fe = by["cuDNN FE heuristic"]
    assert fe.status in ("ok", "unavailable"), fe.error
    if fe.status == "ok":
        assert fe.verdict["passed"] and fe.engine.startswith("cuDNN")


def test_compile_rows_execute_and_own_cuda_graphs():
    _, by = _run("memory.pointwise_chain.fp16", compile_=True)
    c, g = by["torch.compile"], by["torch.compile (CUDA graphs)"]
    assert c.status == "ok" and c.verdict["passed"] and "execute_us" in c.metrics and "device_us" in c.metrics
    assert g.status == "ok" and g.verdict["passed"] and "replay_us" in g.metrics and "execute_us" not in g.metrics


def test_cuda_graph_host_operations_check_both_packs():
    _, by = _run("host.cuda_graph_ops.conv")
    for name, i in by.items():
        assert i.status == "ok" and i.verdict["passed"], (name, i.error, i.verdict)
        assert set(i.errors) == {"y0", "y1"} and i.metrics["host_us"] > 0
