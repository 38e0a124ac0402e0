"""Check and time patch convolutions (stride = filter: a ViT's patch embedding, ConvNeXt's stem and
downsampling) on the GPU, in one call: cuDNN through torch against the generated conv_fprop's heuristic pick
and first candidates, and, for the ViT patch embedding with its float32 filter cast in the prologue (as a
bf16 training step has it), every conv_fprop candidate (the PROLOGUE_PASS variants and the fused ones) and
the library engine.

    PYTHONPATH=$PWD python scripts/patch_conv_check.py --out $OUT          # from the repo root, ~1 min

Every output is checked against float64 (relative L2 error printed; over 1e-2 fails the run), then timed as
a CUDA graph of 10 calls (bench.measure, median of 9 replays). Writes $OUT/patch_conv_check.txt.
Results: bench/results/2026-11-30-h200-vit-train-fold-views.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "scripts"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

CASES = [  # name, N, C, H, K, patch, layout
    ("vit.patch16", 64, 3, 224, 768, 16, "nchw"),
    ("vit.patch16.nhwc", 64, 3, 224, 768, 16, "nhwc"),
    ("convnext.stem4", 64, 3, 224, 96, 4, "nhwc"),
    ("convnext.down2", 64, 96, 56, 192, 2, "nhwc"),
]


def plans_of(g: Any, candidates: int) -> dict[str, Any]:
    """The heuristic's plan (engines=["triton"]) and its first conv_fprop candidates, compiled at once."""
    from hopper_gemm_check import config_plan

    from opgraph.engines.triton import TEMPLATE_BY_NAME, compiler

    plan = g.build(device="cuda", engines=["triton"], compile="lazy")
    cands = TEMPLATE_BY_NAME["conv_fprop"].candidates(plan.steps[0].piece, plan.device)[:candidates]
    plans = {"heur": plan} | {
        f"c{i}": config_plan(plan, {k: v for k, v in c.items() if k != "template"}, "conv_fprop")
        for i, c in enumerate(cands)
    }
    compiler.compile_all(
        {s.key: (s, f) for p in plans.values() for st in p.steps for s, f in st.kernel.compile_specs()}
    )
    return plans


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--candidates", type=int, default=6)
    args = ap.parse_args()
    import torch

    import opgraph as og
    from bench.measure import replay_us
    from tests.engines.test_prologue_pass import cast_filter_conv

    torch.backends.cudnn.benchmark = True
    DT = og.DataType
    lines: list[str] = []
    worst = 0.0

    def say(name: str, label: str, us: float, flop: float, err: float, what: str = "") -> None:
        nonlocal worst
        worst = max(worst, err)
        lines.append(f"{name:20s} {label:14s} {us:8.1f} us {flop / us / 1e6:6.0f} TFLOP/s err {err:.1e} {what}")
        print(lines[-1], flush=True)

    for name, n, c, h, k, p, layout in CASES:
        oh = h // p
        torch.manual_seed(0)
        x = torch.randn(n, c, h, h, device="cuda").bfloat16()
        w = (torch.randn(k, c, p, p, device="cuda") / (c * p * p) ** 0.5).bfloat16()
        if layout == "nhwc":
            x, w = (t.contiguous(memory_format=torch.channels_last) for t in (x, w))
        ref = torch.nn.functional.conv2d(x.double(), w.double(), stride=p).float()
        flop = 2 * n * oh * oh * k * c * p * p

        def err(y: Any, ref: Any = ref) -> float:
            return ((y.float() - ref).norm() / ref.norm()).item()

        y = torch.nn.functional.conv2d(x, w, stride=p)
        say(
            name,
            "torch (cuDNN)",
            replay_us(lambda x=x, w=w, p=p: torch.nn.functional.conv2d(x, w, stride=p)),
            flop,
            err(y),
        )
        g = og.Graph("patches", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
        xt = g.tensor(dim=list(x.shape), stride=list(x.stride()), name="x")
        wt = g.tensor(dim=list(w.shape), stride=list(w.stride()), name="w")
        yt = g.conv_fprop(xt, wt, padding=[0, 0], stride=[p, p]).set_output(True).set_data_type(DT.BFLOAT16)
        if layout == "nhwc":
            yt.set_stride([oh * oh * k, 1, oh * k, k])
        plans = plans_of(g, args.candidates)
        d = plans["heur"].graph.tensors[yt.uid]
        out = torch.empty_strided(d.dim, d.stride, dtype=torch.bfloat16, device="cuda")
        pack = {xt: x, wt: w, yt: out}
        for label, plan in plans.items():
            out.fill_(float("nan"))
            plan.execute(pack)
            torch.cuda.synchronize()
            e = err(out)
            say(
                name,
                f"opgraph {label}",
                replay_us(lambda plan=plan, pack=pack: plan.execute(pack)),
                flop,
                e,
                str(plan.steps[0].config)[7:140],
            )

    # the ViT patch embedding as a bf16 training step has it: the float32 filter cast in the prologue
    g = cast_filter_conv(n=64, hw=224, k=768, patch=16)
    plans = plans_of(g, 9) | {"library": g.build(device="cuda", engines=["library"]), "default": g.build(device="cuda")}
    final = plans["heur"].graph
    uid = {final.tensors[u].name: u for u in final.tensors}
    torch.manual_seed(0)
    x = torch.randn(64, 3, 224, 224, device="cuda").bfloat16()
    w = torch.randn(768, 3, 16, 16, device="cuda") / 28
    b = torch.randn(1, 768, 1, 1, device="cuda")
    ref = (torch.nn.functional.conv2d(x.double(), w.bfloat16().double(), stride=16) + b.double()).float()
    d = final.tensors[final.outputs[0]]
    out = torch.empty_strided(d.dim, d.stride, dtype=torch.bfloat16, device="cuda")
    pack = {uid["x"]: x, uid["w"]: w, uid["b"]: b, final.outputs[0]: out}
    for label, plan in plans.items():
        out.fill_(float("nan"))
        plan.execute(pack)
        torch.cuda.synchronize()
        e = ((out.float() - ref).norm() / ref.norm()).item()
        say(
            "vit.patch16.cast",
            label,
            replay_us(lambda plan=plan: plan.execute(pack)),
            2 * 12544 * 768 * 768,
            e,
            str(plan.steps[0].config)[:140],
        )
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "patch_conv_check.txt").write_text("\n".join(lines) + "\n")
    return 1 if worst > 1e-2 else 0


if __name__ == "__main__":
    sys.exit(main())
