"""Compile the lab's GEMM kernels for Hopper (sm_90a) on a machine without a GPU and report what came
out: registers, spills, shared memory, warps, and whether the code uses wgmma (HGMMA/QGMMA in SASS),
TMA loads and stores (cp.async.bulk.tensor), mbarriers and setmaxnreg (warp specialization).

Kernels compile through Triton's own launch path (JITFunction.warmup, as gemm_sweep.py's compile
children do on the GPU) with a stand-in driver that names an sm_90 target, so the check covers the
sweep's argument handling too. Needs torch (CPU is enough) and Triton with its NVIDIA backend. To
check the GPU image's compiler, install Triton 3.6 beside a CPU torch in a venv of its own:

    python3 -m venv /tmp/t36 && /tmp/t36/bin/pip install triton==3.6.0 torch   # any torch
    /tmp/t36/bin/python scripts/hopper_lab/compile_check.py --out /tmp/compile36.md

Each kernel compiles in a child process (a crash of the compiler costs that kernel only).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _fake_driver() -> None:
    """Make Triton's JIT believe it runs on an sm_90 device (compile only: nothing is launched)."""
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    class Sm90Driver:
        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

        def get_active_torch_device(self):
            import torch

            return torch.device("cpu")

    driver.set_active(Sm90Driver())


def compile_one(spec: dict) -> dict:
    """In the child: compile one kernel for sm_90a and measure its code."""
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    _fake_driver()
    import gemm_kernels as gk
    import gemm_sweep as gs

    t0 = time.time()
    ck = gs.compile_kernel(spec, 132, device="cpu")
    ctime = time.time() - t0
    return {
        "variant": spec["variant"],
        "cfg": gk.cfg_name(spec["cfg"]),
        "dtype": spec["dtype"],
        "b": spec["b"],
        "act": spec["act"],
        "compile_s": round(ctime, 2),
        **analyze(ck),
    }


def analyze(ck) -> dict:
    """What a CompiledKernel for sm_90 holds: ptxas's registers and spills, shared memory, warps, and
    counts of the instructions that matter on Hopper (PTX, and SASS from Triton's cuobjdump)."""
    from triton.backends.nvidia.compiler import get_ptxas

    ptx = ck.asm["ptx"]
    ptxas = get_ptxas(90)
    ptxas = getattr(ptxas, "path", ptxas)
    tmp = Path(tempfile.mkdtemp())
    (tmp / "k.ptx").write_text(ptx)
    info = subprocess.run(
        [ptxas, "-v", "--gpu-name", "sm_90a", str(tmp / "k.ptx"), "-o", str(tmp / "k.cubin")],
        capture_output=True,
        text=True,
        check=False,
    ).stderr
    regs = max([int(r) for r in re.findall(r"Used (\d+) registers", info)] or [0])
    spills = sum(int(s) for s in re.findall(r"(\d+) bytes spill stores", info))
    sass = ""
    cuobjdump = Path(ptxas).with_name("cuobjdump")
    if cuobjdump.exists() and (tmp / "k.cubin").exists():
        sass = subprocess.run(
            [str(cuobjdump), "-sass", str(tmp / "k.cubin")], capture_output=True, text=True, check=False
        ).stdout
    ttgir = ck.asm.get("ttgir", "")
    total_warps = re.search(r'"ttg.total-num-warps"\s*=\s*(\d+)', ttgir)
    return {
        "regs": regs,
        "spill_bytes": spills,
        "smem": ck.metadata.shared,
        "warps": ck.metadata.num_warps,
        "total_warps": int(total_warps.group(1)) if total_warps else ck.metadata.num_warps,
        "ws_regions": ttgir.count("ttg.warp_specialize"),
        "wgmma_ptx": len(re.findall(r"wgmma\.mma_async", ptx)),
        "gmma_sass": len(re.findall(r"\b[HQ]GMMA\b", sass)),
        "hmma_sass": len(re.findall(r"\bHMMA\b", sass)),
        "tma_load_ptx": len(re.findall(r"cp\.async\.bulk\.tensor\.\dd\.shared::cluster\.global", ptx)),
        "tma_store_ptx": len(re.findall(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared", ptx)),
        "cp_async_ptx": len(re.findall(r"cp\.async\.c[ag]", ptx)),
        "setmaxnreg": len(re.findall(r"setmaxnreg", ptx)),
        "mbarrier": len(re.findall(r"mbarrier\.", ptx)),
        "local_mem_sass": len(re.findall(r"\b(?:LDL|STL)\b", sass)),
    }


def _child(arg: str) -> None:
    spec = json.loads(arg)
    try:
        res = compile_one(spec)
        res["ok"] = True
    except Exception as e:  # noqa: BLE001 - every compiler error is a finding
        text = str(e).strip()
        res = {"ok": False, "error": f"{type(e).__name__}: {text.splitlines()[-1] if text else ''}"[:400]}
    print("RESULT " + json.dumps(res))


def run_child(spec: dict, timeout: float) -> dict:
    import gemm_kernels as gk

    base = {
        "variant": spec["variant"],
        "cfg": gk.cfg_name(spec["cfg"]),
        "dtype": spec["dtype"],
        "b": spec["b"],
        "act": spec["act"],
    }
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    try:
        done = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {**base, "ok": False, "error": f"compile timed out after {timeout:.0f} s"}
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return {**base, **json.loads(line[7:])}
    tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
    return {**base, "ok": False, "error": f"compiler crashed (exit {done.returncode}): {' | '.join(tail)}"[:400]}


def specs(full: bool) -> list[dict]:
    import gemm_kernels as gk

    out = []
    for name, v in gk.VARIANTS.items():
        cfgs = v.configs(2)
        if not full:  # one big and one 128x128 config a variant
            big = [c for c in cfgs if c["BM"] * c["BN"] == 32768][:1]
            mid = [c for c in cfgs if c["BM"] == c["BN"] == 128 and c["BK"] == 64][:1]
            cfgs = big + mid
        for cfg in cfgs:
            for b in ("kn", "nk") if full else ("nk",):
                out.append({"variant": name, "cfg": cfg, "dtype": "bf16", "b": b, "act": 0})

    def big(v, elem):
        cfgs = [c for c in v.configs(elem) if (c["BM"], c["BN"]) == (128, 256)]
        return cfgs[0] if cfgs else None

    # the fused epilogue (bias + tanh GELU) on a 128x256 tile, B row-major, and fp8
    for name in (
        "plain",
        "persist",
        "persist_sub",
        "persist_ws",
        "persist_flat",
        "persist_flat_sub",
        "gluon_persist",
        "gluon_ws",
    ):
        cfg = big(gk.VARIANTS[name], 2)
        if cfg:
            out.append({"variant": name, "cfg": cfg, "dtype": "bf16", "b": "nk", "act": 2})
            out.append({"variant": name, "cfg": cfg, "dtype": "bf16", "b": "kn", "act": 0})
    for name in gk.FP8_VARIANTS:
        cfg = big(gk.VARIANTS[name], 1)
        if cfg:
            out.append({"variant": name, "cfg": cfg, "dtype": "fp8", "b": "nk", "act": 0})
    return out


COLS = [
    "variant",
    "cfg",
    "dtype",
    "b",
    "act",
    "ok",
    "regs",
    "spill_bytes",
    "smem",
    "warps",
    "total_warps",
    "ws_regions",
    "wgmma_ptx",
    "gmma_sass",
    "hmma_sass",
    "tma_load_ptx",
    "tma_store_ptx",
    "cp_async_ptx",
    "setmaxnreg",
    "local_mem_sass",
    "compile_s",
    "error",
]


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        _child(sys.argv[2])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="every config of every variant, both B layouts")
    ap.add_argument("--only", default="", help="comma-separated variant names")
    ap.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--out", default="", help="write a markdown table (and .json beside it)")
    args = ap.parse_args()
    import triton

    todo = specs(args.full)
    if args.only:
        keep = set(args.only.split(","))
        todo = [s for s in todo if s["variant"] in keep]
    print(f"triton {triton.__version__}: compiling {len(todo)} kernels for sm_90a, {args.jobs} at a time", flush=True)
    rows = []
    with ThreadPoolExecutor(args.jobs) as pool:
        for r in pool.map(lambda s: run_child(s, args.timeout), todo):
            rows.append(r)
            print(" ".join(f"{c}={r.get(c)}" for c in COLS if r.get(c) not in (None, "")), flush=True)
    if args.out:
        lines = [
            f"Compiled for sm_90a with Triton {triton.__version__} on a CPU (no GPU): {len(rows)} kernels.",
            "",
            "| " + " | ".join(COLS) + " |",
            "|" + "---|" * len(COLS),
        ]
        for r in rows:
            lines.append("| " + " | ".join(str(r.get(c, "")).replace("|", "/") for c in COLS) + " |")
        Path(args.out).write_text("\n".join(lines) + "\n")
        Path(args.out).with_suffix(".json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
