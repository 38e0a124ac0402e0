"""torch.compile on the Llama zoo model's inference (8 layers, d 1024, GQA 16/4, batch 8 x 1024, bf16), with
freezing as the bench's peer compiles it (default mode: the row's best peer; --mode another): its GPU kernels
from PyTorch's profiler over 10 calls, the last call's in launch order with their device µs, then the sums by
kernel name. The same listing as scripts/plan_profile.py gives for opgraph's plan, to set the two side by
side a layer at a time.

    PYTHONPATH=$PWD python scripts/inductor_profile.py [--mode max-autotune-no-cudagraphs]   # ~1-2 min
"""

import argparse
import sys

import torch

sys.path.insert(0, ".")
from bench.measure import call_kernels, print_kernels  # noqa: E402
from bench.workloads.zoo import llama_zoo_inference  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", default="default")
    args = parser.parse_args()
    m, x = llama_zoo_inference()
    f = torch.compile(m, mode=args.mode, dynamic=False)
    with torch.no_grad(), torch._inductor.config.patch(freezing=True):
        print_kernels(call_kernels(lambda: f(x)))


if __name__ == "__main__":
    main()
