"""Run the benchmark suite on a GPU: `python -m bench.run [GROUP_OR_WORKLOAD ...] [--autotune]`.

Writes results.json and results.md into --out (default $OUT or /tmp) and prints the table."""

from __future__ import annotations

import argparse
import datetime
import os
import sys

import torch


def main(argv: list[str] | None = None) -> int:
    from . import attention, gemm, host, memory, networks
    from .harness import Session

    table = {**memory.WORKLOADS, **gemm.WORKLOADS, **host.WORKLOADS, **networks.WORKLOADS, **attention.WORKLOADS}
    groups = {"memory": list(memory.WORKLOADS), "gemm": list(gemm.WORKLOADS), "host": list(host.WORKLOADS),
              "networks": list(networks.WORKLOADS), "attention": list(attention.WORKLOADS)}
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("which", nargs="*", help=f"groups {list(groups)} or workloads {list(table)} (default: all)")
    ap.add_argument("--autotune", action="store_true", help="also time plans built with autotune=True")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile (slow to build)")
    ap.add_argument("--profile", action="store_true", help="print each plan's kernels and their device times")
    ap.add_argument("--graph", action="store_true", help="also time CUDA-graph replays of each plan")
    ap.add_argument("--steps", action="store_true", help="print where each network plan's time goes, step by step")
    ap.add_argument("--describe", action="store_true", help="print each plan's describe() (configs, alternatives)")
    args = ap.parse_args(argv)
    for flag, var in ((args.no_compile, "OPGRAPH_BENCH_NO_COMPILE"), (args.profile, "OPGRAPH_BENCH_PROFILE"),
                      (args.graph, "OPGRAPH_BENCH_GRAPH"), (args.describe, "OPGRAPH_BENCH_DESCRIBE"),
                      (args.steps, "OPGRAPH_BENCH_STEPS")):
        if flag:
            os.environ[var] = "1"
    names: list[str] = []
    for w in args.which or list(groups):
        names += groups.get(w, [w])
    torch.backends.cudnn.benchmark = True
    s = Session()
    s.meta = {"date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name(),
              "torch": torch.__version__, "cudnn": torch.backends.cudnn.version()}
    try:
        import triton

        s.meta["triton"] = triton.__version__
    except ImportError:
        pass
    from . import peers

    s.meta["cudnn_frontend"] = getattr(peers.cudnn, "__version__", None) if peers.available() else None
    print(s.meta, flush=True)
    s.measure_ceilings()
    for n in names:
        if n not in table:
            print(f"unknown workload {n}; known: {list(table)}", file=sys.stderr)
            return 2
        try:
            table[n](s, args.autotune)
        except Exception:  # noqa: BLE001 - keep going: one broken workload must not lose the run
            import traceback

            traceback.print_exc()
        os.makedirs(args.out, exist_ok=True)  # what is done so far survives a time limit
        with open(os.path.join(args.out, "results.partial.md"), "w") as f:
            f.write(s.markdown() + "\n")
    from .common import print_profiles

    print_profiles()
    md = s.markdown()
    header = (f"Measured {s.meta['date']} on {s.meta['device']}: torch {s.meta['torch']}, cuDNN {s.meta['cudnn']}, "
              f"Triton {s.meta.get('triton')}, cuDNN frontend {s.meta['cudnn_frontend']}. Ceilings: copy "
              f"{s.ceilings['copy_gbps']:.0f} GB/s, fp16 GEMM {s.ceilings['gemm_tflops']:.0f} TFLOP/s. "
              "Times in µs (median, CUDA events, triton.testing.do_bench), one run.\n\n")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        f.write(s.to_json())
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(header + md + "\n")
    print("\n" + header + md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
