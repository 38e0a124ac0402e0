"""Running one workload: each implementation set up in turn, checked, then timed in its modes.

For each implementation: setup (timed apart: setup_s) -> execute-mode check -> execute_us and
latency_us -> CUDA-graph mode: one call captured by the suite's helper, checked on replay, replay_us,
then device_us from a graph of K calls (or the profiler's kernel sum where capture is impossible).
An implementation whose outputs are garbage (non-finite, or relative error above 0.5) is not timed;
one that is merely outside the tolerance is timed and flagged. The tolerance rule is applied once all
implementations ran.
"""

from __future__ import annotations

import dataclasses
import gc
import time
import traceback
from typing import Any, Sequence

from . import check, measure
from .case import Case, Ctx, Impl, Runner
from .core import tolerance as tol
from .core.records import ImplResult, WorkloadResult
from .core.registry import WorkloadSpec


def log(msg: str) -> None:
    print(msg, flush=True)


def _err(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"


def run_impl(ctx: Ctx, case: Case, impl: Impl, refs: Sequence[Any], budget: measure.Budget) -> ImplResult:
    res = ImplResult(impl.name, impl.role, impl.tuned)
    missing = sorted(impl.needs - ctx.features)
    if missing:
        res.status, res.error = "unavailable", f"needs {', '.join(missing)} (not on this machine / run)"
        return res
    if ctx.out_of_time():
        res.status, res.error = "skipped", "time limit reached"
        return res
    cuda = ctx.cuda
    runner: Runner | None = None
    try:
        t0 = time.perf_counter()
        runner = impl.setup()
        measure.sync(cuda)
        res.metrics["setup_s"] = time.perf_counter() - t0
        res.engine, res.notes = runner.engine, runner.notes
        if case.host_only:
            runner.host_only = True
        if runner.measured is not None:  # measured by its setup (a fresh process): nothing to time here
            res.metrics.update(runner.measured)
            res.errors = dict(runner.errors or {})
            return res
        _execute_mode(ctx, case, runner, res, refs, budget)
        if not ctx.timing:
            pass
        elif cuda and not runner.host_only:
            _graph_mode(ctx, case, runner, res, refs, budget)
        elif not cuda and not runner.host_only and res.metrics.get("execute_us") is not None:
            est = res.metrics["execute_us"]
            res.metrics["device_us"], res.methods["device_us"] = measure.wall_device_us(runner.call, est, budget)
            res.metrics["replay_us"] = res.metrics["execute_us"]
            res.methods["replay_us"] = "CPU wall clock (dry run)"
        if runner.after is not None and ctx.timing and res.status == "ok":
            res.notes = (res.notes + " " + _after_note(runner.after)).strip()
    except Exception as e:  # noqa: BLE001 - a failing implementation is a row, not the end of the run
        traceback.print_exc(limit=4)
        res.status, res.error = "error", _err(e)
    finally:
        del runner
        gc.collect()
        if cuda:
            import torch

            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    return res


def _after_note(after: Any) -> str:
    """The runner's note made after its times (outside every time and setup_s); its failure is a note."""
    try:
        return str(after())
    except Exception as e:  # noqa: BLE001 - a note, never the row's failure
        return f"(step profile failed: {_err(e)})"


def _execute_mode(
    ctx: Ctx, case: Case, runner: Runner, res: ImplResult, refs: Sequence[Any], budget: measure.Budget
) -> None:
    cuda = ctx.cuda
    res.errors = check.check_execute(runner, refs, case.outputs, ctx.device)
    if not ctx.timing:
        return
    if not tol.sane(res.errors, case.sane_limit):
        res.notes = (res.notes + " not timed: outputs missing, non-finite or far off").strip()
        return
    est = measure.estimate_us(runner.call, cuda)
    if runner.host_only:
        res.metrics["host_us"] = measure.host_us(runner.call, budget, cuda)
    if runner.graph_native:  # its plain calls replay its own CUDA graphs: CUDA-graph-mode numbers
        res.graph_errors = dict(res.errors)
        res.metrics["replay_us"] = measure.back_to_back_us(runner.call, est, budget, cuda)
        if cuda:
            _kernel_sum(res, runner.call, "profiler kernel sum")
        return
    res.metrics["execute_us"] = measure.back_to_back_us(runner.call, est, budget, cuda)
    res.metrics["latency_us"] = measure.latency_us(runner.call, budget, cuda)


def _kernel_sum(res: ImplResult, call: Any, how: str) -> None:
    """Device time from the profiler; none where it saw no device work at all (a call that launches nothing
    computes nothing: its outputs were folded into constants, or its work ran where the profiler cannot see)."""
    us = measure.kernel_sum_us(call)
    if us > 0:
        res.metrics["device_us"], res.methods["device_us"] = us, how
    else:
        res.notes = (res.notes + " device time not reported: the profiler saw no kernel in the call").strip()


def _graph_mode(
    ctx: Ctx, case: Case, runner: Runner, res: ImplResult, refs: Sequence[Any], budget: measure.Budget
) -> None:
    if runner.graph_native or not tol.sane(res.errors, case.sane_limit):
        return
    est = res.metrics.get("execute_us") or measure.estimate_us(runner.call, True)
    if not runner.capturable:
        _kernel_sum(res, runner.call, "profiler kernel sum (not capturable)")
        return
    try:
        cap = measure.capture(runner.call, 1)
    except Exception as e:  # noqa: BLE001 - say why, and measure device time another way
        import torch

        torch.cuda.synchronize()
        res.notes = (res.notes + f" CUDA graph capture failed: {_err(e)}").strip()
        _kernel_sum(res, runner.call, "profiler kernel sum (capture failed)")
        return
    res.graph_errors = check.check_graph(runner, cap.ret, cap.graph.replay, refs, case.outputs)
    if not tol.sane(res.graph_errors, case.sane_limit):
        res.notes = (res.notes + " CUDA-graph replay not timed: outputs wrong").strip()
        return
    res.metrics["replay_us"] = measure.back_to_back_us(cap.graph.replay, est, budget, True)
    del cap
    res.metrics["device_us"], res.methods["device_us"] = measure.device_us(
        runner.call, est, budget, cold_l2=ctx.cold_l2, flush_bytes=l2_bytes() if ctx.cold_l2 else 0
    )


def l2_bytes() -> int:
    """Twice the device's L2: what a flush writes."""
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return 2 * int(getattr(props, "L2_cache_size", 50 << 20))


def run_workload(ctx: Ctx, spec: WorkloadSpec, budget: measure.Budget) -> WorkloadResult:
    if not spec.timed:  # a correctness check: every implementation set up and checked, none timed
        ctx = dataclasses.replace(ctx, timing=False)
    out = WorkloadResult(spec.id, spec.title, spec.group, spec.kind, timed=spec.timed)
    t0 = time.perf_counter()
    missing = sorted(spec.needs - ctx.features)
    if missing:
        out.error = f"skipped: needs {', '.join(missing)}"
        log(f"== {spec.id}: {out.error}")
        return out
    log(f"== {spec.id}: {spec.title}")
    try:
        import torch

        torch.manual_seed(ctx.seed)
        ctx.workload = spec.id
        if "compile" in ctx.features:
            torch._dynamo.reset()
        case = spec.make(ctx)
        out.outputs = [(o.name, o.dtype) for o in case.outputs]
        out.floor, out.notes = case.floor, case.notes
        refs = [r.detach().to(torch.float64) for r in case.reference()]
        if len(refs) != len(case.outputs):
            raise ValueError(f"{len(refs)} references for {len(case.outputs)} outputs")
        out.absolute = [o.name for o, r in zip(case.outputs, refs) if check.zero_reference(r)]
        for impl in case.impls:
            r = run_impl(ctx, case, impl, refs, budget)
            out.impls.append(r)
            m = r.metrics
            log(
                f"   {impl.name:30s} {r.status:6s} "
                + " ".join(
                    f"{k}={m[k]:.1f}"
                    for k in ("device_us", "replay_us", "execute_us", "latency_us", "host_us", "setup_s")
                    if k in m
                )
                + f"  err={_fmt_errs(r.errors)}  [{r.engine}] {r.error} {r.notes}"
            )
        del case, refs
    except Exception as e:  # noqa: BLE001 - a broken workload is reported; the suite goes on
        traceback.print_exc(limit=6)
        out.error = _err(e)
    _apply_tolerance(out)
    out.elapsed_s = time.perf_counter() - t0
    return out


def _fmt_errs(errs: dict[str, float | None]) -> str:
    if not errs:
        return "-"
    worst = max(errs.items(), key=lambda kv: -1 if kv[1] is None else (float("inf") if kv[1] != kv[1] else kv[1]))
    return f"{worst[1]:.2e}({worst[0]})" if worst[1] is not None else f"missing({worst[0]})"


def _apply_tolerance(w: WorkloadResult) -> None:
    errors = {i.impl: i.combined_errors() for i in w.impls if i.errors}
    peers = {i.impl for i in w.impls if i.role == "peer"}
    tols = tol.tolerances(errors, peers, dict(w.outputs), frozenset(w.absolute))
    w.tolerances = {k: {"value": v.value, "basis": v.basis} for k, v in tols.items()}
    for i in w.impls:
        if i.impl in errors:
            v = tol.judge(errors[i.impl], tols)
            i.verdict = {
                "passed": v.passed,
                "worst_output": v.worst_output,
                "worst_ratio": v.worst_ratio,
                "reason": v.reason,
            }
