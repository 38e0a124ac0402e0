"""opgraph's implementations of a graph workload, each built on its own with its own output buffers:

    opgraph          g.build() with the default engines (triton, library, cudnn, torch): the heuristic plan
    opgraph tuned    g.build(autotune=True)
    generated        g.build(engines=["triton"]): generated kernels only (heuristic)
    generated tuned  g.build(engines=["triton"], autotune=True)

A "generated" build that Triton alone cannot cover is retried with ["triton", "torch"] and its engine
column says so. The engine column of every row counts the plan's steps by engine (and template).
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any, Callable, Mapping, Sequence

from .case import Ctx, Impl, Runner

VARIANTS: tuple[tuple[str, list[str] | None, bool], ...] = (
    ("opgraph", None, False),
    ("opgraph tuned", None, True),
    ("generated", ["triton"], False),
    ("generated tuned", ["triton"], True),
)


def engines_of(plan: Any) -> str:
    """'cudnn', 'triton:conv_fprop', or '12 steps: triton 9, cudnn 2, torch 1'."""
    labels = [
        s.config.engine + (f":{s.config.knob('template', '')}" if s.config.knob("template", "") else "")
        for s in plan.steps
    ]
    if len(labels) == 1:
        return labels[0]
    by_engine = Counter(s.config.engine for s in plan.steps)
    return f"{len(labels)} steps: " + ", ".join(f"{e} {n}" for e, n in by_engine.most_common())


def tuning_note(plan: Any, max_steps: int = 2) -> str:
    """For a tuned plan of at most `max_steps` steps: what the tuner measured, the chosen config and every
    timed alternative (µs, as the tuner timed them), so a table can show where the tuner's measurement and
    the suite's disagree (bench v2 found tuned generated-attention plans 20-30% slower than the
    heuristic's, whose config is among the candidates)."""
    steps = [s for s in plan.steps if s.config.measured_us is not None]
    if not steps or len(plan.steps) > max_steps:
        return ""

    def short(c: Any) -> str:
        knobs = ",".join(f"{k}={v}" for k, v in c.knobs if k not in ("template", "name"))
        return f"{c.engine}[{knobs}] {c.measured_us:.1f}" if c.measured_us is not None else f"{c.engine}[{knobs}] -"

    return "; ".join(
        f"tuner step {s.index}: chose {short(s.config)} µs; others " + ", ".join(short(a) for a in s.alternatives)
        for s in steps
    )


def by_engine(rows: Sequence[Any]) -> list[tuple[str, int, float, float]]:
    """profile_steps' rows summed per engine (and template): (key, steps, device µs, host µs), the most
    device time first."""
    by: dict[str, list[float]] = {}
    for r in rows:
        acc = by.setdefault(r.engine + (":" + r.template if r.template else ""), [0, 0.0, 0.0])
        acc[0] += 1
        acc[1] += r.device_us
        acc[2] += r.host_us
    return sorted(((k, int(n), d, h) for k, (n, d, h) in by.items()), key=lambda t: -t[2])


def steps_note(plan: Any, pack: Mapping[Any, Any], slowest: int = 4) -> str:
    """Where a plan of many steps spends its device time, each step run alone (plan.profile_steps, after
    every check and time of the row): µs per engine (and template) with the step count, and the slowest
    steps with their ops. Which engine's steps to blame for a whole network's time."""
    rows = plan.profile_steps(pack, repeat=10 if plan.device.is_cuda else 2)
    parts = [f"{key} x{n} {d:,.0f}" for key, n, d, _ in by_engine(rows)]
    top = []
    for r in sorted(rows, key=lambda r: -r.device_us)[:slowest]:
        nodes = plan.steps[r.step].piece.nodes
        kinds = "+".join(n.kind if n.kind != "pointwise" else str(n.op.mode.value) for n in nodes[:5])
        top.append(f"{r.step} {r.engine} {kinds}{'+…' if len(nodes) > 5 else ''} {r.device_us:,.1f}")
    return (
        f"steps alone, device µs: {sum(r.device_us for r in rows):,.0f} in all; "
        + ", ".join(parts)
        + "; slowest: "
        + ", ".join(top)
    )


def step_profile(ctx: Ctx, plan: Any, pack: Mapping[Any, Any]) -> Callable[[], str] | None:
    """A Runner's `after` for a plan of many steps on the GPU (a network, a training step): its
    steps_note, taken once every check and time of the row is done."""
    return (lambda: steps_note(plan, pack)) if ctx.cuda and len(plan.steps) > 2 else None


def diagnose(title: str, plan: Any, pack: Mapping[Any, Any]) -> None:
    """--describe: the plan's configs (and tuned alternatives' times); --steps: device and host time per
    step and per engine/template (plan.profile_steps), the slowest steps with their ops."""
    if os.environ.get("OPGRAPH_BENCH_DESCRIBE"):
        print(f"== describe: {title}\n" + "\n".join("      " + ln for ln in plan.describe().splitlines()), flush=True)
    if os.environ.get("OPGRAPH_BENCH_STEPS") and plan.device.is_cuda:
        rows = plan.profile_steps(pack)
        print(
            f"== steps: {title}: {len(rows)} steps, device {sum(r.device_us for r in rows):.0f} us, host "
            f"{sum(r.host_us for r in rows):.0f} us",
            flush=True,
        )
        for key, n, d, h in by_engine(rows):
            print(f"      {key:28s} x{n:4d}  device {d:9.1f} us  host {h:8.1f} us", flush=True)
        for r in sorted(rows, key=lambda r: -r.device_us)[:15]:
            ops = ", ".join(f"{n.kind}:{n.name}" for n in plan.steps[r.step].piece.nodes)
            print(f"      {r}  [{ops[:150]}]", flush=True)


def out_like(desc: Any, device: str) -> Any:
    import torch

    return torch.empty_strided(desc.dim, desc.stride, dtype=desc.data_type.to_torch(), device=device)


def build(graph: Any, ctx: Ctx, engines: list[str] | None, tuned: bool, **kw: Any) -> tuple[Any, str]:
    """The plan and a note (non-empty when the generated-only build fell back to the torch engine)."""
    from opgraph.core.errors import GraphError

    device = "cuda" if ctx.cuda else "cpu"
    opts = dict(kw)
    if engines is not None:
        opts["engines"] = engines
    try:
        return graph.build(device=device, autotune=tuned, **opts), ""
    except GraphError as e:
        if engines != ["triton"]:
            raise
        opts["engines"] = ["triton", "torch"]
        return graph.build(
            device=device, autotune=tuned, **opts
        ), f"triton alone cannot build it ({type(e).__name__}: {str(e)[:120]}); with the torch engine"


def imported_graph(module: Any, args: Sequence[Any]) -> Callable[[], tuple[Any, Mapping[Any, Any], Sequence[Any]]]:
    """A `graph_impls` maker for a PyTorch module: `opgraph.from_torch(module, args)`'s graph, its
    inputs bound to `args` and its outputs."""

    def make() -> tuple[Any, Mapping[Any, Any], Sequence[Any]]:
        import opgraph as og

        imported = og.from_torch(module, tuple(args))
        pack = imported.variant_pack(*args)
        final = imported.graph.final
        return imported.graph, {k: v for k, v in pack.items() if k not in final.outputs}, imported.outputs

    return make


def graph_impls(
    ctx: Ctx,
    make: Callable[[], tuple[Any, Mapping[Any, Any], Sequence[Any]]],
    *,
    tune: bool | None = None,
    **build_kw: Any,
) -> list[Impl]:
    """The four builds of a graph. `make()` returns (graph, {input handle: tensor}, [output handles in
    the Case's order]); it is called once, the graph shared, each build given fresh output buffers."""
    state: dict[str, Any] = {}

    def made() -> tuple[Any, Mapping[Any, Any], Sequence[Any]]:
        if "g" not in state:
            state["g"] = make()
        return state["g"]

    tune = ctx.tune if tune is None else tune
    out = []
    for name, engines, tuned in VARIANTS:
        if tuned and not tune:
            continue

        def setup(engines: list[str] | None = engines, tuned: bool = tuned) -> Runner:
            g, inputs, outputs = made()
            plan, note = build(g, ctx, engines, tuned, **build_kw)
            pack = dict(inputs)
            final = g.final
            for o in outputs:
                pack[o] = out_like(final.tensors[o.uid], ctx.device)
            bufs = [pack[o] for o in outputs]
            diagnose(f"{g.name} [{'generated' if engines else 'opgraph'}{' tuned' if tuned else ''}]", plan, pack)
            if tuned:
                note = "; ".join(x for x in (note, tuning_note(plan)) if x)
            return Runner(
                call=lambda: plan.execute(pack),
                outputs=bufs,
                engine=engines_of(plan),
                notes=note,
                keep=plan,
                after=step_profile(ctx, plan, pack),
            )

        out.append(Impl(name, setup, role="ours", tuned=tuned))
    return out
