"""torch.compile (default mode) on the Llama zoo model's inference (8 layers, d 1024, batch 8 x 1024, bf16):
its GPU kernels from PyTorch's profiler over 10 calls, device µs per call, launches per call and µs per
launch, longest first. What opgraph's plan is compared with, kernel by kernel.

    PYTHONPATH=$PWD python scripts/inductor_profile.py        # from the repo root, ~1 min
"""

import sys

import torch

sys.path.insert(0, ".")
from torch.profiler import ProfilerActivity, profile

from bench.workloads.zoo import _wrap, llama_model

torch.manual_seed(0)
m = _wrap(llama_model(1024, 8, 16, 4, 2816, 32000).cuda().to(torch.bfloat16).eval(), "logits")
x = torch.randint(0, 32000, (8, 1024), device="cuda")
c = torch.compile(m)
with torch.no_grad():
    for _ in range(3):
        c(x)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            c(x)
        torch.cuda.synchronize()
rows = []
for ev in prof.key_averages():
    t = getattr(ev, "device_time_total", 0) or getattr(ev, "cuda_time_total", 0)
    if t > 0:
        rows.append((t / 10, ev.count // 10, ev.key))
rows.sort(reverse=True)
print("total per call us", sum(r[0] for r in rows))
for t, n, k in rows[:40]:
    print(f"{t:9.1f} x{n:3d} {t / max(n, 1):8.1f}  {k[:150]}")
