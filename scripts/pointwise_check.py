"""The memory-bound steps of the Llama zoo model's inference plan (embedding, RMSNorm, rotary embedding,
reductions: the first layer's, one layer holds them all), each timed with every knob set its template
offers and a sweep of the flat walk's BLOCK x num_warps, against a bandwidth floor (torch's copy of the
same bytes, read and written). Each alternative's outputs are checked against the plan's own kernel's
first (outputs poisoned with NaN before each run).

    PYTHONPATH=$PWD python scripts/pointwise_check.py > $OUT/pointwise_check.txt      # from the repo root, ~1 min
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

FLAT = [(1024, 4), (2048, 4), (2048, 8), (4096, 4), (4096, 8), (8192, 8), (8192, 16), (16384, 16)]
MEMORY_BOUND = ("pointwise", "reduction", "rownorm")


def main() -> None:
    import torch

    import opgraph as og
    from bench.measure import replay_us
    from bench.workloads.zoo import llama_zoo_inference
    from opgraph.core.config import HeurMode
    from opgraph.engines import EngineConfig
    from opgraph.engines.triton import TritonEngine

    t0 = time.time()
    m, x = llama_zoo_inference(layers=1)
    with torch.no_grad():
        imp = og.from_torch(m, (x,))
    plan = imp.graph.build()
    pack = imp.variant_pack(x)
    plan.execute(pack)
    torch.cuda.synchronize()
    bound = plan.bind(pack)
    bufs = bound.binding.buffers  # (every tensor of the plan: the pack's and the workspace's views)
    eng = TritonEngine()
    dev = plan.device
    # the floor: a device copy of 16 MiB (8192 x 1024 bf16), read once and written once
    a = torch.randn(8192, 1024, device="cuda").to(torch.bfloat16)
    b = torch.empty_like(a)
    floor = replay_us(lambda: b.copy_(a), 20, 15)
    print(f"floor: copy of 8192 x 1024 bf16 {floor:.1f} us ({2 * a.nbytes / floor / 1e3:.0f} GB/s)")
    for step in plan.steps:
        template = str(step.config.knob("template", ""))
        if step.config.engine != "triton" or template not in MEMORY_BOUND:
            continue
        piece = step.piece
        moved = sum(piece.tensor(u).nbytes for u in (*piece.inputs, *piece.outputs))
        outs = list(piece.outputs)
        for u in outs:
            bufs[u].fill_(float("nan")) if bufs[u].is_floating_point() else None
        step.kernel.run(bufs)
        torch.cuda.synchronize()
        want = {u: bufs[u].clone() for u in outs}
        ops = "+".join(n.kind for n in piece.nodes)[:100]
        configs = [c for c in eng.configs(piece, dev, HeurMode.A)] + [c for c in eng.configs(piece, dev, HeurMode.B)]
        if template == "pointwise":
            configs += [
                EngineConfig("triton", (("template", "pointwise"), ("BLOCK", blk), ("num_warps", w))) for blk, w in FLAT
            ]
        seen: set = set()
        print(
            f"== step {step.index} {template} ({ops}) {moved / 2**20:.1f} MiB moved, est {step.config.estimate_us or 0:.1f}"
        )
        for config in [step.config, *configs]:
            key = tuple(config.knobs)
            if key in seen:
                continue
            seen.add(key)
            knobs = " ".join(f"{k}={v}" for k, v in config.knobs if k != "template")
            try:
                kernel = step.kernel if config is step.config else eng.compile(piece, config, dev)
                for u in outs:
                    bufs[u].fill_(float("nan")) if bufs[u].is_floating_point() else None
                kernel.run(bufs)
                torch.cuda.synchronize()
                err = max(
                    ((bufs[u].double() - want[u].double()).norm() / want[u].double().norm().clamp_min(1e-30)).item()
                    for u in outs
                )
                us = replay_us(lambda kernel=kernel: kernel.run(bufs), 20, 15)
                mark = " (plan)" if config is step.config else ""
                print(f"   {us:7.1f} us {moved / us / 1e3:6.0f} GB/s err {err:.1e} {knobs}{mark}", flush=True)
            except Exception as e:  # noqa: BLE001 - recorded, the next config runs
                print(f"   failed {knobs}: {type(e).__name__}: {str(e)[:200]}", flush=True)
        if step.index > 12:
            break
    print(f"({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
