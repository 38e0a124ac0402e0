"""Device time of the serving benchmark's Llama at one shape: the dynamic plan's plan of that shape against
a static plan built for it, by engine and template, and the matched pieces that differ most.

    python scripts/dynamic_vs_static_profile.py          # H200: bench/serving.py's model, batch 13 x 1569
    python scripts/dynamic_vs_static_profile.py 3x20     # H200: another batch x sequence
    python scripts/dynamic_vs_static_profile.py          # CPU: its dry-run model at 3 x 33 (wiring only)

Each plan's steps are timed alone (ExecutionPlan.profile_steps: the device idle before each step);
pieces are matched by their nodes' names. Issue 42's target is a request's device time within 10% of the
static plan's; this says where the rest goes.
"""

import collections
import sys

import torch

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
from torch.export import Dim

import opgraph as og
from bench.serving import _config, _ids, _model

dev = "cuda" if torch.cuda.is_available() else "cpu"
cfg = _config(dev == "cpu")
m = _model(cfg, dev, torch.bfloat16 if dev == "cuda" else torch.float32)
given = next((a for a in sys.argv[1:] if "x" in a), None)
shape = tuple(int(v) for v in given.split("x")) if given else ((13, 1569) if dev == "cuda" else (3, 33))
ids = _ids(0, shape, cfg["vocab"], dev)
ex = _ids(-1, (2, cfg["seq"][0] + 1), cfg["vocab"], dev)
dims = {0: Dim("batch", min=1, max=cfg["batch"]), 1: Dim("seq", min=cfg["seq"][0], max=cfg["seq"][1])}
with torch.no_grad():
    dyn = og.from_torch(m, (ex,), dynamic_shapes=(dims,))
    sta = og.from_torch(m, (ids,))
    out = {}
    for name, imp in (("dynamic", dyn), ("static", sta)):
        imp.run(ids, reuse_outputs=True)
        plan = imp.plan(dev)
        pack = next(iter(imp._runs.values())).refresh(imp, imp._flat_inputs((ids,)))
        p = plan.for_pack(pack) if hasattr(plan, "for_pack") else plan
        rows = p.profile_steps(pack, 10)
        out[name] = (p, rows)
        by = collections.Counter()
        for r in rows:
            by[f"{r.engine}:{r.template}"] += r.device_us
        print(f"== {name}: {len(rows)} steps, device {sum(r.device_us for r in rows):.0f} us")
        for k, v in by.most_common(12):
            print(f"   {k:32s} {v:9.0f}")
    (pd, rd), (ps, rs) = out["dynamic"], out["static"]

    def key(p, i):
        return " ".join(n.label() for n in p.steps[i].piece.nodes)[:90]

    ds = {key(pd, r.step): r for r in rd}
    ss = {key(ps, r.step): r for r in rs}
    diffs = []
    for k in ds:
        if k in ss:
            diffs.append((ds[k].device_us - ss[k].device_us, k, ds[k], ss[k]))
    diffs.sort(key=lambda x: -x[0])
    print("== largest differences (dynamic - static), matched pieces", len(diffs))
    for d, k, a, b in diffs[:25]:
        print(f"{d:8.1f}  dyn {a.device_us:8.1f} {a.engine}:{a.template} {pd.steps[a.step].config.knobs}")
        print(f"          sta {b.device_us:8.1f} {b.engine}:{b.template} {ps.steps[b.step].config.knobs}   {k}")
    for name, mine, theirs, plan in (("dynamic", ds, ss, pd), ("static", ss, ds, ps)):
        alone = sorted((r for k, r in mine.items() if k not in theirs), key=lambda r: -r.device_us)
        print(f"== {name} steps with no match ({len(alone)})")
        for r in alone[:30]:
            print(f"{r.device_us:8.1f}  {r.engine}:{r.template}  {key(plan, r.step)}")
    print(
        "unmatched dynamic",
        sum(ds[k].device_us for k in ds if k not in ss),
        "static",
        sum(ss[k].device_us for k in ss if k not in ds),
    )
