"""The GPU kernels of opgraph's plan of the Llama zoo model's inference (8 layers, d 1024, GQA 16/4, batch
8 x 1024, bf16), as they run in sequence: PyTorch's profiler over 10 plain executes, the kernels of the last
call in launch order with their device µs (what each step takes inside the plan, where
`plan.profile_steps` times each step alone), next to the plan's steps (engine, template, ops) for matching;
then the same sums grouped by kernel name.

    PYTHONPATH=$PWD python scripts/plan_profile.py        # from the repo root, ~1 min
"""

import collections
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, ".")
import opgraph as og  # noqa: E402
from bench.workloads.zoo import llama_zoo_inference  # noqa: E402


def main() -> None:
    m, x = llama_zoo_inference()
    with torch.no_grad():
        imp = og.from_torch(m, (x,))
        plan = imp.graph.build()
        pack = imp.variant_pack(x)
        for _ in range(3):
            plan.execute(pack)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                plan.execute(pack)
            torch.cuda.synchronize()
    kernels = sorted(
        (e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time > 0),
        key=lambda e: e.time_range.start,
    )
    per_call = len(kernels) // 10
    last = kernels[-per_call:]
    print(f"{per_call} kernels a call, {sum(e.device_time for e in last):.1f} us of device time in the last call")
    for i, s in enumerate(plan.steps):
        kinds = "+".join(n.kind if n.kind != "pointwise" else str(n.op.mode.value) for n in s.piece.nodes)
        print(f"  step {i:3d} {s.config.engine:8s} {kinds[:100]}")
    for e in last:
        print(f"  {e.device_time:8.1f}  {e.name[:110]}")
    sums = collections.defaultdict(lambda: [0.0, 0])
    for e in last:
        sums[e.name[:80]][0] += e.device_time
        sums[e.name[:80]][1] += 1
    for name, (t, n) in sorted(sums.items(), key=lambda kv: -kv[1][0]):
        print(f"{t:9.1f} x{n:3d} {t / n:8.1f}  {name}")


if __name__ == "__main__":
    main()
