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
    print("  fast bind         %.1f us" % per_call(lambda: plan._fast.bind(pack)))
    buffers = plan._bind(pack)
    base, views = plan._workspace(None, buffers)
    buffers.update(views)
    step = plan.steps[0]
    k = step.kernel
    from opgraph.memory import workspace as wsp

    scratch = wsp.scratch_view(base, plan.layout, 0)
    print("  kernel.run        %.1f us" % per_call(lambda: k.run(buffers, None, scratch)))
    for launch, launcher in zip(k.generated.launches, k.launchers):
        print(f"  launcher {launch.kernel}: direct={launcher.direct} compiled={len(launcher.compiled)}")
        args = [k._arg(a, buffers, scratch) for a in launch.args]
        print("    launcher call   %.1f us" % per_call(lambda: launcher(args, None)))
        if launcher.compiled:
            ck = next(iter(launcher.compiled.values()))
            h = torch.cuda.current_stream().cuda_stream
            tail = launcher.tail or []
            gx, gy, gz = launcher.grid
            print("    ck.run raw      %.1f us" % per_call(
                lambda: ck.run(gx, gy, gz, h, ck.function, ck.packed_metadata, None, None, None, *args, *tail)))
        print("    fn[grid]        %.1f us" % per_call(lambda: launcher.fn[launcher.grid](*args, **launcher.meta), 500))
    x = torch.empty(1, device="cuda")
    print("  torch x.add_(1)   %.1f us" % per_call(lambda: x.add_(1)))
