"""The GPU kernels of opgraph's plan of the Llama zoo model's inference (8 layers, d 1024, GQA 16/4, batch
8 x 1024, bf16), as they run in sequence: PyTorch's profiler over 10 plain executes, the kernels of the last
call in launch order with their device µs (what each step takes inside the plan, where
`plan.profile_steps` times each step alone), after the plan's steps (engine, template, ops) for matching;
then the same sums grouped by kernel name (scripts/inductor_profile.py lists torch.compile's alike).

    PYTHONPATH=$PWD python scripts/plan_profile.py        # from the repo root, ~1 min
"""

import sys

import torch

sys.path.insert(0, ".")
import opgraph as og  # noqa: E402
from bench.measure import call_kernels, print_kernels  # noqa: E402
from bench.workloads.zoo import llama_zoo_inference  # noqa: E402


def main() -> None:
    m, x = llama_zoo_inference()
    with torch.no_grad():
        imp = og.from_torch(m, (x,))
        plan = imp.graph.build()
        pack = imp.variant_pack(x)
        kernels = call_kernels(lambda: plan.execute(pack))
    for i, s in enumerate(plan.steps):
        kinds = "+".join(n.kind if n.kind != "pointwise" else str(n.op.mode.value) for n in s.piece.nodes)
        print(f"  step {i:3d} {s.config.engine:8s} {kinds[:100]}")
    print_kernels(kernels)


if __name__ == "__main__":
    main()
