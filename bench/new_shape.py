"""Host time of a dynamic plan's first execute at a new shape of a bucket already used, broken down
(CPU, no GPU needed: the kernels' own run is left out).

    python -m bench.new_shape [--graph small|llama] [--engines triton,torch]

For each new shape: the time to plan it (`DynamicPlan.for_pack`: the graph at the shape, the
bucket's plan carried to it or, before planning once per bucket, a whole plan: partition, ranking,
kernel generation, memory plan) and to bind it (`bind`: the first bind of that shape's plan), the
median over the shapes with the time inside each stage (the planner's and runtime's functions
wrapped), and the same shape again (the key lookup and a bind). `--graph small`: a residual layernorm,
a matmul and a GELU with batch 1..16 x seq 1..37; `--graph llama`: transformers' tiny Llama (the
import tests' config, fp32) imported with batch 1..4 x seq 17..64. Results: bench/results/.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

TIMES: dict[str, float] = {}


def _wrap(owner: Any, name: str, stage: str) -> None:
    real = getattr(owner, name)

    def timed(*a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        try:
            return real(*a, **k)
        finally:
            TIMES[stage] = TIMES.get(stage, 0.0) + time.perf_counter() - t

    setattr(owner, name, timed)


def _instrument() -> None:
    import opgraph as og
    import opgraph.build.planner as planner
    import opgraph.runtime.plan as rplan
    from opgraph.runtime import threads

    # (the wrappers stay for the process: run this in a process of its own)

    _wrap(planner, "partition", "partition")
    _wrap(planner, "rank_configs", "rank configs")
    _wrap(planner, "_first_within_workspace", "generate kernels (per config)")
    _wrap(planner, "compile_steps", "compile (CUDA)")
    _wrap(rplan, "plan_state", "memory plan (plan_state)")
    _wrap(og.FinalGraph, "at", "graph at the shape (FinalGraph.at)")
    _wrap(threads.ThreadState, "prepare", "bind (prepare)")
    try:
        import opgraph.runtime.dynamic as dynamic
        from opgraph.engines.base import Engine
        from opgraph.engines.triton import TritonEngine

        _wrap(dynamic, "schedule_at", "carry the bucket's plan (schedule_at)")
        _wrap(TritonEngine, "kernel_at", "kernels at the shape (kernel_at)")
        _wrap(Engine, "kernel_at", "kernels at the shape (kernel_at)")
    except ImportError:  # (before planning once per bucket)
        pass


def small(engines: list[str] | None) -> tuple[Any, list[Any]]:
    import numpy as np

    import opgraph as og
    from opgraph.testing import random_pack

    batch, seq = og.Dim("batch", 1, 16), og.Dim("seq", 1, 37)
    g = og.Graph("small", io_data_type=og.DataType.FLOAT, compute_data_type=og.DataType.FLOAT)
    x, r = g.tensor(dim=[batch, seq, 24], name="x"), g.tensor(dim=[batch, seq, 24], name="r")
    scale, bias = g.tensor(dim=[1, 1, 24], name="scale"), g.tensor(dim=[1, 1, 24], name="bias")
    y, mean, inv = g.layernorm("training", g.add(x, r), scale, bias, epsilon=1e-5)
    w = g.tensor(dim=[1, 24, 16], name="w")
    g.gelu(g.matmul(g.relu(y), w)).set_output(True).set_name("y")
    mean.set_output(True).set_name("mean")
    inv.set_output(True).set_name("inv")
    plan = g.build(device="cpu", engines=engines)
    rng = np.random.default_rng(0)

    def pack(b: int, s: int) -> Any:
        return random_pack(g.final.at({"batch": b, "seq": s}), rng)

    for b, s in [(3, 20), (3, 21)]:  # the bucket used
        plan.execute(pack(b, s))
    return plan, [pack(b, s) for b, s in [(4, 22), (5, 23), (6, 24), (7, 25), (9, 26), (10, 27), (11, 28)]]


def llama(engines: list[str] | None) -> tuple[Any, list[Any]]:
    import torch
    from torch.export import Dim

    import opgraph as og
    from tests.frontends.test_torch_import_dynamic import _tiny_lm

    model = _tiny_lm("llama").float()
    dims = {0: Dim("batch", min=1, max=4), 1: Dim("seq", min=17, max=64)}
    imported = og.from_torch(model, (torch.randint(0, 64, (2, 18)),), dynamic_shapes=(dims,))
    options = {} if engines is None else {"engines": engines}
    plan = imported.plan("cpu", **options)
    for b, s in [(2, 20), (3, 30)]:  # the bucket used
        imported.run(torch.randint(0, 64, (b, s)), device="cpu", **options)
    shapes = [(2, 21), (3, 22), (4, 23), (2, 31), (3, 33), (4, 35)]
    return plan, [imported.variant_pack(torch.randint(0, 64, shape)) for shape in shapes]


def measure(plan: Any, packs: list[Any]) -> dict[str, Any]:
    rows = []
    for pack in packs:
        TIMES.clear()
        t = time.perf_counter()
        plan.for_pack(pack)
        TIMES["= plan the shape (for_pack)"] = time.perf_counter() - t
        t = time.perf_counter()
        plan.bind(pack)
        TIMES["= first bind"] = time.perf_counter() - t
        total = TIMES["= plan the shape (for_pack)"] + TIMES["= first bind"]
        stages = dict(TIMES)
        t = time.perf_counter()
        plan.for_pack(pack)
        plan.bind(pack)
        rows.append((total, time.perf_counter() - t, stages))
    names = sorted({k for _, _, s in rows for k in s})
    return {
        "new_shape_ms": 1e3 * statistics.median(r[0] for r in rows),
        "seen_shape_ms": 1e3 * statistics.median(r[1] for r in rows),
        "stages_ms": {k: 1e3 * statistics.median(s.get(k, 0.0) for _, _, s in rows) for k in names},
        "steps": len(plan.max_plan.steps),
        "stats": dict(plan.stats),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--graph", choices=("small", "llama"), default="small")
    p.add_argument("--engines", default=None, help="comma-separated (default: the CPU's, the reference engine)")
    args = p.parse_args(argv)
    engines = args.engines.split(",") if args.engines else None
    _instrument()
    make: Callable[[list[str] | None], tuple[Any, list[Any]]] = small if args.graph == "small" else llama
    plan, packs = make(engines)
    out = measure(plan, packs)
    print(
        f"{args.graph} ({out['steps']} steps), engines {engines or 'default'}: new shape of a used bucket "
        f"{out['new_shape_ms']:.2f} ms (median of {len(packs)}), seen shape {out['seen_shape_ms']:.3f} ms"
    )
    for stage, ms in out["stages_ms"].items():
        print(f"    {stage:42s} {ms:8.2f} ms")
    print("    plan.stats:", out["stats"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
