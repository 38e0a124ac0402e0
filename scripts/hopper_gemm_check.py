"""Check and time opgraph's generated GEMMs on the Hopper path (issue 39) against cuBLAS, in one GPU call.

    PYTHONPATH=$PWD python scripts/hopper_gemm_check.py --out $OUT            # from the repo root, ~2-3 min

For each matmul shape of the Hopper lab's table (bench/results/2026-11-29-h200-hopper-lab-gemm.md: 8192^3,
the Llama (d 1024, 8192 tokens) and GPT-2 (d 2048) projections, matmul + bias + GELU), B an nn.Linear
weight ([N, K], K contiguous), it builds opgraph plans with engines=["triton"]:

  new     the heuristic's choice (on sm_90: TMA_HOST=1, host-side descriptors, persistent, flattened)
  before  the first device-side TMA config of the same candidates (what the heuristic chose before
          TMA_HOST: tl.make_tensor_descriptor in the kernel)
  same-dev  (--ablate) the `new` knobs without TMA_HOST: the descriptors' side alone

compiles every kernel at once (in parallel), checks every output against torch in fp32 (the output
poisoned with NaN first; relative L2 and max errors within the output type's rounding), then times each
plan's execute and cuBLAS (torch.matmul / addmm / _addmm_activation with out=) as a CUDA graph of K calls
(bench.measure: replays timed with CUDA events behind a spin kernel, no host time), median of --rounds.
Prints a markdown table; writes $OUT/hopper_gemm_check.{json,md} after every row (a kill keeps what ran).
Exit status 1 when an output check fails. --budget (s) stops starting rows; --only NAME,... picks rows;
--ws adds the warp-specialized Gluon kernel (WS=1, templates/_matmul_ws.py) where the row allows it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# name, M, N, K, epilogue ("" | "bias" | "bias_gelu"), dtype
SHAPES = [
    ("square8k.fp16", 8192, 8192, 8192, "", "fp16"),
    ("square8k.bf16", 8192, 8192, 8192, "", "bf16"),
    ("llama.lm_head", 8192, 32000, 1024, "", "bf16"),
    ("llama.qkv", 8192, 1536, 1024, "", "bf16"),
    ("llama.o", 8192, 1024, 1024, "", "bf16"),
    ("llama.up", 8192, 2816, 1024, "", "bf16"),
    ("llama.gate_up", 8192, 5632, 1024, "", "bf16"),
    ("llama.down", 8192, 1024, 2816, "", "bf16"),
    ("gpt2.qkv", 8192, 6144, 2048, "", "bf16"),
    ("gpt2.o", 8192, 2048, 2048, "", "bf16"),
    ("gpt2.mlp_up", 8192, 8192, 2048, "", "bf16"),
    ("gpt2.mlp_down", 8192, 2048, 8192, "", "bf16"),
    ("gelu.8192x4096x4096", 8192, 4096, 4096, "bias_gelu", "bf16"),
    ("gelu.gpt2.mlp_up", 8192, 8192, 2048, "bias_gelu", "bf16"),
    ("bias.gpt2.qkv", 8192, 6144, 2048, "bias", "bf16"),
    # BERT-base's projections (32 x 512 tokens), whose generated GEMMs ran at 0.69x cuBLAS in the model
    # (bench/results/2026-11-29-h200-zoo-bert-infer.md); the up-projection's exact (erf) GELU epilogue at
    # ~375 TFLOP/s: its math (~13 fp32 instructions an element, in the PTX) is not overlapped
    ("bert.up_gelu_erf", 16384, 3072, 768, "bias_gelu_erf", "bf16"),
    ("bert.up", 16384, 3072, 768, "bias", "bf16"),
    ("bert.qkv", 16384, 768, 768, "bias", "bf16"),
    ("bert.down", 16384, 768, 3072, "bias", "bf16"),
    # the Llama zoo model's fused steps (bench/results/2026-11-29-h200-zoo-llama-infer.md): the up-projection
    # times SiLU(gate) (an [M, N] operand in the epilogue, 107 µs a step in the model) and the output
    # projection plus the residual
    ("llama.up_mul", 8192, 2816, 1024, "mul", "bf16"),
    ("llama.o_residual", 8192, 1024, 1024, "residual", "bf16"),
    # the same projections as the model's plan fuses them: the residual add and the next RMSNorm's mean of
    # squares (a row reduction: partials per column tile and a combine launch), the down projection too
    ("llama.o_residual_stats", 8192, 1024, 1024, "residual_stats", "bf16"),
    ("llama.down_residual_stats", 8192, 1024, 2816, "residual_stats", "bf16"),
    # timm ConvNeXt-T's MLPs at batch 64 (bench/results/2026-11-30-h200-zoo-convnext-infer-1c7190b.md): the
    # up-projections with the erf GELU (stage 1: 278 µs a step in the model, K 96) and the down-projections
    ("convnext.s1.up_gelu_erf", 200704, 384, 96, "bias_gelu_erf", "bf16"),
    ("convnext.s1.down", 200704, 96, 384, "bias", "bf16"),
    ("convnext.s2.up_gelu_erf", 50176, 768, 192, "bias_gelu_erf", "bf16"),
    ("convnext.s3.up_gelu_erf", 12544, 1536, 384, "bias_gelu_erf", "bf16"),
    ("convnext.s4.up_gelu_erf", 3136, 3072, 768, "bias_gelu_erf", "bf16"),
    # timm ViT-B/16's forward projections at batch 64 (197 tokens)
    ("vit.qkv", 12608, 2304, 768, "bias", "bf16"),
    ("vit.up_gelu_erf", 12608, 3072, 768, "bias_gelu_erf", "bf16"),
    ("vit.down", 12608, 768, 3072, "bias", "bf16"),
    # its training step's fc1 data gradient (bench/results/2026-11-30-h200-zoo-vit-train-036310b-no-compile.md:
    # 342 µs a step, 12 a step): dY @ W2 times the erf GELU's derivative at the saved pre-activation (an
    # [M, N] operand), with and without the bias gradient (the column sums) in the same kernel
    ("vit.fc1_dgrad_gelu_bwd_sum", 12608, 3072, 768, "gelu_bwd_sum", "bf16"),
    ("vit.fc1_dgrad_gelu_bwd", 12608, 3072, 768, "gelu_bwd", "bf16"),
    ("small.512", 512, 512, 512, "", "bf16"),  # small products: the heuristic picks the path here too
    ("decode.m16", 16, 4096, 4096, "", "bf16"),
]
# relative L2 and max error (of max |ref|) an output may have: its type's rounding, with room
TOL = {"bf16": (6e-3, 1.6e-2), "fp16": (1.5e-3, 4e-3)}


def graph_of(name: str, m: int, n: int, k: int, epi: str, dt: str) -> tuple[Any, dict[str, Any]]:
    import opgraph as og

    DT = og.DataType
    io = DT.BFLOAT16 if dt == "bf16" else DT.HALF
    g = og.Graph(name.replace(".", "_"), io_data_type=io, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    a = g.tensor(dim=[m, k], name="a")
    b = g.tensor(dim=[k, n], stride=[1, k], name="w_t")  # an nn.Linear weight [N, K], transposed in place
    y = g.matmul(a, b, name="mm")
    t = {"a": a, "b": b}
    if epi in ("mul", "residual", "residual_stats") or epi.startswith("gelu_bwd"):
        # an [M, N] operand: SwiGLU's other half, the residual stream, or GELU's saved input
        other = g.tensor(dim=[m, n], name="other")
        t["other"] = other
        if epi == "mul":
            y = g.mul(y, other)
        else:
            y = g.add(y, other) if epi.startswith("residual") else g.gelu_backward(y, other)
        if epi == "gelu_bwd_sum":  # the bias gradient: y's column sums, a second output (float32)
            t["sum"] = g.reduction(y, "ADD").set_dim([1, n]).set_output(True)
        if epi == "residual_stats":  # RMSNorm's mean of squares of the rounded sum, a second output (float32)
            y.set_data_type(io)
            t["sum"] = g.reduction(g.mul(y, y), "AVG").set_dim([m, 1]).set_output(True)
    elif epi:
        bias = g.tensor(dim=[1, n], name="bias")
        t["bias"] = bias
        y = g.add(y, bias)
        if epi == "bias_gelu":
            y = g.gelu_approx_tanh(y)
        if epi == "bias_gelu_erf":
            y = g.gelu(y)
    y.set_output(True).set_data_type(io)
    t["y"] = y
    return g, t


def config_plan(plan: Any, knobs: dict[str, Any], template: str = "matmul") -> Any:
    """`plan` (one step) compiled with `template`'s `knobs` instead."""
    from opgraph.build.planner import Step
    from opgraph.engines import EngineConfig, get_engine
    from opgraph.runtime.plan import ExecutionPlan

    (step,) = plan.steps
    config = EngineConfig("triton", (("template", template), *sorted(knobs.items())))
    kernel = get_engine("triton").compile(step.piece, config, plan.device)
    return ExecutionPlan(plan.graph, plan.device, (Step(0, step.piece, config, kernel),), plan.cuts)


def knobs_text(plan: Any) -> str:
    k = dict(plan.steps[0].config.knobs)
    k.pop("template", None)
    short = {"BLOCK_M": "", "BLOCK_N": "x", "BLOCK_K": "x", "num_warps": " w", "num_stages": " s"}
    head = "".join(f"{p}{k.pop(n)}" for n, p in short.items() if n in k)
    flags = [f"{n}={v}" for n, v in sorted(k.items()) if n not in ("GROUP_M", "SPLIT_K") and v]
    return " ".join([head, *flags])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--budget", type=float, default=200.0, help="seconds; no row starts after it")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--only", default="", help="comma-separated row names")
    ap.add_argument("--ablate", action="store_true", help="also the new knobs with device-side descriptors")
    ap.add_argument(
        "--occupancy",
        action="store_true",
        help="also the Hopper path with two programs a multiprocessor (_matmul_hopper.occupancy_config: one's "
        "epilogue beside the other's main loop)",
    )
    ap.add_argument(
        "--ws",
        action="store_true",
        help="also the warp-specialized Gluon kernel (_matmul_ws.ws_config of the first Hopper-path candidate) on "
        "every row it runs (a row it refuses shows '-')",
    )
    ap.add_argument("--candidates", type=int, default=0, help="also the template's first N candidates (c0, c1, ...)")
    args = ap.parse_args()
    t0 = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    import torch
    import triton

    from opgraph.engines.triton import TEMPLATE_BY_NAME, compiler
    from opgraph.engines.triton.knobs import TileKnobs
    from opgraph.engines.triton.templates._matmul_hopper import occupancy_config
    from opgraph.engines.triton.templates._matmul_ws import ws_config, ws_refusal

    dev = torch.cuda.get_device_properties(0)
    header = {
        "device": dev.name,
        "capability": list(torch.cuda.get_device_capability()),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    rows = [s for s in SHAPES if not args.only or s[0] in args.only.split(",")]
    variants = ["new", "before"] + (["same-dev"] if args.ablate else []) + (["occ2"] if args.occupancy else [])
    variants += ["ws"] if args.ws else []
    variants += [f"c{i}" for i in range(args.candidates)]

    # -- build every plan (nothing compiled yet), then compile all kernels in parallel ----------------------
    built: dict[str, dict[str, Any]] = {}
    for name, m, n, k, epi, dt in rows:
        g, t = graph_of(name, m, n, k, epi, dt)
        plan = g.build(device="cuda", engines=["triton"], allow_partition=False, compile="lazy")
        assert len(plan.steps) == 1, plan.describe()
        chosen = dict(plan.steps[0].config.knobs)
        chosen.pop("template", None)
        cands = TEMPLATE_BY_NAME["matmul"].candidates(plan.steps[0].piece, plan.device)
        before = next((c for c in cands if c.get("TMA") and not c.get("TMA_HOST")), cands[0])
        plans = {"new": plan, "before": config_plan(plan, before)}
        if args.ablate:
            plans["same-dev"] = config_plan(plan, {kk: v for kk, v in chosen.items() if kk != "TMA_HOST"})
        if args.occupancy:  # the template's tuning candidate for math-heavy epilogues, on every row
            occ = occupancy_config(TileKnobs.parse(chosen, "matmul"), plan.device)
            plans["occ2"] = config_plan(plan, dict(occ.pairs()))
        if args.ws:  # (where the piece allows it: a row it refuses has no "ws" plan)
            host = next((c for c in cands if c.get("TMA_HOST")), None)
            m = TEMPLATE_BY_NAME["matmul"].matched(plan.steps[0].piece, plan.device)
            if host is not None and ws_refusal(m) is None:
                knobs = {kk: v for kk, v in host.items() if kk != "template"}
                ws = ws_config(m, TileKnobs.parse(knobs, "matmul"), plan.device)
                plans["ws"] = config_plan(plan, dict(ws.pairs()))
        for i, c in enumerate(cands[: args.candidates]):
            plans[f"c{i}"] = config_plan(plan, {kk: v for kk, v in c.items() if kk != "template"})
        built[name] = {"graph": g, "tensors": t, "plans": plans}
    specs = {
        spec.key: (spec, fn)
        for b in built.values()
        for p in b["plans"].values()
        for s in p.steps
        for spec, fn in s.kernel.compile_specs()
    }
    report = compiler.compile_all(specs)
    print(
        f"compiled {len(specs)} kernels in {time.time() - t0:.0f} s ({report.compiled} compiled, "
        f"failed: {len(report.failed)})",
        flush=True,
    )
    for key, why in report.failed.items():
        print(f"  compile failed {key}: {why[:300]}", flush=True)

    results: list[dict[str, Any]] = []
    failed = False

    def write() -> None:
        (out / "hopper_gemm_check.json").write_text(json.dumps({**header, "rows": results}, indent=1))
        (out / "hopper_gemm_check.md").write_text(markdown(header, results, variants))

    for spec in rows:
        if time.time() - t0 > args.budget:
            results.append({"name": spec[0], "skipped": "budget"})
            continue
        row = measure_row(spec, built[spec[0]], variants, args.rounds)
        failed |= not all(row[v].get("ok", False) for v in variants)
        results.append(row)
        line = f"{spec[0]}: cuBLAS {row['cublas'].get('tflops', 0):.0f}"
        for v in variants:
            e = row[v]
            line += f" | {v} {e.get('tflops', 0):.0f} ({'ok' if e.get('ok') else 'FAIL'}) {e['knobs']}"
        print(line, flush=True)
        write()
        torch.cuda.empty_cache()
    header["seconds"] = round(time.time() - t0, 1)
    write()
    print(markdown(header, results, variants))
    return 1 if failed else 0


def measure_row(spec: tuple[Any, ...], b: dict[str, Any], variants: list[str], rounds: int) -> dict[str, Any]:
    """One shape: inputs, the fp32 reference, each variant's check and time, then cuBLAS's."""
    import torch

    from bench.measure import capture, events_us

    name, m, n, k, epi, dt = spec
    t = b["tensors"]
    torch.manual_seed(0)
    tdt = torch.bfloat16 if dt == "bf16" else torch.float16
    a = torch.randn(m, k, device="cuda", dtype=tdt)
    w = (torch.randn(n, k, device="cuda", dtype=torch.float32) / math.sqrt(k)).to(tdt)
    wt = w.t()
    bias = torch.randn(n, device="cuda", dtype=tdt) if epi.startswith("bias") else None
    other = (
        torch.randn(m, n, device="cuda", dtype=tdt)
        if epi in ("mul", "residual", "residual_stats") or "gelu_bwd" in epi
        else None
    )
    ref = reference(epi, a, w, bias, other)
    y = torch.empty(m, n, device="cuda", dtype=tdt)
    pack = {t["a"]: a, t["b"]: wt, t["y"]: y}
    if bias is not None:
        pack[t["bias"]] = bias.view(1, n)
    if other is not None:
        pack[t["other"]] = other
    rows = epi == "residual_stats"  # (the second output: one mean a row, not a sum a column)
    col_sum = torch.empty(*((m, 1) if rows else (1, n)), device="cuda", dtype=torch.float32) if "sum" in t else None
    if col_sum is not None:
        pack[t["sum"]] = col_sum
    row: dict[str, Any] = {"name": name, "m": m, "n": n, "k": k, "epilogue": epi, "dtype": dt}
    flop = 2.0 * m * n * k
    scale = ref.abs().max().item()
    lim_l2, lim_max = TOL[dt]

    def check(got: Any, sums: Any = None) -> dict[str, Any]:
        d = got.float() - ref
        rel_l2 = (d.norm() / ref.norm()).item()
        rel_max = (d.abs().max() / scale).item()
        ok = bool(torch.isfinite(got).all().item()) and rel_l2 <= lim_l2 and rel_max <= lim_max
        if sums is not None:  # the column sums (row means of squares) of the rounded output, to their rounding
            want = got.float().square().mean(1) if rows else got.float().sum(0)
            ok = ok and bool(((sums.view(-1) - want).norm() / want.norm()).item() <= 1e-4)
        return {"ok": ok, "rel_l2": rel_l2, "rel_max": rel_max}

    def timed(fn: Any) -> float:
        fn()
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        est = max((time.perf_counter() - t1) * 1e6, 5.0)
        calls = max(1, min(50, int(3000 / est)))
        cap = capture(fn, calls, warmup=1)
        cap.graph.replay()
        per = statistics.median(events_us(cap.graph.replay, rounds, 1000.0)) / calls
        del cap
        return per

    for v in variants:
        plan = b["plans"].get(v)
        if plan is None:  # (fewer candidates than asked)
            row[v] = {"knobs": "", "ok": True}
            continue
        entry: dict[str, Any] = {"knobs": knobs_text(plan)}
        try:
            y.fill_(float("nan"))
            if col_sum is not None:
                col_sum.fill_(float("nan"))
            plan.execute(pack)
            torch.cuda.synchronize()
            entry.update(check(y, col_sum))
            us = timed(lambda plan=plan: plan.execute(pack))
            entry.update(us=us, tflops=flop / us / 1e6)
        except Exception as err:  # noqa: BLE001 - recorded, the next variant runs
            entry.update(ok=False, error=f"{type(err).__name__}: {err}"[:500])
        row[v] = entry

    lib = cublas_peer(epi, a, wt, bias, other, y)
    cub: dict[str, Any] = {}
    try:
        y.fill_(float("nan"))
        cub.update(check(lib()))
        us = timed(lib)
        cub.update(us=us, tflops=flop / us / 1e6)
    except Exception as err:  # noqa: BLE001
        cub.update(error=f"{type(err).__name__}: {err}"[:500])
    row["cublas"] = cub
    return row


def reference(epi: str, a: Any, w: Any, bias: Any, other: Any) -> Any:
    """The row's output in fp32 (torch)."""
    import torch

    ref = a.float() @ w.float().t()
    if bias is not None:
        ref += bias.float()
    if epi == "mul":
        ref *= other.float()
    if epi.startswith("residual"):
        ref += other.float()
    if epi == "bias_gelu":
        ref = torch.nn.functional.gelu(ref, approximate="tanh")
    if epi == "bias_gelu_erf":
        ref = torch.nn.functional.gelu(ref)
    if epi.startswith("gelu_bwd"):
        ref = torch.ops.aten.gelu_backward(ref, other.float())
    return ref


def cublas_peer(epi: str, a: Any, wt: Any, bias: Any, other: Any, y: Any) -> Any:
    """The row's peer: cuBLAS with its own epilogue where it has one (bias, tanh GELU, a residual as C),
    else eager's GEMM and then the epilogue's kernel."""
    import torch

    if epi == "bias_gelu":
        return lambda: torch._addmm_activation(bias, a, wt, use_gelu=True)
    if epi == "bias_gelu_erf":  # (cuBLAS's GELU epilogue is tanh's: eager's addmm then its erf GELU kernel)
        return lambda: torch.nn.functional.gelu(torch.addmm(bias, a, wt, out=y))
    if epi == "bias":
        return lambda: torch.addmm(bias, a, wt, out=y)
    if epi == "residual":  # (cuBLAS adds C itself: beta 1)
        return lambda: torch.addmm(other, a, wt, out=y)
    if epi == "residual_stats":  # (and eager's mean of squares kernel)

        def residual_stats() -> Any:
            torch.addmm(other, a, wt, out=y).float().square().mean(1)
            return y

        return residual_stats
    if epi.startswith("gelu_bwd"):  # (eager: the GEMM, GELU's backward kernel, the column sums for _sum)

        def gelu_bwd() -> Any:
            torch.ops.aten.gelu_backward.grad_input(torch.matmul(a, wt), other, grad_input=y)
            if epi == "gelu_bwd_sum":
                y.sum(0, dtype=torch.float32)
            return y

        return gelu_bwd
    if epi == "mul":  # (eager: the GEMM, then the product's own kernel)
        return lambda: torch.mul(torch.matmul(a, wt), other, out=y)
    return lambda: torch.matmul(a, wt, out=y)


def markdown(header: dict[str, Any], results: list[dict[str, Any]], variants: list[str]) -> str:
    lines = [
        f"# opgraph Hopper GEMM check: {header['device']} (sm_{''.join(map(str, header['capability']))})",
        f"torch {header['torch']}, Triton {header['triton']}, {header['started']}"
        + (f", {header['seconds']} s" if "seconds" in header else "")
        + ". TFLOP/s from CUDA-graph replays (median); every output checked against torch fp32 first.",
        "",
        "| shape | M x N x K | cuBLAS | " + " | ".join(variants) + " | new / cuBLAS | new knobs |",
        "|---|---|---|" + "---|" * len(variants) + "---|---|",
    ]
    for r in results:
        if "skipped" in r:
            lines.append(f"| {r['name']} | skipped ({r['skipped']}) |")
            continue
        cub = r["cublas"].get("tflops")
        cells = []
        for v in variants:
            e = r[v]
            if "tflops" not in e:
                cells.append("error" if "error" in e else "-")
                continue
            cells.append(f"{e['tflops']:.0f}{'' if e['ok'] else ' **WRONG**'}")
        ratio = r["new"].get("tflops", 0) / cub if cub else float("nan")
        shape = f"{r['m']}x{r['n']}x{r['k']} {r['dtype']}{' +' + r['epilogue'] if r['epilogue'] else ''}"
        lines.append(f"| {r['name']} | {shape} | {cub:.0f} | " if cub else f"| {r['name']} | {shape} | - | ")
        lines[-1] += " | ".join(cells) + f" | {ratio:.2f} | {r['new']['knobs']} |"
    errors = [
        (r["name"], v, r[v]["error"])
        for r in results
        if "skipped" not in r
        for v in [*variants, "cublas"]
        if "error" in r[v]
    ]
    if errors:
        lines += ["", "Errors:"] + [f"- {n} {v}: {e}" for n, v, e in errors]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
