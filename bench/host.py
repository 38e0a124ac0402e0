"""Host overhead (issue 5): host time per execute of a tiny one-piece plan, beside PyTorch eager and
the cuDNN frontend's execute, and a CUDA-graph replay."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import opgraph as og

from . import peers
from .common import like, out_like, randn
from .harness import Session, host_us_per_call

DT = og.DataType


def latency(s: Session, autotune: bool) -> None:
    w = s.workload("host time per execute: tiny conv1x1+bias+relu (µs of CPU per call)", "host")
    x = randn(1, 64, 8, 8, channels_last=True)
    wt = randn(64, 64, 1, 1, scale=0.125, channels_last=True)
    b = randn(1, 64, 1, 1, channels_last=True)
    g = og.Graph("tiny", io_data_type=DT.HALF)
    X, W, B = like(g, x, "x"), like(g, wt, "w"), like(g, b, "b")
    Y = g.relu(g.bias(g.conv_fprop(X, W), B)).set_output(True)
    g.validate()
    plan = g.build(device="cuda")
    pack = {X: x, W: wt, B: b, Y: out_like(Y)}
    note = f"[{len(plan.steps)} steps: {', '.join(st.config.engine for st in plan.steps)}]"
    s.run(w, "opgraph", lambda: plan.execute(pack), timer=lambda fn: host_us_per_call(fn), note=note)
    uid_pack = {t.uid: v for t, v in pack.items()}
    s.run(w, "opgraph (UID keys)", lambda: plan.execute(uid_pack), timer=lambda fn: host_us_per_call(fn))
    f = lambda: torch.relu(F.conv2d(x, wt, b.view(-1)))  # noqa: E731
    s.run(w, "torch eager", f, timer=lambda fn: host_us_per_call(fn), note="(3 launches)")
    if peers.available():
        holder = {}

        def cfe():
            if "run" not in holder:
                holder["out"], holder["run"] = peers.conv_bias_relu(x, wt, b, 0, 1)
            holder["run"]()

        s.run(w, "cuDNN frontend", cfe, timer=lambda fn: host_us_per_call(fn))


WORKLOADS = {"latency": latency}
