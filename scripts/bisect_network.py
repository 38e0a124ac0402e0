"""Find where an imported network's fp16 result drifts: run each top-level child (and the children of
the worst one) through opgraph.from_torch on its real input, and compare opgraph and PyTorch eager fp16
with the fp32 module. Usage (on a GPU): python scripts/bisect_network.py resnet50 1"""

from __future__ import annotations

import sys

import torch

import opgraph as og
from bench.check import relerr
from bench.workloads.networks import calibrated


def inputs_of(model: torch.nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """The fp32 input each direct child of `model` sees on `x` (children called in order)."""
    seen: dict[str, torch.Tensor] = {}
    hooks = [
        child.register_forward_pre_hook(lambda m, a, name=name: seen.setdefault(name, a[0].detach()))
        for name, child in model.named_children()
    ]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return seen


def compare(name: str, module: torch.nn.Module, x: torch.Tensor, engines: list[str] | None = None) -> float:
    with torch.no_grad():
        want = module.float()(x.float())
        eager = module.half()(x.half())
    imported = og.from_torch(module, (x.half(),))
    got = imported.run(x.half(), engines=engines)
    err, base = relerr(got, want), relerr(eager, want)
    again = relerr(imported.run(x.half(), engines=engines), want)  # a second run: races show as a change
    flag = "  <-- drifts" if max(err, again) > 4 * base + 1e-3 else ""
    flag += "  <-- not deterministic" if again != err else ""
    print(f"{name:40s} opgraph {err:.2e} then {again:.2e}   eager fp16 {base:.2e}{flag}", flush=True)
    if flag and engines is None and len(imported.plan("cuda").steps) <= 8:
        print(imported.plan("cuda").describe(), flush=True)
    module.float()
    return err / max(base, 1e-4)


def main() -> None:
    name, batch = sys.argv[1], int(sys.argv[2])
    model, _ = calibrated(name, "cuda")
    x = torch.randn(batch, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    compare(f"{name} whole, torch engine", model, x, engines=["torch"])
    compare(f"{name} whole", model, x)
    feeds = inputs_of(model, x)
    worst, ratio = None, 0.0
    for child_name, child in model.named_children():
        if child_name in feeds and any(True for _ in child.parameters()):
            r = compare(child_name, child, feeds[child_name])
            if r > ratio:
                worst, ratio = child_name, r
    if worst is not None:
        child = getattr(model, worst)
        for sub_name, sub_x in inputs_of(child, feeds[worst]).items():
            compare(f"{worst}.{sub_name}", getattr(child, sub_name), sub_x)


if __name__ == "__main__":
    main()
