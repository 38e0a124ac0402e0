"""Where the Llama zoo model's training step goes (8 layers, d 1024, GQA 16/4, batch 4 x 1024, bf16 mixed
precision, AdamW, as bench's zoo-llama-train row builds it): every step of opgraph's plan timed alone
(`plan.profile_steps`), listed in plan order with its engine, template, tile and ops, then summed by
template and by the ops' kinds, longest first (scripts/plan_profile.py does the inference plan).

    PYTHONPATH=$PWD python scripts/train_profile.py [--layers N]    # from the repo root, ~1 min
"""

import argparse
import sys

sys.path.insert(0, ".")
from bench.measure import print_sums  # noqa: E402
from bench.workloads.training_gpt2 import adamw_train_step  # noqa: E402
from bench.workloads.zoo import LLAMA_SIZES, llama_zoo_training  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=LLAMA_SIZES[1])
    p.add_argument("--device", default="cuda")
    p.add_argument("--copies", action="store_true", help="train_step(compute_copies=True), off in the bench's row")
    args = p.parse_args()
    m, x, y = llama_zoo_training(args.layers, args.device)
    _, ts = adamw_train_step(m, x, compute_copies=args.copies)
    plan = ts.graph.build()
    ts.plan = plan
    pack = ts.pack(x, target=y)
    times = plan.profile_steps(pack, repeat=10)
    by_template: list[tuple[str, float]] = []
    by_kinds: list[tuple[str, float]] = []
    print(f"{len(plan.steps)} steps, {sum(t.device_us for t in times):.0f} us of device time alone")
    for s, t in zip(plan.steps, times):
        kinds = "+".join(n.kind if n.kind != "pointwise" else str(n.op.mode.value) for n in s.piece.nodes)
        what = f"{s.config.engine}:{t.template}" if t.template else s.config.engine
        tile = " ".join(f"{k}={v}" for k, v in s.config.knobs if k.startswith(("BLOCK_", "num_", "SPLIT")))
        print(f"  {s.index:4d} {t.device_us:8.1f}  {what:22s} {tile[:60]:60s} {kinds[:110]}")
        by_template.append((what, t.device_us))
        by_kinds.append((kinds, t.device_us))
    for title, pairs in (("by template", by_template), ("by ops", by_kinds)):
        print(title)
        print_sums(pairs, top=40)


if __name__ == "__main__":
    main()
