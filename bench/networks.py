"""Whole torchvision networks (issue 7), inference: ResNet-50 at batch 1 and 64, MobileNetV2 at
batch 64, fp16 channels-last 224², random weights, imported with opgraph.from_torch, beside PyTorch
eager and torch.compile (times are ms per batch in the table's µs columns ×1000)."""

from __future__ import annotations

import torch

import opgraph as og

from .common import cl, run_compiled
from .harness import Session, relerr

CASES = [("resnet50", 64), ("mobilenet_v2", 64), ("resnet50", 1)]


def inference(s: Session, autotune: bool) -> None:
    import torchvision.models as tvm

    for name, batch in CASES:
        w = s.workload(f"{name} inference batch {batch}, fp16 channels-last 224²", "network")
        if batch == 1:
            print("   (batch 1 reuses the batch-64 kernels' templates but needs its own compiles)", flush=True)
        torch.manual_seed(0)
        model = getattr(tvm, name)(weights=None).cuda().half().eval().to(memory_format=torch.channels_last)
        x = cl(torch.randn(batch, 3, 224, 224, device="cuda", dtype=torch.float16))
        with torch.no_grad():
            want = model.float()(x.float())
            model.half()
        imported = og.from_torch(model, (x,))
        plan = imported.plan("cuda")
        pack = imported.variant_pack(x)
        out = imported.outputs[0]

        def check() -> float:
            plan.execute(pack)
            torch.cuda.synchronize()
            return relerr(pack[out.uid].reshape(want.shape), want)

        s.run(w, "opgraph", lambda: plan.execute(pack), check=check,
              note=f"[{len(plan.steps)} steps, {sum(st.config.engine == 'triton' for st in plan.steps)} triton]")
        with torch.no_grad():
            s.run(w, "torch eager", lambda: model(x), check=lambda: relerr(model(x), want))
            run_compiled(s, w, model, (x,))


WORKLOADS = {"networks": inference}
