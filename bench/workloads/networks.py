"""Whole torchvision networks, inference, fp16 channels-last: ResNet-50 at batch 1, 64 and 256 and
MobileNetV2 at batch 64, imported with opgraph.from_torch. Random weights with batchnorm statistics
calibrated on random images (activations stay at unit scale through the depth, as in a trained
network). Checked against the float64 module; floor: a per-layer roofline. Peers: eager, eager
captured, torch.compile (max-autotune, freezing). torchvision's models where it imports, else the
replicas of tests/frontends/tv_models.py (same modules, same forward code)."""

from __future__ import annotations

import copy
import functools
from typing import Any

from ..case import Case, Ctx, Output
from ..core.floors import Floor, LayerRecord, roofline_layers
from ..core.registry import workload
from ..ours import graph_impls, imported_graph
from ..peers.torch_peers import compiled, eager

RESIDUAL_BLOCKS = ("BasicBlock", "Bottleneck")


def build(arch: str, num_classes: int = 1000) -> tuple[Any, str]:
    """(module with random weights, where it came from)."""
    try:
        import torchvision
        import torchvision.models as tvm

        return getattr(tvm, arch)(weights=None, num_classes=num_classes), f"torchvision {torchvision.__version__}"
    except Exception:  # noqa: BLE001 - absent or broken: the replica
        from tests.frontends.tv_models import REPLICAS

        return REPLICAS[arch](num_classes=num_classes), "replica (tests/frontends/tv_models.py)"


def calibrated(arch: str, device: str, num_classes: int = 1000, res: int = 224, batch: int = 32) -> tuple[Any, str]:
    """A float32 model in eval mode whose batchnorm running statistics are a batch of random images'."""
    import torch

    torch.manual_seed(0)
    model, source = build(arch, num_classes)
    model = model.to(device).to(memory_format=torch.channels_last)
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.reset_running_stats()
            m.momentum = None  # cumulative: one batch sets the statistics
    model.train()
    with torch.no_grad():
        model(torch.randn(batch, 3, res, res, device=device).to(memory_format=torch.channels_last))
    return model.eval(), source


def layer_records(model: Any, x: Any, elem: int = 2) -> list[LayerRecord]:
    """What each layer reads, writes and computes on input x (forward hooks), at `elem` bytes an element."""
    import math

    import torch
    from torch import nn

    names = {m: n for n, m in model.named_modules()}
    recs: list[LayerRecord] = []

    def hook(mod: Any, inp: Any, out: Any) -> None:
        i = inp[0] if inp else None
        if not isinstance(out, torch.Tensor) or not isinstance(i, torch.Tensor):
            return
        name = names.get(mod, type(mod).__name__)
        wbytes = sum(p.numel() for p in mod.parameters(recurse=False)) * elem
        if isinstance(mod, nn.Conv2d):
            flops = 2 * out.numel() * (mod.in_channels // mod.groups) * math.prod(mod.kernel_size)
            recs.append(LayerRecord("gemm", name, flops, i.numel() * elem, out.numel() * elem, wbytes, i is x))
        elif isinstance(mod, nn.Linear):
            recs.append(
                LayerRecord(
                    "gemm",
                    name,
                    2 * out.numel() * mod.in_features,
                    i.numel() * elem,
                    out.numel() * elem,
                    wbytes,
                    i is x,
                )
            )
        elif isinstance(mod, (nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d)):
            recs.append(LayerRecord("pool", name, 0.0, i.numel() * elem, out.numel() * elem))
        elif isinstance(mod, nn.modules.batchnorm._BatchNorm):
            recs.append(LayerRecord("norm", name, 0.0, i.numel() * elem, out.numel() * elem, wbytes))
        elif type(mod).__name__ in RESIDUAL_BLOCKS or getattr(mod, "use_res_connect", False):
            recs.append(LayerRecord("add", name, 0.0, out.numel() * elem))

    handles = [m.register_forward_hook(hook) for m in model.modules()]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in handles:
            h.remove()
    return recs


def network_case(ctx: Ctx, arch: str, batch: int) -> Case:
    import torch

    res, nb, classes = ctx.pick((224, batch, 1000), (224, min(batch, 8), 1000), (32, 2, 10))
    model, source = calibrated(arch, ctx.device, classes, res, batch=ctx.pick(32, 16, 4))
    x32 = torch.randn(nb, 3, res, res, device=ctx.device).to(memory_format=torch.channels_last)
    layers = roofline_layers(layer_records(model, x32))
    model16 = model.half()
    x = x32.half()
    with torch.no_grad():  # float64, from the same fp16 weights and input the implementations get
        want = copy.deepcopy(model16).double()(x.double())
    impls = graph_impls(ctx, imported_graph(model16, (x,)), tune=ctx.tune and ctx.tune_networks)
    if ctx.scale == "tiny":  # generated kernels of a whole network under Triton's interpreter: too slow for a dry run
        impls = [i for i in impls if not i.name.startswith("generated")]
    impls += [eager(model16, (x,))]
    impls += compiled(model16, (x,), inference=True, freezing=True, cudagraphs=ctx.compile_cudagraphs)
    notes = (
        f"model: {source}; fp16 weights and activations; tuned opgraph plans "
        f"{'included' if ctx.tune_networks else 'not built (--tune-networks)'}"
    )
    return Case([Output("logits", "float16")], lambda: [want], impls, Floor(layers=layers), notes=notes)


# one group per network: a network's builds and compiles take minutes; 3 repeats of one fit a command
CASES = (("resnet50", 64, 2.0), ("resnet50", 256, 2.5), ("resnet50", 1, 1.5), ("mobilenet_v2", 64, 2.0))
for _arch, _b, _min in CASES:
    workload(
        f"networks.{_arch}.b{_b}",
        group=f"networks-{_arch}-b{_b}",
        kind="network",
        quick=(_arch, _b) == ("resnet50", 1),
        minutes=_min,
        title=f"{_arch} inference batch {_b}, fp16 channels-last 224²",
    )(functools.partial(network_case, arch=_arch, batch=_b))
