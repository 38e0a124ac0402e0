"""ConvNeXt-T inference (batch 64, bf16 channels-last) through torch.compile(backend="opgraph"), default and
reduce-overhead, beside eager and Inductor's default mode (issue 43): µs per call (30 calls back to back,
host included), outputs checked against eager; the backend's reports (partitions, fallbacks).

    PYTHONPATH=$PWD python scripts/backend_convnext_check.py        # from the repo root, ~1 min

Writes $OUT/backend_convnext_check.txt. Results: bench/results/2026-11-30-h200-vit-train-fold-views.md."""

import os
import sys
import time

import timm
import torch

sys.path.insert(0, ".")
import opgraph as og
from opgraph.frontends.dynamo_backend import clear_reports, reports


def main() -> None:
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    m = (
        timm.create_model("convnext_tiny", pretrained=False)
        .cuda()
        .eval()
        .to(memory_format=torch.channels_last)
        .to(torch.bfloat16)
    )
    x = torch.randn(64, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last).to(torch.bfloat16)
    out = []

    def say(s):
        out.append(s)
        print(s, flush=True)

    with torch.no_grad():
        ref = m(x).float()

        def per_call(fn, n=30):
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(n):
                y = fn()
            torch.cuda.synchronize()
            return (time.perf_counter() - t) / n * 1e6, y

        us, y = per_call(lambda: m(x))
        say(f"eager                      {us:8.1f} us/call")
        for name, kw in (
            ("opgraph backend", {}),
            ("opgraph backend reduce-overhead", {"mode": "reduce-overhead"}),
            ("inductor default", {"backend": "inductor"}),
        ):
            torch._dynamo.reset()
            clear_reports()
            t0 = time.perf_counter()
            c = torch.compile(m, **({"backend": og.torch_backend} | kw))
            y = c(x)
            torch.cuda.synchronize()
            setup = time.perf_counter() - t0
            us, y = per_call(lambda c=c: c(x))
            err = ((y.float() - ref).norm() / ref.norm()).item()
            say(f"{name:26s} {us:8.1f} us/call  setup {setup:6.1f} s  err vs eager {err:.1e}")
            for r in reports():
                say("   " + r.summary().splitlines()[0])
    open(os.path.join(os.environ.get("OUT", "/tmp"), "backend_convnext_check.txt"), "w").write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
