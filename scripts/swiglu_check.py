"""The Llama zoo model's SwiGLU (8192 tokens, d 1024, hidden 2816, bf16) as one matmul kernel with the two
products side by side (GemmPiece.siblings, build/sibling_merge.py), timed in several configs against the two
steps apart and against cuBLAS with eager's SiLU-times kernel, every output checked against torch in fp32
first. Also the same two products with a plain add as the epilogue (the main loop's share).

    PYTHONPATH=$PWD python scripts/swiglu_check.py > $OUT/swiglu_check.txt      # from the repo root, ~1 min
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "scripts"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

M, D, H = 8192, 1024, 2816
VARIANTS: dict[str, dict[str, Any]] = {
    "heuristic": {},
    "s4": {"num_stages": 4},
    "whole-epilogue": {"EPILOGUE_SUBTILE": None},
    "128x64 s4": {"BLOCK_N": 64, "num_stages": 4, "EPILOGUE_SUBTILE": None},
    "64x128 w4 s4": {"BLOCK_M": 64, "num_warps": 4, "num_stages": 4, "EPILOGUE_SUBTILE": None},
    "256x64 s3": {"BLOCK_M": 256, "BLOCK_N": 64},
    "no-flatten": {"FLATTEN": None},
}


def graph(epi: str) -> tuple[Any, dict[str, Any]]:
    import opgraph as og

    DT = og.DataType
    g = og.Graph(f"swiglu_{epi}", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    x = g.tensor(dim=[M, D], name="x")
    wg = g.tensor(dim=[D, H], stride=[1, D], name="w_gate")
    wu = g.tensor(dim=[D, H], stride=[1, D], name="w_up")
    gate, up = g.matmul(x, wg), g.matmul(x, wu)
    y = g.mul(g.swish(gate), up) if epi == "swiglu" else g.add(gate, up)
    y.set_output(True).set_data_type(DT.BFLOAT16)
    return g, {"x": x, "wg": wg, "wu": wu, "y": y}


def main() -> None:
    import torch

    from bench.measure import replay_us

    from hopper_gemm_check import config_plan, knobs_text

    t0 = time.time()
    torch.manual_seed(0)
    x = torch.randn(M, D, device="cuda", dtype=torch.bfloat16)
    wg = (torch.randn(H, D, device="cuda") / D**0.5).to(torch.bfloat16)
    wu = (torch.randn(H, D, device="cuda") / D**0.5).to(torch.bfloat16)
    y = torch.empty(M, H, device="cuda", dtype=torch.bfloat16)
    gf, uf = x.float() @ wg.float().t(), x.float() @ wu.float().t()
    refs = {"swiglu": torch.nn.functional.silu(gf) * uf, "add": gf + uf}
    flop = 2.0 * 2 * M * H * D
    for epi in ("swiglu", "add"):
        g, t = graph(epi)
        plan = g.build(device="cuda", engines=["triton"], allow_partition=False, compile="lazy")
        base = {k: v for k, v in plan.steps[0].config.knobs if k != "template"}
        pack = {t["x"]: x, t["wg"]: wg.t(), t["wu"]: wu.t(), t["y"]: y}
        ref = refs[epi]
        for name, change in VARIANTS.items() if epi == "swiglu" else [("heuristic", {})]:
            knobs = {k: v for k, v in {**base, **change}.items() if v is not None}
            try:
                p = config_plan(plan, knobs)
                y.fill_(float("nan"))
                p.execute(pack)
                torch.cuda.synchronize()
                err = ((y.float() - ref).norm() / ref.norm()).item()
                us = replay_us(lambda p=p: p.execute(pack), 20, 15)
                print(
                    f"{epi:7s} {name:16s} {us:8.1f} us {flop / us / 1e6:6.0f} TFLOP/s err {err:.1e}  {knobs_text(p)}",
                    flush=True,
                )
            except Exception as e:  # noqa: BLE001 - recorded, the next variant runs
                print(f"{epi:7s} {name:16s} failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
    # the two steps apart, as the planner ran them before the merge
    import opgraph as og

    DT = og.DataType
    g1 = og.Graph("gate", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    xa, wa = g1.tensor(dim=[M, D], name="x"), g1.tensor(dim=[D, H], stride=[1, D], name="w")
    act = g1.swish(g1.matmul(xa, wa)).set_output(True).set_data_type(DT.BFLOAT16)
    g2 = og.Graph("up", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    xb, wb, ab = (
        g2.tensor(dim=[M, D], name="x"),
        g2.tensor(dim=[D, H], stride=[1, D], name="w"),
        g2.tensor(dim=[M, H], name="a"),
    )
    out = g2.mul(g2.matmul(xb, wb), ab).set_output(True).set_data_type(DT.BFLOAT16)
    p1 = g1.build(device="cuda", engines=["triton"])
    p2 = g2.build(device="cuda", engines=["triton"])
    a = torch.empty(M, H, device="cuda", dtype=torch.bfloat16)
    pk1, pk2 = {xa: x, wa: wg.t(), act: a}, {xb: x, wb: wu.t(), ab: a, out: y}

    def apart() -> None:
        p1.execute(pk1)
        p2.execute(pk2)

    y.fill_(float("nan"))
    apart()
    torch.cuda.synchronize()
    err = ((y.float() - refs["swiglu"]).norm() / refs["swiglu"].norm()).item()
    us = replay_us(apart, 20, 15)
    print(
        f"swiglu  {'apart (2 steps)':16s} {us:8.1f} us {flop / us / 1e6:6.0f} TFLOP/s err {err:.1e}  {knobs_text(p1)} | {knobs_text(p2)}"
    )

    def cublas() -> None:
        torch.mul(torch.nn.functional.silu(x @ wg.t()), x @ wu.t(), out=y)

    y.fill_(float("nan"))
    cublas()
    err = ((y.float() - refs["swiglu"]).norm() / refs["swiglu"].norm()).item()
    us = replay_us(cublas, 20, 15)
    print(f"swiglu  {'cuBLAS + eager':16s} {us:8.1f} us {flop / us / 1e6:6.0f} TFLOP/s err {err:.1e}")
    print(f"({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
