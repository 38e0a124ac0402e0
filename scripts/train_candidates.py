"""Every timed candidate of the Llama zoo model's training step pieces at one layer (batch 4 x 1024, bf16 mixed
precision, AdamW): the plan built with autotune=True, then the tuning cache read back, each piece with its five
fastest configs (bench/results/2026-12-02-h200-llama-train-steps.md).

    PYTHONPATH=$PWD python scripts/train_candidates.py        # from the repo root, ~2 min on an H200
"""

import json
import sys
import time

sys.path.insert(0, ".")
from bench.workloads.training_gpt2 import adamw_train_step  # noqa: E402
from bench.workloads.zoo import llama_zoo_training  # noqa: E402
from opgraph.core.cache import tuning_path  # noqa: E402


def main() -> None:
    m, x, _ = llama_zoo_training(layers=1)
    _, ts = adamw_train_step(m, x)
    t = time.perf_counter()
    ts.graph.build(autotune=True)
    print(f"tuned build {time.perf_counter() - t:.1f}s", flush=True)
    data = json.loads(tuning_path().read_bytes())
    for v in (data.get("entries", data)).values():
        if not isinstance(v, dict) or "times" not in v or len(v["times"]) < 2:
            continue
        ranked = sorted(v["times"].items(), key=lambda kv: kv[1])
        print("PIECE", f"{ranked[0][1]:.1f}", "+".join(v["piece"])[:160])
        for cid, tt in ranked[:5]:
            print(f"   {tt:8.1f} {cid[:230]}")


if __name__ == "__main__":
    main()
