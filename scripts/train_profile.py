"""Where the Llama zoo model's training step goes (8 layers, d 1024, GQA 16/4, batch 4 x 1024, bf16 mixed
precision, AdamW, as bench's zoo-llama-train row builds it): every step of opgraph's plan timed alone
(`plan.profile_steps`), listed in plan order with its engine, template, tile and ops, then summed by
template and by the ops' kinds, longest first (scripts/plan_profile.py does the inference plan).

    PYTHONPATH=$PWD python scripts/train_profile.py [--layers N]    # from the repo root, ~1 min
"""

import argparse
import sys

import torch

sys.path.insert(0, ".")
import opgraph as og  # noqa: E402
from bench.workloads.training_gpt2 import BETAS, EPS, LR, WD  # noqa: E402
from bench.workloads.zoo import LLAMA_SIZES, _wrap, llama_model  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=LLAMA_SIZES[1])
    p.add_argument("--device", default="cuda")
    args = p.parse_args()
    d, _, heads, kv, ffn, vocab = LLAMA_SIZES
    m = _wrap(llama_model(d, args.layers, heads, kv, ffn, vocab).to(args.device).train(), "logits", flatten=True)
    x = torch.randint(0, vocab, (4, 1024), device=args.device)
    y = torch.randint(0, vocab, (4 * 1024,), device=args.device)
    imp = og.from_torch(m, (x,))
    opt = og.training.AdamW(LR, betas=BETAS, eps=EPS, weight_decay=WD)
    ts = og.training.train_step(imp, "cross_entropy", opt, mixed_precision="bf16")
    plan = ts.graph.build()
    ts.plan = plan
    pack = ts.pack(x, target=y)
    times = plan.profile_steps(pack, repeat=10)
    by_template: dict[str, list[float]] = {}
    by_kinds: dict[str, list[float]] = {}
    print(f"{len(plan.steps)} steps, {sum(t.device_us for t in times):.0f} us of device time alone")
    for s, t in zip(plan.steps, times):
        kinds = "+".join(n.kind if n.kind != "pointwise" else str(n.op.mode.value) for n in s.piece.nodes)
        what = f"{s.config.engine}:{t.template}" if t.template else s.config.engine
        tile = " ".join(f"{k}={v}" for k, v in s.config.knobs if k.startswith(("BLOCK_", "num_", "SPLIT")))
        print(f"  {s.index:4d} {t.device_us:8.1f}  {what:22s} {tile[:60]:60s} {kinds[:110]}")
        for key, table in ((what, by_template), (kinds[:90], by_kinds)):
            total = table.setdefault(key, [0.0, 0])
            total[0] += t.device_us
            total[1] += 1
    for title, table in (("by template", by_template), ("by ops", by_kinds)):
        print(title)
        for key, (us, n) in sorted(table.items(), key=lambda kv: -kv[1][0])[:40]:
            print(f"{us:9.1f} x{int(n):4d} {us / n:8.1f}  {key}")


if __name__ == "__main__":
    main()
