"""Whole torchvision networks (issue 7), inference: ResNet-50 at batch 1 and 64, MobileNetV2 at
batch 64, fp16 channels-last 224², random weights with batchnorm statistics calibrated on random
images (so activations stay at unit scale through the depth, as in a trained network), imported with
opgraph.from_torch, beside PyTorch eager and torch.compile. Results are checked against the fp32
module: a whole fp16 network drifts by a few percent even in eager PyTorch, so the tolerance is
twice eager fp16's own error (at least the suite's 0.02, at most 0.1). The floor is the network's convolution
and matmul FLOPs (torch.utils.flop_counter) at the dense fp16 ceiling.

Training steps (ResNet-18 and MobileNetV2 at batch 64): cross-entropy, backward and SGD with momentum
on fp16 parameters, through `opgraph.training.classifier_step` (its execute plus the write-back of the
batchnorm running stats) beside the same step in eager PyTorch and under torch.compile. Dropout is off
(p=0) so that every implementation computes the same loss, and lr is 0 while timing so that every
step sees the same parameters (the arithmetic is that of any lr). The loss is checked against the fp32
module like the inference outputs; the floor is three times the forward FLOPs."""

from __future__ import annotations

import copy
import os
import time
from collections import Counter
import traceback
from typing import Any, Callable

import torch

import opgraph as og

from .common import cl, graphed, print_step_profile, run_compiled
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


TRAIN_CASES = [("resnet18", 64), ("mobilenet_v2", 64)]


def training(s: Session, autotune: bool) -> None:
    for name, batch in TRAIN_CASES:
        w = s.workload(f"{name} training step batch {batch}, fp16 channels-last 224², SGD momentum", "network")
        try:
            _training_case(s, w, name, batch)
        except Exception as e:  # noqa: BLE001 - a setup failure is reported, the suite goes on
            traceback.print_exc(limit=6)
            s.run(w, "opgraph", lambda e=e: (_ for _ in ()).throw(e))


def _training_case(s: Session, w: Any, name: str, batch: int) -> None:
    import torchvision.models as tvm
    from torch.nn import functional as F

    torch.manual_seed(0)
    model = getattr(tvm, name)(weights=None).cuda().to(memory_format=torch.channels_last).train()
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    x = cl(torch.randn(batch, 3, 224, 224, device="cuda", dtype=torch.float16))
    labels = torch.randint(0, 1000, (batch,), device="cuda")
    want = F.cross_entropy(copy.deepcopy(model)(x.float()), labels).detach()  # fp32, batch statistics
    w.floor_flops = 3 * network_flops(model, x.float())
    model.half()
    eager_model, compiled_model = copy.deepcopy(model), copy.deepcopy(model)

    def torch_step(net: torch.nn.Module, opt: torch.optim.Optimizer) -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(x), labels)
        loss.backward()
        opt.step()
        return loss

    eager_opt = torch.optim.SGD(eager_model.parameters(), lr=0.0, momentum=0.9)
    eager = s.run(w, "torch eager", lambda: torch_step(eager_model, eager_opt),
                  check=lambda: relerr(torch_step(eager_model, eager_opt).detach().float(), want))
    tolerance = min(0.1, max(s.tolerance, 2 * (eager.relerr or 0.0)))

    imported = og.from_torch(model, (x,))
    cs = og.training.classifier_step(imported)
    t0 = time.perf_counter()
    plan = cs.step.graph.build(device="cuda")
    print(f"   (opgraph: step graph built in {time.perf_counter() - t0:.1f} s)", flush=True)
    pack = cs.pack(x, torch.eye(1000, device="cuda", dtype=torch.float16)[labels], lr=0.0, momentum=0.9)
    loss_uid = cs.step.loss.uid

    def og_step() -> None:
        plan.execute(pack)
        cs.finish(pack)

    def loss_check(run: Callable[[], Any]) -> Callable[[], float]:
        def check() -> float:
            pack[loss_uid].fill_(float("nan"))
            run()
            torch.cuda.synchronize()
            return relerr(pack[loss_uid].reshape(()).float(), want)
        return check

    if os.environ.get("OPGRAPH_BENCH_STEPS"):
        print_step_profile(w.name, plan, pack)
    t0 = time.perf_counter()
    og_step()
    torch.cuda.synchronize()
    print(f"   (opgraph: first step, compiling its kernels, {time.perf_counter() - t0:.1f} s)", flush=True)
    engines = ", ".join(f"{n} {e}" for e, n in sorted(Counter(st.config.engine for st in plan.steps).items()))
    s.run(w, "opgraph", og_step, check=loss_check(og_step), tolerance=tolerance,
          note=f"[{len(plan.steps)} steps: {engines}; {len(cs.step.graph.final.nodes)} ops]")
    try:
        replay = graphed(og_step)
        s.run(w, "opgraph (CUDA graph)", replay, check=loss_check(replay), tolerance=tolerance)
    except Exception as e:  # noqa: BLE001 - a step that cannot be captured: say so, time the rest
        print(f"   opgraph (CUDA graph): not captured: {type(e).__name__}: {e}", flush=True)
    compiled_opt = torch.optim.SGD(compiled_model.parameters(), lr=0.0, momentum=0.9)
    run_compiled(s, w, lambda: torch_step(compiled_model, compiled_opt), (),
                 check=lambda: relerr(torch_step(compiled_model, compiled_opt).detach().float(), want),
                 tolerance=tolerance)


WORKLOADS = {"networks": inference, "training": training}
