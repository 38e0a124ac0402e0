"""The GPU kernels torch.compile runs for the Llama zoo model's inference (8 layers, d 1024, GQA 16/4, batch
8 x 1024, bf16): default mode with freezing (the bench's best peer for that row), PyTorch's profiler over 10
calls, the last call's kernels in launch order with their device µs, then the sums by kernel name: the
same listing as scripts/plan_profile.py gives for opgraph's plan, to set the two side by side a layer at a
time (where Inductor's kernels are faster than opgraph's steps is where the next lever is).

    PYTHONPATH=$PWD python scripts/compile_profile.py [--mode max-autotune-no-cudagraphs]   # ~1-2 min
"""

import argparse
import collections
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, ".")
from bench.workloads.zoo import llama_zoo_inference  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", default="default")
    args = parser.parse_args()
    m, x = llama_zoo_inference()
    f = torch.compile(m, mode=args.mode, dynamic=False)
    with torch.no_grad(), torch._inductor.config.patch(freezing=True):
        for _ in range(3):
            f(x)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                f(x)
            torch.cuda.synchronize()
    kernels = sorted(
        (e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time > 0),
        key=lambda e: e.time_range.start,
    )
    per_call = len(kernels) // 10
    last = kernels[-per_call:]
    print(f"{per_call} kernels a call, {sum(e.device_time for e in last):.1f} us of device time in the last call")
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
