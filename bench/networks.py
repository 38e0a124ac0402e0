"""Whole torchvision networks (issue 7), inference: ResNet-50 at batch 1 and 64, MobileNetV2 at
batch 64, fp16 channels-last 224², random weights with batchnorm statistics calibrated on random
images (so activations stay at unit scale through the depth, as in a trained network), imported with
opgraph.from_torch, beside PyTorch eager and torch.compile. Results are checked against the fp32
module: a whole fp16 network drifts by a few percent even in eager PyTorch, so the tolerance is
twice eager fp16's own error (at least the suite's 0.02, at most 0.1). The floor is the network's convolution
and matmul FLOPs (torch.utils.flop_counter) at the dense fp16 ceiling."""

from __future__ import annotations

from typing import Any, Callable

import torch

import opgraph as og

from .common import cl, graphed, run_compiled
from .harness import Session, relerr

CASES = [("resnet50", 64), ("mobilenet_v2", 64), ("resnet50", 1)]


def calibrated(name: str) -> torch.nn.Module:
    """A torchvision model with random weights whose batchnorm running statistics are those of a
    batch of random images: untrained statistics (mean 0, variance 1) let activations grow or vanish
    with depth until fp16 over- or underflows."""
    import torchvision.models as tvm

    torch.manual_seed(0)
    model = getattr(tvm, name)(weights=None).cuda().to(memory_format=torch.channels_last)
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.reset_running_stats()
            m.momentum = None  # a cumulative average: one batch sets the statistics
    model.train()
    with torch.no_grad():
        model(cl(torch.randn(32, 3, 224, 224, device="cuda")))
    return model.eval()


def network_flops(model: torch.nn.Module, x: torch.Tensor) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(x)
    return float(counter.get_total_flops())


def inference(s: Session, autotune: bool) -> None:
    for name, batch in CASES:
        model = calibrated(name)
        x = cl(torch.randn(batch, 3, 224, 224, device="cuda", dtype=torch.float16))
        with torch.no_grad():
            want = model(x.float())
        w = s.workload(f"{name} inference batch {batch}, fp16 channels-last 224²", "network",
                       flops=network_flops(model, x.float()))
        if batch == 1:
            print("   (batch 1 reuses the batch-64 kernels' templates but needs its own compiles)", flush=True)
        model.half()
        imported = og.from_torch(model, (x,))
        plan = imported.plan("cuda")
        pack = imported.variant_pack(x)
        out = imported.outputs[0]

        def checked(run: Callable[[], Any]) -> Callable[[], float]:
            def check() -> float:
                pack[out.uid].fill_(float("nan"))
                run()
                torch.cuda.synchronize()
                return relerr(pack[out.uid].reshape(want.shape), want)
            return check

        with torch.no_grad():
            eager = s.run(w, "torch eager", lambda: model(x), check=lambda: relerr(model(x), want))
        tolerance = min(0.1, max(s.tolerance, 2 * (eager.relerr or 0.0)))  # capped: an eager overflow passes nothing
        direct = lambda: plan.execute(pack)  # noqa: E731
        s.run(w, "opgraph", direct, check=checked(direct), tolerance=tolerance,
              note=f"[{len(plan.steps)} steps, {sum(st.config.engine == 'triton' for st in plan.steps)} triton]")
        try:
            replay = graphed(direct)
            s.run(w, "opgraph (CUDA graph)", replay, check=checked(replay), tolerance=tolerance)
        except Exception as e:  # a plan with a host step cannot be captured: say so, time the rest
            print(f"   opgraph (CUDA graph): not captured: {type(e).__name__}: {e}", flush=True)
        with torch.no_grad():
            run_compiled(s, w, model, (x,))


WORKLOADS = {"networks": inference}
