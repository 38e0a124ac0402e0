#!/usr/bin/env python3
"""Time the depthwise template's configs on ConvNeXt-T's depthwise convs (7x7, +bias, bf16 NHWC, batch 64)
beside cuDNN's (PyTorch `F.conv2d`, channels-last), every output checked against float64 first:

    python3 scripts/depthwise_sweep.py --out $OUT [--stages 0,1] [--budget 150] [--knobs '[{"BLOCK_M": 128, "UNROLL": 1}]']

The configs are the template's candidates (heuristic mode B: all of them), then each `--knobs` dict laid
over the heuristic's pick. One row per (stage, config) in OUT/depthwise_sweep.json, printed as it comes;
nothing new starts after --budget seconds. The rows of 2026-11-30 (H200) are in
bench/results/2026-11-30-h200-vit-train-layout.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

STAGES = [(64, 96, 56), (64, 192, 28), (64, 384, 14), (64, 768, 7)]  # batch, channels, side


def _time(fn) -> float:
    """Device µs a call, host hidden (bench.measure.burst_us: 20 calls behind a spin kernel, median of 5)."""
    from bench.measure import burst_us

    fn()
    return burst_us(fn, calls=20, rounds=5)


def _graph(n: int, c: int, h: int):
    import opgraph as og

    dt = og.DataType
    g = og.Graph("depthwise", io_data_type=dt.BFLOAT16, intermediate_data_type=dt.FLOAT, compute_data_type=dt.FLOAT)
    x = g.tensor(dim=[n, c, h, h], stride=[c * h * h, 1, h * c, c], name="x")
    w = g.tensor(dim=[c, 1, 7, 7], stride=[49, 49, 7, 1], name="w")
    b = g.tensor(dim=[1, c, 1, 1], stride=[c, 1, c, c], name="b")
    y = g.add(g.conv_fprop(x, w, padding=[3, 3], name="conv"), b).set_output(True).set_name("y")
    y.set_stride([c * h * h, 1, h * c, c])
    return g, x, w, b, y


def run_stage(n: int, c: int, h: int, extra: list[dict], deadline: float) -> list[dict]:
    import torch
    import torch.nn.functional as F

    from opgraph.core.config import HeurMode
    from opgraph.engines import EngineConfig, get_engine
    from opgraph.runtime.plan import ExecutionPlan, Step

    g, x, w, b, y = _graph(n, c, h)
    plan = g.build(device="cuda", engines=["triton"], heur_mode=[HeurMode.B])
    (step,) = plan.steps
    X = torch.randn(n, h, h, c, device="cuda").to(torch.bfloat16).permute(0, 3, 1, 2)
    W = (torch.randn(c, 1, 7, 7, device="cuda") / 7).to(torch.bfloat16)
    B = torch.randn(1, c, 1, 1, device="cuda").to(torch.bfloat16)
    ref = F.conv2d(X.double(), W.double(), padding=3, groups=c) + B.double()
    shape = [n, c, h]
    floor = 2 * 2 * n * c * h * h / 3.0e12 * 1e6  # bf16 image read once, output written once, at 3 TB/s

    def err(t) -> float:
        return ((t.double() - ref).norm() / ref.norm()).item()

    torch.backends.cudnn.benchmark = True
    xc = X.contiguous(memory_format=torch.channels_last)
    peer = lambda: F.conv2d(xc, W, B.view(-1), padding=3, groups=c)  # noqa: E731
    rows = [dict(shape=shape, impl="cuDNN (F.conv2d, channels-last)", us=_time(peer), err=err(peer()), floor_us=floor)]
    print(rows[-1], flush=True)
    base = dict(step.config.knobs)
    configs = [step.config, *step.alternatives]
    configs += [EngineConfig("triton", tuple(sorted({**base, **k}.items()))) for k in extra]
    for config in configs:
        if time.time() > deadline:
            break
        row: dict = dict(shape=shape, impl="triton", knobs=dict(config.knobs), first=config is step.config)
        try:
            kernel = get_engine(config.engine).compile(step.piece, config, plan.device)
            one = ExecutionPlan(plan.graph, plan.device, (Step(0, step.piece, config, kernel),), plan.cuts)
            out = torch.full((n, h, h, c), float("nan"), device="cuda", dtype=torch.bfloat16).permute(0, 3, 1, 2)
            bound = one.bind({x: X, w: W, b: B, y: out})
            bound.run()
            torch.cuda.synchronize()
            row.update(us=_time(bound.run), err=err(out))
        except Exception as e:  # noqa: BLE001 (a config that does not compile or run is a row saying so)
            row.update(error=f"{type(e).__name__}: {str(e)[:300]}")
        rows.append(row)
        print(row, flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="/tmp/depthwise-sweep")
    p.add_argument("--stages", default="0,1,2,3", help="of ConvNeXt-T's four stages (0: 96 x 56²)")
    p.add_argument("--budget", type=float, default=150.0, help="seconds; nothing new starts after")
    p.add_argument("--knobs", default="[]", help="JSON list of knob dicts laid over the heuristic's pick")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.time() + args.budget
    rows: list[dict] = []
    for i in (int(s) for s in args.stages.split(",")):
        rows += run_stage(*STAGES[i], json.loads(args.knobs), deadline)
        (out / "depthwise_sweep.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
