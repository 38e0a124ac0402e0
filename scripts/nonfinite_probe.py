"""The GPU fuzzer's non-finite findings of 2026-11-25 (H100), asked directly. One short run on a GPU:

    python scripts/nonfinite_probe.py

1. Each case (tests/fuzz/regressions/seed<N>.json) on every GPU engine set, with the plan's steps.
2. PyTorch's grouped data gradient (cuDNN) with NaN in one group's DY: do other groups' DX turn NaN?
   (seed 20261125503297: the torch engine's DX[0, 0, 0] was NaN, its group's DY finite.)
3. PyTorch's conv1d with NaN filter taps at the seed 20261125508880 shape (bf16, fp32 out).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

REG = Path(__file__).resolve().parent.parent / "tests" / "fuzz" / "regressions"
SEEDS = (20261125503297, 20261125508880, 20261125503308)


def cases() -> None:
    from tests.fuzz.replay import load
    from tests.fuzz.runner import GPU_SETS, Runner, graph_of

    for seed in SEEDS:
        path = REG / f"seed{seed}.json"
        case = load(str(path) if path.exists() else seed)
        for es in GPU_SETS:
            runner = Runner("cuda", (es,), repeat=1.0, plan_files=1.0, damage=0.0)
            try:
                plan = runner._build(graph_of(case), es, case)
                steps = "; ".join(f"{s.config.engine}:{s.config.knob('template')}" for s in plan.steps)
            except Exception as err:  # noqa: BLE001
                steps = f"build: {type(err).__name__}: {err}"[:200]
            fails = []
            for _ in range(3):
                fails += [str(f) for f in runner.run(case).failures]
            print(f"seed {seed} [{es.name}] steps: {steps}\n   {len(fails)} failure(s) in 3 runs: {fails[:2]}")


def grouped_dgrad() -> None:
    for dt in (torch.bfloat16, torch.float32):
        for n, c, k, w_len in ((2, 4, 8, 5), (2, 64, 64, 32)):
            groups = c  # C/G = 1 as in the seed, and K/G = 2
            w = torch.randn(k, 1, 2, device="cuda", dtype=dt)
            dy = torch.randn(n, k, w_len, device="cuda", dtype=dt)
            dy[:, 2:4] = float("nan")  # group 1 only
            dx = torch.nn.grad.conv1d_input((n, c, w_len + 1), w, dy, 1, 1, 1, groups)
            others = torch.cat([dx[:, :1], dx[:, 2:]], dim=1)
            print(
                f"grouped dgrad {dt} N{n} C{c} K{k} W{w_len}: group 1 NaN {bool(dx[:, 1].isnan().all())}, "
                f"NaN elements in other groups {int(others.isnan().sum())} of {others.numel()}"
            )


def fprop_nan_taps() -> None:
    for dt in (torch.bfloat16, torch.float32):
        x = torch.randn(2, 4, 3, device="cuda", dtype=dt)
        w = torch.randn(2, 4, 3, device="cuda", dtype=dt)
        w[0, 1, 2] = float("nan")
        y = F.conv1d(x, w)
        print(f"conv1d {dt} NaN tap in filter 0: y = {y.flatten().tolist()} (all NaN expected for k=0)")


if __name__ == "__main__":
    for part in (grouped_dgrad, fprop_nan_taps, cases):
        try:
            part()
        except Exception as err:  # noqa: BLE001
            print(f"{part.__name__}: {type(err).__name__}: {err}")
