"""How far the build's ranking is from the timed best on the Llama zoo model's inference (8 layers, d 1024,
GQA 16/4, batch 8 x 1024, bf16): from_torch's plan built with the heuristic ranking and with autotune=True,
both checked against PyTorch, device µs per call from CUDA-graph replays, the build seconds, and every
step whose config the tuner changed (each step alone, heuristic -> tuned).

    PYTHONPATH=$PWD python scripts/llama_autotune_check.py        # from the repo root, ~3 min
"""

import sys
import time

import torch

sys.path.insert(0, ".")
import opgraph as og  # noqa: E402
from bench.measure import replay_us  # noqa: E402
from bench.workloads.zoo import llama_zoo_inference  # noqa: E402


def main() -> None:
    m, x = llama_zoo_inference()
    with torch.no_grad():
        ref = m(x).float()
        imp = og.from_torch(m, (x,))
        plans = {}
        for label, opts in (("heuristic", {}), ("autotuned", {"autotune": True})):
            t = time.perf_counter()
            plan = imp.graph.build(**opts)
            build_s = time.perf_counter() - t
            pack = imp.variant_pack(x)
            out = imp.outputs[0].known_uid()
            pack[out].fill_(float("nan"))
            plan.execute(pack)
            torch.cuda.synchronize()
            err = ((pack[out].float() - ref).norm() / ref.norm()).item()
            us = replay_us(lambda plan=plan, pack=pack: plan.execute(pack), 5, 7)
            print(
                f"{label}: {us:8.1f} us a call, {len(plan.steps)} steps, build {build_s:.1f} s, err {err:.2e}",
                flush=True,
            )
            plans[label] = (plan, {r.step: r.device_us for r in plan.profile_steps(pack, repeat=10)})
    (hp, ht), (tp, tt) = plans["heuristic"], plans["autotuned"]
    if len(hp.steps) != len(tp.steps):
        print("the plans cut the graph differently")
        return
    for i, (hs, ts) in enumerate(zip(hp.steps, tp.steps)):
        if str(hs.config) != str(ts.config) and i < 16 or i >= len(hp.steps) - 2:
            print(f"  {i:3d} {ht[i]:8.1f} -> {tt[i]:8.1f}  {str(hs.config)[:140]}\n{'':24s}-> {str(ts.config)[:140]}")


if __name__ == "__main__":
    main()
