"""Cost-model breakdown of the GPT-2 training step's plan, on the CPU (no GPU needed): an estimate, not
a measurement.

    python -m bench.plan_cost [--layers 12] [--batch 8] [--json out.json]

Builds bench/gpt.py's GPT at the benchmark's widths, its train_step graph (cross-entropy, AdamW, bf16
mixed precision) and plans it for an H100 as `TrainStep.build("cuda")` would with the default engines
but cuDNN's (its support checks need the library on a GPU): each engine's `available()` is made to
succeed, the planner runs in heuristic mode with compile="lazy" (nothing is compiled). For every step:
its engine/template, ops, bytes (each piece input read once, each output written once: cost.py's
piece_bytes) and GEMM/attention FLOPs (cost.py's piece_flops), summed per category with a roofline
time at 3.0 TB/s / 700 TFLOP/s (cost.py's H100 rates); GEMMs also with the SM waves of their chosen
tiles (tiles / (132 x waves)). `--steps-profile` of bench.gpt measures what this estimates.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections import OrderedDict
from typing import Any

BW, PEAK, SMS = 3.0e12, 7.0e14, 132


def plan_rows(layers: int, batch: int) -> tuple[list[dict[str, Any]], int]:
    """The plan's steps as rows (and the graph's op count)."""
    os.environ.pop("TRITON_INTERPRET", None)  # the triton engine declines CUDA under the interpreter
    import torch

    import opgraph as og
    from opgraph.build.planner import plan_steps
    from opgraph.core.config import Support
    from opgraph.core.device import Device
    from opgraph.engines import get_engine
    from opgraph.engines.cost import piece_flops
    from opgraph.engines.triton.templates.matmul import TEMPLATE as MATMUL

    from .gpt import GPT, GPTConfig

    c = GPTConfig(layers=layers)
    torch.manual_seed(0)
    model = GPT(c).train()
    idx = torch.randint(0, c.vocab, (batch, c.seq))
    step = og.training.train_step(
        og.from_torch(model, (idx,)), "cross_entropy", og.training.AdamW(3e-4), mixed_precision="bf16"
    )
    final = step.graph.final
    h100 = Device("cuda", 0, "NVIDIA H100 80GB HBM3", (9, 0), 132)
    engines = ["triton", "library", "torch"]
    saved = {name: type(get_engine(name)).available for name in engines}
    try:
        for name in engines:  # no GPU here: the engines' own checks of the piece still run
            type(get_engine(name)).available = lambda self, device: Support.yes()  # type: ignore[method-assign]
        t0 = time.perf_counter()
        sched = plan_steps(final, device=h100, engines=engines, compile="lazy")
        planned_s = time.perf_counter() - t0
    finally:
        for name, available in saved.items():
            type(get_engine(name)).available = available  # type: ignore[method-assign]
    rows = []
    for s in sched.steps:
        p = s.piece
        gemm = None
        if s.config.knob("template") == "matmul":
            match = MATMUL.match_class(MATMUL, MATMUL.analyze(p)[0], h100)  # (the template matched the piece)
            m, n, k, _ = match.problem
            gemm = {"m": m, "n": n, "k": k, "nbatch": match.gp.space.nbatch}
        big = [
            (p.tensor(u).label(), list(p.tensor(u).dim), p.tensor(u).data_type.name, "in" if u in p.inputs else "out")
            for u in (*p.inputs, *p.outputs)
            if not p.tensor(u).is_pass_by_value and p.tensor(u).nbytes > 1e6
        ]
        rows.append(
            {
                "i": s.index,
                "engine": s.config.engine,
                "template": s.config.knob("template"),
                "knobs": {k: str(v) for k, v in s.config.knobs},
                "names": [n.name for n in p.nodes],
                "bytes": sum(p.tensor(u).nbytes for u in (*p.inputs, *p.outputs) if not p.tensor(u).is_pass_by_value),
                "flops": piece_flops(p),
                "estimate_us": s.config.estimate_us,
                "gemm": gemm,
                "tensors": big,
            }
        )
    print(
        f"planned in {planned_s:.2f} s on this host (partition, configs, generated modules loaded; nothing compiled)",
        file=sys.stderr,
    )
    return rows, len(final.nodes)


def category(r: dict[str, Any], vocab: int = 50304) -> str:
    names, t = r["names"], r["template"]
    if t in ("attention", "attention_bwd"):
        return "attention " + ("bwd" if t == "attention_bwd" else "fwd")
    if t == "matmul":
        g = r["gemm"]
        return "GEMM lm_head (triton)" if vocab in (g["m"], g["n"], g["k"]) else "GEMM blocks (triton)"
    if r["engine"] == "library":
        return "GEMM (library/cuBLAS)"
    if t == "rownorm":
        return "layernorm " + ("bwd" if names[0].startswith("d") else "fwd")
    if any(n.startswith("ce.") for n in names):
        return "loss (cross-entropy)"
    if all(n.startswith(("adamw", "grad.add")) for n in names):
        return "optimizer: wte/lm_head, wpe" if r["bytes"] > 1e6 else "optimizer: tiny (biases, LN, scalars)"
    if any("embedding" in n for n in names):
        return "embedding fwd/bwd"
    if r["engine"] == "torch":
        return "layout copies (torch engine)"
    if all("to_bf16" in n or ".view" in n for n in names):
        return "weight casts fp32->bf16"
    return "bias grads + residual-grad adds/casts"


def waves_us(r: dict[str, Any]) -> float:
    """A GEMM step's math time with its tiles' SM waves: flops / peak / occupancy of the last wave."""
    g, k = r["gemm"], r["knobs"]
    programs = -(-g["m"] // int(k["BLOCK_M"])) * -(-g["n"] // int(k["BLOCK_N"])) * g["nbatch"] * int(k["SPLIT_K"])
    occupancy = programs / (math.ceil(programs / SMS) * SMS)
    return max(r["flops"] / PEAK / occupancy, r["bytes"] / BW) * 1e6


def table(rows: list[dict[str, Any]]) -> OrderedDict[str, dict[str, Any]]:
    out: OrderedDict[str, dict[str, Any]] = OrderedDict()
    for r in rows:
        a = out.setdefault(category(r), {"steps": 0, "bytes": 0, "flops": 0, "roofline_us": 0.0, "waves_us": 0.0})
        a["steps"] += 1
        a["bytes"] += r["bytes"]
        a["flops"] += r["flops"]
        roof = max(r["bytes"] / BW, r["flops"] / PEAK) * 1e6
        a["roofline_us"] += roof
        a["waves_us"] += waves_us(r) if r["gemm"] else roof
    return OrderedDict(sorted(out.items(), key=lambda kv: -kv[1]["waves_us"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--steps", action="store_true", help="print every step")
    args = ap.parse_args()
    rows, ops = plan_rows(args.layers, args.batch)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=0)
    if args.steps:
        for r in rows:
            print(
                r["i"],
                r["engine"],
                r["template"],
                f"{r['bytes'] / 1e6:.1f} MB",
                f"{r['flops'] / 1e9:.0f} GF",
                ", ".join(r["names"])[:160],
            )
    print(
        f"{ops} ops, {len(rows)} steps (cost-model estimate, H100 rates {BW / 1e12:.1f} TB/s, {PEAK / 1e12:.0f} TFLOP/s)"
    )
    print("| category | steps | GB moved | TFLOP | roofline ms | with GEMM waves ms |")
    print("|---|---|---|---|---|---|")
    tot = {"steps": 0, "bytes": 0, "flops": 0, "roofline_us": 0.0, "waves_us": 0.0}
    for name, a in table(rows).items():
        print(
            f"| {name} | {a['steps']} | {a['bytes'] / 1e9:.2f} | {a['flops'] / 1e12:.2f} | "
            f"{a['roofline_us'] / 1e3:.2f} | {a['waves_us'] / 1e3:.2f} |"
        )
        for key in tot:
            tot[key] += a[key]
    print(
        f"| total | {tot['steps']} | {tot['bytes'] / 1e9:.2f} | {tot['flops'] / 1e12:.2f} | "
        f"{tot['roofline_us'] / 1e3:.2f} | {tot['waves_us'] / 1e3:.2f} |"
    )


if __name__ == "__main__":
    main()
