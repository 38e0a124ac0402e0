"""Where the host time of plan.execute goes (run on the GPU machine)."""

import sys
import time

import torch

sys.path.insert(0, ".")
import opgraph as og  # noqa: E402
from opgraph.tools.samples import batchnorm_relu, conv_bias_relu  # noqa: E402
from opgraph.core.torch_interop import pack_to_device  # noqa: E402


def per_call(fn, n=3000):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    dt = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return dt


for g in (conv_bias_relu(n=1, c=64, k=64, hw=8), batchnorm_relu(n=2, c=64, hw=8)):
    plan = g.build(device="cuda")
    pack = pack_to_device(og.testing.random_pack(g.final, __import__("numpy").random.default_rng(0)), "cuda")
    plan.execute(pack)
    print(g.name, [s.config.knob("template") for s in plan.steps])
    print("  execute           %.1f us" % per_call(lambda: plan.execute(pack)))
    print("  bind (same pack)  %.1f us" % per_call(lambda: plan._binder.bind(pack)))
    print("  bind (new dict)   %.1f us" % per_call(lambda: plan._binder.bind(dict(pack))))
    bound = plan._prepare(pack, None)
    print("  launches only     %.1f us" % per_call(bound.run))
    for i, launcher in enumerate(bound.launchers):
        calls = bound.step_calls(i)
        print(f"  step {i}: {type(launcher).__name__}, {len(calls)} call(s)")
        print("    calls           %.1f us" % per_call(lambda calls=calls: [fn(*a) for fn, a in calls]))
    x = torch.empty(1, device="cuda")
    print("  torch x.add_(1)   %.1f us" % per_call(lambda: x.add_(1)))
