"""Probe one launch path on the GPU in a process of its own (scripts/runtime_gpu.sh): a crash here turns
the path off for the rest of the run instead of ending it. `python scripts/runtime_probe.py triton|cudnn`;
exit status 0 when the path gives PyTorch's result."""

from __future__ import annotations

import os
import sys
import time

import torch

import opgraph as og
from opgraph.tools.samples import nhwc


def cl(t: torch.Tensor) -> torch.Tensor:
    return t.to(memory_format=torch.channels_last)


def triton() -> bool:
    dims = [4, 32, 8, 8]
    g = og.Graph("probe", io_data_type=og.DataType.HALF)
    x = g.tensor(dim=dims, stride=nhwc(dims), name="x")
    b = g.tensor(dim=[1, 32, 1, 1], name="b")
    y = g.relu(g.bias(x, b)).set_output(True)
    t0 = time.perf_counter()
    plan = g.build(device="cuda", engines=["triton"])
    print("build", time.perf_counter() - t0, plan.build_stats, flush=True)
    xv = cl(torch.randn(*dims, device="cuda", dtype=torch.float16))
    bv = torch.randn(1, 32, 1, 1, device="cuda", dtype=torch.float16)
    yv = torch.full_like(xv, float("nan"))
    plan.execute({x: xv, b: bv, y: yv})
    torch.cuda.synchronize()
    ok = torch.allclose(yv.float(), torch.relu(xv.float() + bv.float()), atol=1e-2)
    bound = plan._prepare({x: xv, b: bv, y: yv}, None)
    print(
        "launches", [type(launch).__name__ for launcher in bound.launchers for launch in launcher.launches], flush=True
    )
    return ok


def cudnn() -> bool:
    import cudnn as cfe

    print("frontend", cfe.__version__, "backend", cfe.backend_version(), flush=True)
    dims = [8, 64, 28, 28]
    g = og.Graph("probe", io_data_type=og.DataType.HALF)
    x = g.tensor(dim=dims, stride=nhwc(dims), name="x")
    w = g.tensor(dim=[64, 64, 3, 3], stride=nhwc([64, 64, 3, 3]), name="w")
    y = g.relu(g.conv_fprop(x, w, padding=[1, 1])).set_output(True)
    t0 = time.perf_counter()
    plan = g.build(device="cuda", engines=["cudnn", "triton", "torch"])
    print("build", time.perf_counter() - t0, plan.build_stats, plan.steps[0].config, flush=True)
    k = plan.steps[0].kernel
    print(
        "serialized",
        None if getattr(k, "serialized", None) is None else len(k.serialized),
        "cpp_index",
        getattr(k, "cpp_index", None),
        flush=True,
    )
    xv = cl(torch.randn(*dims, device="cuda", dtype=torch.float16))
    wv = cl(torch.randn(64, 64, 3, 3, device="cuda", dtype=torch.float16) / 24)
    yv = torch.full_like(xv, float("nan"))
    plan.execute({x: xv, w: wv, y: yv})
    torch.cuda.synchronize()
    want = torch.relu(torch.nn.functional.conv2d(xv.float(), wv.float(), padding=1))
    ok = torch.allclose(yv.float(), want, atol=3e-2, rtol=3e-2)
    bound = plan._prepare({x: xv, w: wv, y: yv}, None)
    print("mode", getattr(bound.launchers[0], "mode", None), "ok", ok, flush=True)
    if getattr(k, "serialized", None) is not None:
        from opgraph.engines import cudnn_launch

        t0 = time.perf_counter()
        again = cudnn_launch.deserialize(k.handle, k.serialized)
        print("deserialize s", time.perf_counter() - t0, "workspace", again.get_workspace_size(), flush=True)
    return ok


if __name__ == "__main__":
    import faulthandler

    faulthandler.enable()
    faulthandler.dump_traceback_later(50, exit=True)  # a hang shows where it hangs
    which = sys.argv[1]
    ok = {"triton": triton, "cudnn": cudnn}[which]()
    print("PROBE", which, "OK" if ok else "WRONG", os.environ.get("OPGRAPH_LAUNCH"), flush=True)
    sys.exit(0 if ok else 1)
