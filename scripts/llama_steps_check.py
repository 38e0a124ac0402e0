"""The Llama zoo model's inference plans step by step: from_torch's and torch.compile(backend="opgraph")'s,
each step run alone (plan.profile_steps: engine, template, device µs, the estimate, the ops), the µs of
plain calls of each, a profile of the backend's host time, and the backend partitions' graphs (opgraph JSON
and FX code) under $OUT for study on a machine without a GPU.

    PYTHONPATH=$PWD python scripts/llama_steps_check.py > $OUT/llama_steps.log     # from the repo root, ~1 min

Results: bench/results/2026-11-30-h200-llama-backend-steps.md."""

import collections
import cProfile
import io
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, ".")
import opgraph as og
from bench.workloads.zoo import _wrap, llama_model
from opgraph.frontends import dynamo_partition as dp

OUT = os.environ.get("OUT", "/tmp")
torch.backends.cudnn.benchmark = True
m = _wrap(llama_model(1024, 8, 16, 4, 2816, 32000).cuda().to(torch.bfloat16).eval(), "logits")
x = torch.randint(0, 32000, (8, 1024), device="cuda")


def kinds(s):
    return "+".join(n.kind if n.kind != "pointwise" else str(n.op.mode.value) for n in s.piece.nodes)[:150]


def listing(plan, pack, label, first=16):
    rows = plan.profile_steps(pack, repeat=10)
    tot = collections.Counter()
    cnt = collections.Counter()
    for r in rows:
        tot[r.engine + ":" + r.template] += r.device_us
        cnt[r.engine + ":" + r.template] += 1
    print(
        f"== {label}: {len(rows)} steps, device {sum(r.device_us for r in rows):.0f} us, host {sum(r.host_us for r in rows):.0f} us"
    )
    for k, v in tot.most_common():
        print(f"   {k:30s} x{cnt[k]:3d} {v:8.1f}")
    for r in rows[:first] + rows[-4:]:
        s = plan.steps[r.step]
        print(
            f"   {r.step:3d} {r.engine:8s} {r.template:12s} {r.device_us:8.1f} est {s.config.estimate_us or 0:7.1f}  {kinds(s)}"
        )
        if s.config.engine == "library":
            print("        why:", s.config.why[:200])


with torch.no_grad():
    ref = m(x).float()
    imp = og.from_torch(m, (x,))
    plan = imp.graph.build()
    pack = imp.variant_pack(x) if hasattr(imp, "variant_pack") else None
    for _ in range(3):  # (the first call builds run()'s plan)
        imp.run(x)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(20):
        imp.run(x)
    torch.cuda.synchronize()
    print(f"from_torch run() plain call {(time.perf_counter() - t) / 20 * 1e6:.0f} us")
    if pack is None:
        print("no variant_pack on ImportedGraph; skipping from_torch listing")
    else:
        listing(plan, pack, "from_torch")
    # the backend: record each PlanModule's plan and the pack of its first call
    seen = []
    orig_call = dp.PlanModule.__call__
    orig_exec = None

    def spy(self, *args):
        if not any(p is self for p, _ in seen):
            plan = self.plan
            real = plan.execute

            def grab(pack, *a, **k):
                seen.append((self, dict(pack)))
                plan.execute = real
                return real(pack, *a, **k)

            plan.execute = grab
        return orig_call(self, *args)

    dp.PlanModule.__call__ = spy
    c = torch.compile(m, backend=og.torch_backend, fullgraph=True)
    y = c(x)
    torch.cuda.synchronize()
    dp.PlanModule.__call__ = orig_call
    print("backend err", ((y.float() - ref).norm() / ref.norm()).item(), "partitions", len(seen))
    for i, (pm, pk) in enumerate(seen):
        open(f"{OUT}/backend_graph{i}.json", "w").write(pm.imported.graph.to_json())
        open(f"{OUT}/backend_fx{i}.txt", "w").write(pm.fallback.print_readable(print_output=False))
        print("   inputs", len(pm._inputs), "bound", len(pm._bound), "outputs", len(pm._outputs))
        listing(pm.plan, pk, f"backend partition {i}")
    # host: plain calls
    for _ in range(3):
        c(x)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(20):
        c(x)
    torch.cuda.synchronize()
    print(f"backend plain call {(time.perf_counter() - t) / 20 * 1e6:.0f} us")
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(10):
        c(x)
    torch.cuda.synchronize()
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
    print(s.getvalue()[:6000])
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(30)
    print(s.getvalue()[:6000])
