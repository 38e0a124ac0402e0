"""Every timed candidate of the Llama zoo model's training step pieces at one layer (batch 4 x 1024, bf16 mixed
precision, AdamW): the plan built with autotune=True, then the tuning cache read back, each piece with its five
fastest configs (bench/results/2026-12-02-h200-llama-train-steps.md).

    PYTHONPATH=$PWD python scripts/train_candidates.py        # from the repo root, ~2 min on an H200
"""

import json
import sys
import time

sys.path.insert(0, ".")
import torch

import opgraph as og
from bench.workloads.training_gpt2 import BETAS, EPS, LR, WD
from bench.workloads.zoo import LLAMA_SIZES, _wrap, llama_model
from opgraph.core.cache import tuning_path


def main() -> None:
    d, _, heads, kv, ffn, vocab = LLAMA_SIZES
    m = _wrap(llama_model(d, 1, heads, kv, ffn, vocab).cuda().train(), "logits", flatten=True)
    x = torch.randint(0, vocab, (4, 1024), device="cuda")
    imp = og.from_torch(m, (x,))
    ts = og.training.train_step(
        imp, "cross_entropy", og.training.AdamW(LR, betas=BETAS, eps=EPS, weight_decay=WD), mixed_precision="bf16"
    )
    t = time.perf_counter()
    ts.graph.build(autotune=True)
    print(f"tuned build {time.perf_counter() - t:.1f}s", flush=True)
    data = json.loads(tuning_path().read_bytes())
    for v in (data.get("entries", data)).values():
        if not isinstance(v, dict) or "times" not in v or len(v["times"]) < 2:
            continue
        ts_ = sorted(v["times"].items(), key=lambda kv: kv[1])
        print("PIECE", f"{ts_[0][1]:.1f}", "+".join(v["piece"])[:160])
        for cid, tt in ts_[:5]:
            print(f"   {tt:8.1f} {cid[:230]}")


if __name__ == "__main__":
    main()
