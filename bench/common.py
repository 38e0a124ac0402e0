"""Helpers shared by the workload modules: tensors, the opgraph and peer implementations."""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping

import torch

import opgraph as og

from .harness import Session, Workload, relerr

DEV = "cuda"
TO_PROFILE: list[tuple[str, Any, Any]] = []


def print_profiles() -> None:
    """Each profiled plan's kernels with their device time per execute (PyTorch's profiler)."""
    for title, plan, pack in TO_PROFILE:
        print(f"== profile: {title}", flush=True)
        try:
            for name, count, us in plan.profile(pack)[:8]:
                print(f"      {name[:60]:60s} x{count}: {us:.1f} us", flush=True)
        except Exception as e:  # noqa: BLE001 - profiling is a diagnostic
            print(f"      (profile failed: {e})", flush=True)


def print_step_profile(title: str, plan: og.ExecutionPlan, pack: Mapping[Any, Any], top: int = 25) -> None:
    """Where an execute's time goes: device time per step (the slowest `top` with their ops) and
    summed per engine/template (OPGRAPH_BENCH_STEPS=1)."""
    rows = plan.profile_steps(pack)
    total_d, total_h = sum(r.device_us for r in rows), sum(r.host_us for r in rows)
    print(f"== steps: {title}: {len(rows)} steps, device {total_d:.0f} us, host {total_h:.0f} us", flush=True)
    by: dict[str, list[float]] = {}
    for r in rows:
        key = r.engine + (":" + r.template if r.template else "")
        acc = by.setdefault(key, [0, 0.0, 0.0])
        acc[0] += 1
        acc[1] += r.device_us
        acc[2] += r.host_us
    for key, (n, d, h) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        print(f"      {key:28s} x{n:4d}  device {d:9.1f} us  host {h:8.1f} us", flush=True)
    for r in sorted(rows, key=lambda r: -r.device_us)[:top]:
        ops = ", ".join(f"{n.kind}:{n.name}" for n in plan.steps[r.step].piece.nodes)
        print(f"      {r}  [{ops[:150]}]", flush=True)


def cl(t: torch.Tensor) -> torch.Tensor:
    return t.to(memory_format=torch.channels_last)


def randn(*shape: int, dtype=torch.float16, scale: float = 1.0, channels_last: bool = False) -> torch.Tensor:
    t = torch.randn(*shape, device=DEV, dtype=torch.float32).mul_(scale).to(dtype)
    return cl(t) if channels_last else t


def like(g: og.Graph, t: torch.Tensor, name: str) -> og.Tensor:
    return g.tensor_like(t, name=name)


def out_like(t: og.Tensor) -> torch.Tensor:
    """An empty device tensor with the output's dims, strides and type (after validation)."""
    return torch.empty_strided(t.dim, t.stride, dtype=t.data_type.to_torch(), device=DEV)


def run_opgraph(s: Session, w: Workload, g: og.Graph, pack: Mapping[Any, Any],
                checks: Mapping[og.Tensor, Callable[[], torch.Tensor]], *, autotune: bool = False,
                engines: list[str] | None = None) -> og.ExecutionPlan | None:
    """Build g (heuristics, and tuned when asked), check the outputs against float64 references,
    time plan.execute and a CUDA-graph replay of it."""
    plan = None
    for label, tuned in (("opgraph", False), ("opgraph tuned", True)):
        if tuned and not autotune:
            continue
        try:
            plan = g.build(device="cuda", autotune=tuned, **({"engines": engines} if engines else {}))
        except Exception as e:  # noqa: BLE001 - reported in the table
            s.run(w, label, lambda e=e: (_ for _ in ()).throw(e))
            continue
        steps = ", ".join(st.config.engine + ":" + str(st.config.knob("template", "")) for st in plan.steps)

        def check(plan=plan) -> float:
            plan.execute(pack)
            torch.cuda.synchronize()
            return max(relerr(pack[t], ref()) for t, ref in checks.items())

        s.run(w, label, lambda plan=plan: plan.execute(pack), check=check, note=f"[{len(plan.steps)} steps: {steps}]")
        if os.environ.get("OPGRAPH_BENCH_DESCRIBE"):  # the chosen configs and every alternative's time
            print("\n".join("      " + line for line in plan.describe().splitlines()), flush=True)
        if os.environ.get("OPGRAPH_BENCH_PROFILE"):
            # profiled at the end of the run: the profiler slows host launches while it is attached
            TO_PROFILE.append((f"{w.name} [{label}]", plan, pack))
        if os.environ.get("OPGRAPH_BENCH_GRAPH"):
            s.run(w, label + " (CUDA graph)", graphed(lambda plan=plan: plan.execute(pack)))
    return plan


def graphed(fn: Callable[[], Any]) -> Callable[[], Any]:
    """fn captured once in a CUDA graph; the returned callable replays it."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def run_compiled(s: Session, w: Workload, fn: Callable[..., Any], args: tuple, **kw: Any) -> None:
    if os.environ.get("OPGRAPH_BENCH_NO_COMPILE"):
        return

    def make():
        f = torch.compile(fn)
        f(*args)
        f(*args)
        return f

    try:
        f = make()
    except Exception as e:  # noqa: BLE001
        s.run(w, "torch.compile", lambda e=e: (_ for _ in ()).throw(e))
        return
    s.run(w, "torch.compile", lambda: f(*args), **kw)
