"""Where a plain call of the Llama zoo model's training step through `torch.compile(backend="opgraph")`
spends its host time (issue 43): the step (autocast bf16 forward, cross-entropy, backward, fused AdamW) as
the zoo-llama-train benchmark's backend row runs it, timed plain and under cProfile, with each
partition's plan: steps, inputs, outputs, and what its internal CUDA graph did (captures, replays).

    PYTHONPATH=$PWD python scripts/backend_train_host.py > $OUT/backend_train_host.txt   # from the repo root, ~1 min
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main() -> None:
    import torch

    import opgraph as og
    from bench.workloads.zoo import _wrap, llama_model
    from opgraph.frontends import dynamo_partition as dp

    t0 = time.time()
    torch.manual_seed(0)
    made: list = []
    init = dp.PlanModule.__init__

    def spy(self, *a, **k):  # every partition the backend makes
        init(self, *a, **k)
        made.append(self)

    dp.PlanModule.__init__ = spy
    m = _wrap(llama_model(1024, 8, 16, 4, 2816, 32000).cuda().train(), "logits", flatten=True)
    x = torch.randint(0, 32000, (4, 1024), device="cuda")
    y = torch.randint(0, 32000, (4 * 1024,), device="cuda")
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True, capturable=True)
    net = torch.compile(m, backend=og.torch_backend, dynamic=False)

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = net(x)
        loss = torch.nn.functional.cross_entropy(logits.float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    print(f"compiled in {time.time() - t0:.1f} s; {len(made)} partition(s)")
    for n in (1, 5, 10):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            step()
        torch.cuda.synchronize()
        print(f"plain step, {n} in a row: {(time.perf_counter() - t) / n * 1e3:.2f} ms")
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    ev[0].record()
    for _ in range(10):
        step()
    ev[1].record()
    torch.cuda.synchronize()
    print(f"device (events around 10 steps): {ev[0].elapsed_time(ev[1]) / 10:.2f} ms")
    for pm in made:
        local = getattr(pm.plan._threads, "state", None)
        bound = None if local is None else (local.owned or local.user)
        ag = None if bound is None else bound.autograph
        print(
            f"   {pm.name}: {len(pm.plan.steps)} steps, {len(pm._inputs)} inputs, {len(pm._bound)} bound, "
            f"{len(pm._outputs)} outputs, failed={pm.failed}"
            + (
                ""
                if ag is None
                else f"; autograph enabled={ag.enabled} captures={ag.captures} replays={ag.replays} stable={ag.stable}"
            )
        )
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    pr.disable()
    for key in ("tottime", "cumulative"):
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats(key).print_stats(35)
        print(s.getvalue()[:9000])
    print(f"({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
