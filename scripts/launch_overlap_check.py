"""What launch overlap (programmatic dependent launch: docs/engines.md#launches-that-overlap) does to the Llama
zoo model's inference plan (8 layers, d 1024, GQA 16/4, batch 8 x 1024, bf16): the plan built once per
OPGRAPH_LAUNCH_OVERLAP mode, each in its own process (the mode is read when a plan is built), its output
checked against PyTorch's and, across modes, bitwise against the plain launches'; replayed 10 times in one
CUDA graph (the same output each time: no race); device µs per call from CUDA-graph replays (three medians)
and plain executes.

    PYTHONPATH=$PWD python scripts/launch_overlap_check.py [--modes 0 1 all]       # ~1 min a mode
"""

import argparse
import os
import subprocess
import sys
import time

OUTPUT = "/tmp/launch_overlap_{}.pt"


def one(mode: str) -> None:
    import torch

    sys.path.insert(0, ".")
    import opgraph as og
    from bench.measure import burst_us, replay_us
    from bench.workloads.zoo import llama_zoo_inference

    torch.manual_seed(0)
    m, x = llama_zoo_inference()
    with torch.no_grad():
        ref = m(x).float()
        imp = og.from_torch(m, (x,))
        t = time.perf_counter()
        plan = imp.graph.build()
        build_s = time.perf_counter() - t
        pack = imp.variant_pack(x)
        out = imp.outputs[0].known_uid()
        pack[out].fill_(float("nan"))
        plan.execute(pack)
        torch.cuda.synchronize()
        got = pack[out].clone()
        err = ((got.float() - ref).norm() / ref.norm()).item()
        torch.save(got.cpu(), OUTPUT.format(mode))
        waiting = sum("gdc_wait" in plan.source(i) for i, s in enumerate(plan.steps) if s.config.engine == "triton")
        graph_us = sorted(replay_us(lambda: plan.execute(pack), 5, 9) for _ in range(3))
        execute_us = burst_us(lambda: plan.execute(pack), 5, 5)
        captured = plan.populate_cuda_graph(pack)
        same = True
        for _ in range(10):
            pack[out].fill_(float("nan"))
            captured.replay()
            torch.cuda.synchronize()
            same = same and bool(torch.equal(pack[out], got))
    print(
        f"OPGRAPH_LAUNCH_OVERLAP={mode}: graph {', '.join(f'{u:.0f}' for u in graph_us)} us, execute "
        f"{execute_us:.0f} us; {len(plan.steps)} steps, {waiting} waiting; build {build_s:.1f} s; error against "
        f"PyTorch {err:.2e}; 10 replays equal: {same}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--modes", nargs="+", default=["0", "1", "all"])
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        return one(args.one)
    for mode in args.modes:
        env = {**os.environ, "OPGRAPH_LAUNCH_OVERLAP": mode}
        subprocess.run([sys.executable, __file__, "--one", mode], env=env, check=False)
    import torch

    base = torch.load(OUTPUT.format(args.modes[0]))
    for mode in args.modes[1:]:
        print(f"{mode} against {args.modes[0]}: bitwise equal {torch.equal(torch.load(OUTPUT.format(mode)), base)}")


if __name__ == "__main__":
    main()
