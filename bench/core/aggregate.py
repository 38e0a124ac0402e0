"""Repeat aggregation: several process-level repeats of a suite -> one table's numbers.

Every metric becomes the median of the repeats with its min and max (and the count: a repeat cut
short by the time limit leaves fewer). Errors take the worst repeat; verdicts are recomputed from
them with the tolerance rule. Ceilings are the repeats' medians. All repeats must come from one
machine (same device, driver and host): one machine per table.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

from . import tolerance as tol
from .floors import Ceilings, Floor, datasheet, math_us
from .records import METRICS, ImplResult, RunRecord

MACHINE_KEYS = ("device", "driver", "hostname")


class MixedMachinesError(ValueError):
    """Repeats of one table came from different machines."""


@dataclass(frozen=True)
class Stat:
    median: float
    lo: float
    hi: float
    n: int


def stat(values: Sequence[float | None]) -> Stat | None:
    vals = [float(v) for v in values if v is not None and v == v]
    if not vals:
        return None
    return Stat(statistics.median(vals), min(vals), max(vals), len(vals))


@dataclass
class AggImpl:
    impl: str
    role: str
    tuned: bool | None
    engine: str
    status: str
    error: str
    errors: dict[str, float | None]
    metrics: dict[str, Stat]
    methods: dict[str, str]
    notes: str
    verdict: tol.Verdict | None = None

    @property
    def passed(self) -> bool:
        return self.verdict is not None and self.verdict.passed


@dataclass
class AggWorkload:
    id: str
    title: str
    group: str
    kind: str
    outputs: list[tuple[str, str]]
    floor: Floor
    impls: list[AggImpl]
    tolerances: dict[str, tol.Tolerance]
    notes: str
    repeats: int
    error: str = ""
    timed: bool = True  # False: a correctness check, run in the first repeat only

    def impl(self, name: str) -> AggImpl | None:
        return next((i for i in self.impls if i.impl == name), None)


@dataclass
class Aggregate:
    meta: dict[str, Any]
    ceilings: Ceilings | None
    workloads: list[AggWorkload] = field(default_factory=list)
    repeats: int = 0


def same_machine(runs: Sequence[RunRecord]) -> None:
    for key in MACHINE_KEYS:
        seen = {str(r.meta.get(key)) for r in runs}
        if len(seen) > 1:
            raise MixedMachinesError(
                f"repeats differ in {key}: {sorted(seen)}; one machine per table (aggregate each machine's runs apart)"
            )


def verdicts(
    impls: Sequence[AggImpl], dtypes: dict[str, str], absolute: Sequence[str] = ()
) -> dict[str, tol.Tolerance]:
    """Apply the tolerance rule to aggregated implementations (sets each one's verdict)."""
    ran = {i.impl: i.errors for i in impls if i.errors}
    peers = {i.impl for i in impls if i.role == "peer"}
    tols = tol.tolerances(ran, peers, dtypes, frozenset(absolute))
    for i in impls:
        i.verdict = tol.judge(i.errors, tols) if i.errors else None
    return tols


def _merge_impl(rs: Sequence[ImplResult]) -> AggImpl:
    first = rs[0]
    errors: dict[str, float | None] = {}
    for r in rs:  # the worst repeat: None (not produced) over NaN over the largest error
        for name, e in r.combined_errors().items():
            prev = errors.get(name, e)
            if prev is None or e is None:
                errors[name] = None
            elif prev != prev or e != e:
                errors[name] = float("nan")
            else:
                errors[name] = max(prev, e)
    metrics = {}
    for m in METRICS:
        s = stat([r.metrics.get(m) for r in rs])
        if s is not None:
            metrics[m] = s
    engines = Counter(r.engine for r in rs if r.engine)
    statuses = Counter(r.status for r in rs)
    status = "ok" if statuses.get("ok") else statuses.most_common(1)[0][0]
    methods: dict[str, str] = {}
    for r in rs:
        methods.update(r.methods)
    return AggImpl(
        first.impl,
        first.role,
        first.tuned,
        " | ".join(engines) if len(engines) > 1 else next(iter(engines), ""),
        status,
        next((r.error for r in rs if r.error), ""),
        errors,
        metrics,
        methods,
        next((r.notes for r in rs if r.notes), ""),
    )


TIMES = ("device_us", "replay_us", "execute_us", "latency_us")


def least_us(floor: Floor, device: str) -> float:
    """No run of the workload can take less: its flops at the datasheet's dense peak (0: unknown)."""
    peak = (datasheet(device) or {}).get(floor.dtype)
    return math_us(floor.total_flops, peak)


def drop_impossible(impls: Sequence[AggImpl], floor: Floor, device: str) -> None:
    """A time of zero or below `least_us` measured something other than the work (a call that launched no
    kernel, work on a stream the events did not see): the number is dropped and the row says why."""
    least = least_us(floor, device)
    for i in impls:
        for m in TIMES:
            s = i.metrics.get(m)
            if s is not None and (s.median <= 0 or s.median < least):
                del i.metrics[m]
                why = (
                    f"below the math floor at the datasheet peak ({least:.1f} µs)" if s.median > 0 else "no time at all"
                )
                i.notes = (i.notes + f" {m} {s.median:.1f} µs dropped: {why}, so not a time of the work").strip()


def aggregate(runs: Sequence[RunRecord]) -> Aggregate:
    """One table's numbers from its repeats (any order)."""
    if not runs:
        raise ValueError("no runs to aggregate")
    same_machine(runs)
    runs = sorted(runs, key=lambda r: r.repeat)
    ceil = None
    cs = [r.ceilings for r in runs if r.ceilings is not None]
    if cs:
        kinds = sorted({k for c in cs for k in c.gemm_tflops})
        ceil = Ceilings(
            statistics.median(c.copy_gbps for c in cs),
            {k: statistics.median(c.gemm_tflops[k] for c in cs if k in c.gemm_tflops) for k in kinds},
            statistics.median(reads) if (reads := [c.read_gbps for c in cs if c.read_gbps is not None]) else None,
        )
    order: list[str] = []
    by_id: dict[str, list] = {}
    for r in runs:
        for w in r.workloads:
            if w.id not in by_id:
                order.append(w.id)
                by_id[w.id] = []
            by_id[w.id].append(w)
    out = Aggregate(dict(runs[0].meta), ceil, [], len(runs))
    out.meta["repeats"] = len(runs)
    out.meta["dates"] = sorted({str(r.meta.get("date")) for r in runs})
    for wid in order:
        ws = by_id[wid]
        names: list[str] = []
        per: dict[str, list[ImplResult]] = {}
        for w in ws:
            for i in w.impls:
                if i.impl not in per:
                    names.append(i.impl)
                    per[i.impl] = []
                per[i.impl].append(i)
        impls = [_merge_impl(per[n]) for n in names]
        w0 = ws[-1]
        drop_impossible(impls, w0.floor, str(out.meta.get("device", "")))
        dtypes = dict(w0.outputs)
        # an output is absolute where any repeat found its reference zero (a repeat that failed before its
        # references has none)
        tols = verdicts(impls, dtypes, sorted({o for w in ws for o in w.absolute}))
        out.workloads.append(
            AggWorkload(
                w0.id,
                w0.title,
                w0.group,
                w0.kind,
                list(w0.outputs),
                w0.floor,
                impls,
                tols,
                w0.notes,
                len(ws),
                next((w.error for w in ws if w.error), ""),
                w0.timed,
            )
        )
    return out
