"""Where a plain call of the Llama zoo model's training step through `torch.compile(backend="opgraph")`
spends its host time (issue 43): the step (autocast bf16 forward, cross-entropy, backward, fused AdamW) as
the zoo-llama-train benchmark's backend row runs it, timed plain and under cProfile, with each
partition's plan: steps, inputs, outputs, and what its internal CUDA graph did (captures, replays).

    PYTHONPATH=$PWD python scripts/backend_train_host.py [--steps] > $OUT/backend_train_host.txt   # ~1 min

With --steps, also where the device time goes: by kernel name over whole steps, and each partition's steps
alone by engine and template (--all-steps: every step listed, not the slowest). With --inductor, the same
step through torch.compile's default backend (Inductor, default mode) instead: its kernels by name, what
the backend's are read against. --mode M: torch.compile's mode (max-autotune-no-cudagraphs: opgraph's plans
autotuned).
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import time
from pathlib import Path
from typing import Any

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
    inductor = "--inductor" in sys.argv
    mode = sys.argv[sys.argv.index("--mode") + 1] if "--mode" in sys.argv else None
    backend = "inductor" if inductor else og.torch_backend
    net = torch.compile(m, backend=backend, mode=mode, dynamic=False)

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
    print(f"compiled in {time.time() - t0:.1f} s; {'inductor' if inductor else f'{len(made)} partition(s)'}")
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
    if "--steps" in sys.argv:
        steps_profile(made, step)
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


def steps_profile(made: list, step: Any) -> None:
    """Where the step's device time goes: PyTorch's profiler over 3 steps by kernel name (the partitions'
    generated kernels, cuDNN's and cuBLAS's, and what PyTorch runs: the loss, AdamW, fallbacks), then
    each partition's steps alone (`plan.profile_steps`) by engine and template, the slowest named."""
    import collections

    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    rows = sorted(
        ((e.device_time_total / 3, e.count // 3, e.key) for e in prof.key_averages() if e.device_time_total > 0),
        reverse=True,
    )
    print(f"device per step (profiler): {sum(r[0] for r in rows):.0f} us")
    for t, n, k in rows[:60]:
        print(f"  {t:9.1f} x{n:4d}  {k[:110]}")
    packs: dict[int, dict] = {}
    for pm in made:
        real = pm.plan.execute

        def grab(pack, *a, _pm=pm, _real=real, **k):
            packs.setdefault(id(_pm), dict(pack))
            return _real(pack, *a, **k)

        pm.plan.execute = grab
    step()
    torch.cuda.synchronize()
    for pm in made:
        pm.plan.__dict__.pop("execute", None)
        pack = packs.get(id(pm))
        if pack is None:
            continue
        found = pm.plan.profile_steps(pack, repeat=5)
        tot: collections.Counter = collections.Counter()
        cnt: collections.Counter = collections.Counter()
        for r in found:
            tot[f"{r.engine}:{r.template}"] += r.device_us
            cnt[f"{r.engine}:{r.template}"] += 1
        print(f"  {pm.name}: {len(found)} steps alone {sum(r.device_us for r in found):.0f} us")
        for key, t in tot.most_common():
            print(f"     {key:28s} x{cnt[key]:4d} {t:9.1f}")
        listed = found if "--all-steps" in sys.argv else sorted(found, key=lambda r: -r.device_us)[:12]
        for r in listed:
            kinds = "+".join(n.name for n in pm.plan.steps[r.step].piece.nodes)
            print(f"     {r.step:4d} {r.engine:8s} {r.template:12s} {r.device_us:8.1f}  {kinds[:160]}")


if __name__ == "__main__":
    main()
