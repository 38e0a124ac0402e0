"""A lean A/B benchmark of opgraph's own plans between two code versions (issue 37: "a kernel-group
benchmark run shows no row slower than noise").

    python scripts/ab_kernels.py --old .old --new . --out $OUT [--suite ...] [--budget 270]
    python scripts/ab_kernels.py --old /tmp/old --new . --dry-run --suite conv.r50_3x3_c64.fp16   # CPU wiring

`--old` and `--new` are package roots (folders holding `opgraph/` and `bench/`, e.g. a `git archive` export).
Each version runs in worker processes of its own with PYTHONPATH set to its root, so `import opgraph` and
`import bench` come from that version: a version's cases are built by its own bench code, at full scale.
Per workload a worker builds only opgraph's implementations of the chosen variants (default `opgraph` and
`generated`, the heuristic builds; no tuned builds, no peers), checks every output against the case's
float64 reference with bench's rule (no peers: each output's type's fallback tolerance, as bench gives an
output no peer computes), captures K calls in one CUDA graph with bench.measure's helper and keeps it; it
records each plan's engines column (bench.ours.engines_of) and per step the engine, knobs, ops and a digest
of its compiled kernels (the compile specs' keys: the generated module up to names, constexprs, options,
target, Triton version).

Setups of both versions run at once (`--workers` processes per version, each given the next workload as
it frees up: preferably one the other version has set up already, whose kernels are then in the shared
caches; opgraph's builds compile in parallel as g.build does by default); timing starts once every
setup is done, one sample at a time on an otherwise idle GPU: per row (workload, variant) the versions are
interleaved old, new, new, old (the next pass new, old, old, new), `--passes` passes; a sample is the
median of `--rounds` replays of the row's graph, each behind bench's spin kernel (no host time counts),
divided by K. Both versions share the compile caches (OPGRAPH_CACHE_DIR and TRITON_CACHE_DIR: one value for
both; `--cache DIR` sets both under DIR), so a kernel both versions generate compiles once.

Noise of a row: the larger relative spread, (max - min) / median, of the two versions' samples, at least
`--noise-floor` and at least the A/A spread: the largest |new/old - 1| among the rows that run the same code
in both versions (same configs and kernels, or library kernels only), the variance between setups that a
row's own repeats cannot see. Verdict: SLOWER when new/old > 1 + noise, faster when < 1 - noise, else same. Written:
$OUT/ab_kernels.json and .md (per row old µs, new µs, new/old, noise, verdict, whether configs and kernels
are the same, engines, checks; a header with the device, versions and totals). Exit status 1 when a row
is a regression to look at: SLOWER with different configs or kernels, or new fails its check (or is not
timed) where old passed. Within `--budget`: no setup starts after budget - timing reserve - 20 s, a
worker still setting up at budget - reserve is killed (what finished is kept), timing stops 5 s before
the budget.

`--dry-run`: tiny shapes on the CPU (bench's --dry-run scale), generated kernels under TRITON_INTERPRET=1,
wall-clock times (meaningless) instead of CUDA graphs: the wiring, checks and configs only.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import hashlib
import json
import math
import os
import queue
import statistics
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from typing import Any

DEFAULT_SUITE = ("conv-fp16", "conv-more-fp16", "conv-bwd-fp16", "matmul", "memory", "attention-fwd", "attention-bwd")
DEFAULT_VARIANTS = ("opgraph", "generated")
NOISE_FLOOR = 0.01  # relative: below this a difference is noise however tight the repeats
DISPATCH_MARGIN_S = 20.0  # no setup starts this long before the setup phase's end
END_MARGIN_S = 5.0  # the timing phase ends this long before the budget (writing the results)
HELLO_TIMEOUT_S = 180.0
TIME_TIMEOUT_S = 120.0


# -- pure logic: the verdict, the rows, the tables (tests/bench/test_ab_kernels.py) --------------------------
def spread(samples: Sequence[float]) -> float | None:
    """(max - min) / median of the samples; None for fewer than two."""
    if len(samples) < 2:
        return None
    mid = statistics.median(samples)
    return (max(samples) - min(samples)) / mid if mid > 0 else None


def compare(old: Sequence[float], new: Sequence[float], floor: float = NOISE_FLOOR) -> dict[str, Any]:
    """old µs, new µs (medians), new/old, noise (the larger spread of the two, at least `floor`) and the
    verdict: "SLOWER" beyond noise, "faster" beyond noise, "same", or "-" when a side has no sample."""
    if not old or not new:
        return {
            "old_us": statistics.median(old) if old else None,
            "new_us": statistics.median(new) if new else None,
            "ratio": None,
            "noise": None,
            "verdict": "-",
        }
    o, n = statistics.median(old), statistics.median(new)
    noise = max([floor] + [s for s in (spread(old), spread(new)) if s is not None])
    ratio = n / o if o > 0 else math.inf
    verdict = "SLOWER" if ratio > 1 + noise else "faster" if ratio < 1 - noise else "same"
    return {"old_us": o, "new_us": n, "ratio": ratio, "noise": noise, "verdict": verdict}


def _configs(steps: Sequence[dict[str, Any]]) -> list[Any]:
    return [[s.get("engine"), s.get("knobs")] for s in steps]


def same_steps(old: Sequence[dict[str, Any]] | None, new: Sequence[dict[str, Any]] | None) -> tuple[str, str]:
    """("same" | "differ" | "-", same for kernels): the configs (engine and knobs per step) and the
    compiled kernels (digests per step; "-" where neither plan has a generated kernel)."""
    if old is None or new is None:
        return "-", "-"
    configs = "same" if _configs(old) == _configs(new) else "differ"
    ko, kn = [s.get("kernel", "") for s in old], [s.get("kernel", "") for s in new]
    kernels = "-" if not any(ko) and not any(kn) else "same" if ko == kn else "differ"
    return configs, kernels


def _passed(side: dict[str, Any] | None) -> bool | None:
    check = (side or {}).get("check")
    return None if not check else bool(check.get("passed"))


def _timed(side: dict[str, Any] | None) -> bool:
    return bool(side) and side.get("status") == "ok"


def make_row(
    wid: str,
    title: str,
    variant: str,
    old: dict[str, Any] | None,
    new: dict[str, Any] | None,
    old_samples: Sequence[float],
    new_samples: Sequence[float],
    floor: float = NOISE_FLOOR,
) -> dict[str, Any]:
    """One row of the tables: the comparison, whether configs and kernels are the same, and whether it is
    a regression to look at (with why)."""
    row: dict[str, Any] = {
        "id": wid,
        "title": title,
        "variant": variant,
        "old": old,
        "new": new,
        "old_samples": list(old_samples),
        "new_samples": list(new_samples),
    }
    row.update(compare(old_samples, new_samples, floor))
    row["configs"], row["kernels"] = same_steps((old or {}).get("steps"), (new or {}).get("steps"))
    why = []
    if row["verdict"] == "SLOWER" and "differ" in (row["configs"], row["kernels"]):
        why.append(
            f"slower beyond noise ({row['ratio']:.3f} > 1 + {row['noise']:.3f}) and its "
            + " and ".join(k for k in ("configs", "kernels") if row[k] == "differ")
            + " differ"
        )
    if _passed(old) and _passed(new) is False:
        why.append("new fails its check where old passes: " + str((new or {}).get("check", {}).get("reason", "")))
    if _timed(old) and not _timed(new):
        why.append(f"old timed, new not: {(new or {}).get('status', 'missing')} {(new or {}).get('error', '')}".strip())
    row["regression"] = bool(why)
    row["why"] = "; ".join(why)
    return row


def aa_spread(rows: Sequence[dict[str, Any]]) -> float:
    """The A/A spread: the largest |new/old - 1| of the rows that run the very same code in both versions
    (same configs, and the same compiled kernels or none generated: cuDNN's, cuBLAS's). What the timing
    procedure's own between-setup variance is, which a row's repeats cannot see (0 without such rows)."""
    same = [
        abs(r["ratio"] - 1.0)
        for r in rows
        if r.get("ratio") is not None and r["configs"] == "same" and r["kernels"] in ("same", "-")
    ]
    return max(same, default=0.0)


def totals(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per variant (then all): rows timed in both versions, their sums, the geometric mean of new/old,
    the verdict counts, rows whose configs / kernels differ and regressions."""
    out = []
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    for name, sel in [(v, [r for r in rows if r["variant"] == v]) for v in variants] + [("all", list(rows))]:
        both = [r for r in sel if r["ratio"] is not None and math.isfinite(r["ratio"])]
        out.append(
            {
                "variant": name,
                "rows": len(sel),
                "timed": len(both),
                "old_us": sum(r["old_us"] for r in both),
                "new_us": sum(r["new_us"] for r in both),
                "geomean": math.exp(statistics.fmean(math.log(r["ratio"]) for r in both)) if both else None,
                **{v: sum(r["verdict"] == v for r in sel) for v in ("same", "faster", "SLOWER")},
                "configs_differ": sum(r["configs"] == "differ" for r in sel),
                "kernels_differ": sum(r["kernels"] == "differ" for r in sel),
                "regressions": sum(bool(r["regression"]) for r in sel),
            }
        )
    return out


def exit_status(rows: Sequence[dict[str, Any]]) -> int:
    return 1 if any(r["regression"] for r in rows) else 0


def _us(x: float | None) -> str:
    return "-" if x is None else f"{x:,.1f}" if x < 1000 else f"{x:,.0f}"


def _check_cell(side: dict[str, Any] | None) -> str:
    if not side:
        return "-"
    check = side.get("check")
    if not check:
        return side.get("status", "-")
    ratio = check.get("worst_ratio")
    text = "-" if ratio is None else "inf" if not math.isfinite(ratio) else f"{ratio:.2f}"
    return ("✓ " if check.get("passed") else "✗ ") + text


def _engines(row: dict[str, Any]) -> str:
    o, n = (row["old"] or {}).get("engines", "-"), (row["new"] or {}).get("engines", "-")
    return o if o == n else f"{o} → {n}"


def _step_text(s: dict[str, Any]) -> str:
    """engine:template[knob=value,...]"""
    knobs = [(k, v) for k, v in s.get("knobs", [])]
    template = dict(knobs).get("template")
    rest = ",".join(f"{k}={v}" for k, v in knobs if k not in ("template", "name"))
    return f"{s.get('engine')}" + (f":{template}" if template else "") + (f"[{rest}]" if rest else "")


def step_differences(row: dict[str, Any]) -> list[str]:
    """The steps whose config or kernel differ, old → new."""
    old, new = (row["old"] or {}).get("steps") or [], (row["new"] or {}).get("steps") or []
    out = []
    if len(old) != len(new):
        out.append(f"{len(old)} steps → {len(new)} steps")
    for i, (a, b) in enumerate(zip(old, new)):
        if _configs([a]) != _configs([b]):
            out.append(f"step {i} ({a.get('ops', '')}): {_step_text(a)} → {_step_text(b)}")
        elif a.get("kernel", "") != b.get("kernel", ""):
            out.append(
                f"step {i} ({a.get('ops', '')}): same config {_step_text(a)}, kernel {a.get('kernel') or '-'} "
                f"→ {b.get('kernel') or '-'}"
            )
    return out


def render(meta: dict[str, Any], rows: Sequence[dict[str, Any]]) -> str:
    """The markdown report."""
    old, new = meta.get("old", {}), meta.get("new", {})
    env = new.get("env") or old.get("env") or {}
    lines = [f"# opgraph A/B: {old.get('label', 'old')} → {new.get('label', 'new')}", ""]
    lines.append(
        f"{env.get('date', '?')}, {env.get('device', '?')} (driver {env.get('driver', '?')}); "
        f"{env.get('cpu', '?')}, {env.get('cpu_count', '?')} cores; torch {env.get('torch', '?')}, "
        f"Triton {env.get('triton', '?')}, cuDNN {env.get('cudnn', '?')}, cuDNN frontend "
        f"{env.get('cudnn_frontend') or 'absent (no cudnn engine: carry .whl)'}."
    )
    lines.append(f"Command: `{meta.get('command', '')}`")
    lines.append(
        f"Old: {old.get('label', '?')} ({old.get('root', '?')}); new: {new.get('label', '?')} "
        f"({new.get('root', '?')}). Suite: {' '.join(meta.get('suite', []))}; variants: "
        f"{', '.join(meta.get('variants', []))} (heuristic builds; no peers)."
    )
    how = (
        f"CPU wall clock of back-to-back calls (dry run), a sample = the median of {meta.get('rounds')} rounds"
        if meta.get("dry_run")
        else "CUDA-graph device time "
        "(bench.measure.capture: K calls in one graph, each replay behind a spin kernel), a sample = the median "
        f"of {meta.get('rounds')} replays / K"
    )
    lines.append(
        f"Timing: {how}; versions interleaved old,new,new,old per row (the next pass new,old,old,new), "
        f"{meta.get('passes')} passes. Noise = the larger "
        f"(max-min)/median of the two versions' samples, at least {meta.get('noise_floor', 0):.1%} and at least "
        f"the A/A spread, {meta.get('aa_spread', 0):.1%} (the largest |new/old - 1| of the rows running the same "
        "code in both versions: cuDNN's kernels, unchanged generated ones). "
        "Check: bench's rule without peers: each output's type's fallback tolerance "
        f"({meta.get('fallback', '')}); the cell is ✓/✗ and the worst error / tolerance."
    )
    lines.append(
        f"Caches (both versions): OPGRAPH_CACHE_DIR={meta.get('cache', {}).get('opgraph')}, "
        f"TRITON_CACHE_DIR={meta.get('cache', {}).get('triton')}. {meta.get('workers')} worker(s) per "
        f"version. Wall: setup {meta.get('setup_s', 0):.0f} s, timing {meta.get('timing_s', 0):.0f} s, "
        f"total {meta.get('wall_s', 0):.0f} s of a {meta.get('budget', 0):.0f}-s budget"
        + (f"; {meta['cut']}" if meta.get("cut") else "")
        + "."
    )
    if meta.get("dry_run"):
        lines.append("**Dry run** (CPU, tiny shapes, interpreter): times are wall clock and meaningless.")
    lines += [
        "",
        "## Totals",
        "",
        "| variant | rows | timed in both | Σ old µs | Σ new µs | Σ new / Σ old | geomean "
        "new/old | same | faster | SLOWER | configs differ | kernels differ | regressions |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for t in totals(rows):
        ratio = f"{t['new_us'] / t['old_us']:.3f}" if t["old_us"] else "-"
        geo = f"{t['geomean']:.3f}" if t["geomean"] is not None else "-"
        lines.append(
            f"| {t['variant']} | {t['rows']} | {t['timed']} | {_us(t['old_us'])} | {_us(t['new_us'])} | "
            f"{ratio} | {geo} | {t['same']} | {t['faster']} | {t['SLOWER']} | {t['configs_differ']} | "
            f"{t['kernels_differ']} | {t['regressions']} |"
        )
    regress = [r for r in rows if r["regression"]]
    lines += ["", f"**Regressions to look at** (exit status {exit_status(rows)}): " + ("none." if not regress else "")]
    lines += [f"- {r['id']} [{r['variant']}]: {r['why']}" for r in regress]
    lines += [
        "",
        "## Rows",
        "",
        "| workload | variant | old µs | new µs | new/old | noise ± | verdict | configs | "
        "kernels | engines (old → new) | check old | check new |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = f"{r['ratio']:.3f}" if r["ratio"] is not None else "-"
        noise = f"{r['noise']:.1%}" if r["noise"] is not None else "-"
        verdict = f"**{r['verdict']}**" if r["verdict"] == "SLOWER" else r["verdict"]
        lines.append(
            f"| {r['id']} | {r['variant']} | {_us(r['old_us'])} | {_us(r['new_us'])} | {ratio} | {noise} | "
            f"{verdict} | {r['configs']} | {r['kernels']} | {_engines(r)} | {_check_cell(r['old'])} | "
            f"{_check_cell(r['new'])} |"
        )
    diffs = [(r, step_differences(r)) for r in rows if "differ" in (r["configs"], r["kernels"])]
    if diffs:
        lines += ["", "## Steps that differ (old → new)", ""]
        for r, d in diffs:
            lines.append(f"- {r['id']} [{r['variant']}]: " + "; ".join(d))
    missing = [r for r in rows if r["verdict"] == "-"]
    if missing:
        lines += ["", "## Not compared", ""]
        for r in missing:
            parts = []
            for name in ("old", "new"):
                side = r[name] or {}
                if not _timed(side) or not r[f"{name}_samples"]:
                    parts.append(
                        f"{name}: {side.get('status', 'not set up')} {side.get('error', '')}".strip()
                        + ("" if not _timed(side) else " (no sample: time ran out)")
                    )
            lines.append(f"- {r['id']} [{r['variant']}]: " + "; ".join(parts))
    return "\n".join(lines) + "\n"


# -- the worker: one version (PYTHONPATH = its root), commands on stdin, answers on its own stdout -------------
def _jsonable(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v  # (json writes NaN and Infinity, and reads them back)
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if hasattr(v, "value") and isinstance(v.value, (str, int)):  # an enum
        return v.value
    return repr(v)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def kernel_digest(kernel: Any) -> str:
    """Of a step's compiled kernels: the compile specs' keys (CUDA); else the generated source up to
    names (the interpreter); "" for a step with no generated kernel (cuDNN, torch, reference)."""
    try:
        keys = sorted(str(spec.key) for spec, _ in kernel.compile_specs())
    except Exception:  # noqa: BLE001 - not a generated kernel, or no spec here
        keys = []
    if keys:
        return "spec:" + _digest(",".join(keys))
    try:
        source = kernel.source() if hasattr(kernel, "source") else None
    except Exception:  # noqa: BLE001
        source = None
    if not source:
        return ""
    try:
        from opgraph.engines.triton.compiler import canonical_digest

        return "src:" + canonical_digest(source)[:16]
    except Exception:  # noqa: BLE001 - a kernel kind the canonical form does not parse
        return "src:" + _digest(source)


def step_info(step: Any) -> dict[str, Any]:
    nodes = list(step.piece.nodes)
    ops = "+".join(str(getattr(n, "kind", "?")) for n in nodes[:6]) + ("+…" if len(nodes) > 6 else "")
    return {
        "engine": step.config.engine,
        "knobs": [[str(k), _jsonable(v)] for k, v in step.config.knobs],
        "ops": ops,
        "kernel": kernel_digest(step.kernel),
    }


@dataclasses.dataclass
class Held:
    runner: Any
    graph: Any  # the captured K-call graph (bench.measure.Captured), None on the CPU or where capture failed
    k: int
    est_us: float


class Worker:
    def __init__(self, args: argparse.Namespace) -> None:
        import torch

        import bench
        import opgraph

        root = os.path.realpath(args.root)
        for mod in (opgraph, bench):
            if not os.path.realpath(mod.__file__ or "").startswith(root + os.sep):
                raise SystemExit(f"ab_kernels worker: {mod.__name__} imported from {mod.__file__}, not under {root}")
        from bench import check, measure, ours, workloads
        from bench.case import Ctx
        from bench.core import registry, tolerance

        self.torch, self.check, self.measure, self.ours, self.tolerance = torch, check, measure, ours, tolerance
        self.args = args
        self.cuda = torch.cuda.is_available() and not args.dry_run
        try:
            from bench.worker import configure_torch

            configure_torch(self.cuda)
        except ImportError:
            torch.backends.cudnn.benchmark = True
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        known = {name for name, _, _ in ours.VARIANTS}
        unknown = [v for v in args.variants if v not in known]
        if unknown:
            raise SystemExit(f"ab_kernels: unknown variant(s) {unknown}; bench.ours.VARIANTS has {sorted(known)}")
        opts = dict(
            device="cuda" if self.cuda else "cpu",
            scale="tiny" if args.dry_run else "full",
            tune=any("tuned" in v for v in args.variants),
            tune_networks=False,
            compile=False,
            compile_cudagraphs=False,
            features=frozenset({"cuda"} if self.cuda else ()),
            timing=True,
        )
        names = {f.name for f in dataclasses.fields(Ctx)}
        self.ctx = Ctx(**{k: v for k, v in opts.items() if k in names})
        workloads.load()
        chosen: set[str] = set()
        self.unknown = []  # names this version's registry does not know (a workload added or renamed since)
        for name in args.suite:
            try:
                chosen.update(s.id for s in registry.REGISTRY.select([name]))
            except KeyError:
                self.unknown.append(name)
        self.specs = {s.id: s for s in registry.REGISTRY.specs() if s.id in chosen}
        self.held: dict[tuple[str, str], Held] = {}
        self.root = root
        self.opgraph_file, self.bench_file = opgraph.__file__, bench.__file__

    def hello(self) -> dict[str, Any]:
        try:
            from bench import env

            meta = env.meta(self.ctx.device, dry_run=self.args.dry_run)
        except Exception as e:  # noqa: BLE001 - a header field, not the run
            meta = {"error": f"{type(e).__name__}: {e}"}
        return {
            "hello": True,
            "pid": os.getpid(),
            "env": _jsonable_dict(meta),
            "root": self.root,
            "opgraph": self.opgraph_file,
            "bench": self.bench_file,
            "workloads": [[s.id, s.group, s.title] for s in self.specs.values()],
            "unknown": self.unknown,
            "fallback": _jsonable_dict(getattr(self.tolerance, "FALLBACK", {})),
        }

    # -- setup: build, check, capture --------------------------------------------------------------------
    def setup(self, wid: str) -> dict[str, Any]:
        torch = self.torch
        spec = self.specs[wid]
        t0 = time.perf_counter()
        sides: dict[str, dict[str, Any]] = {}
        try:
            torch.manual_seed(self.ctx.seed)
            self.ctx.workload = wid
            case = spec.make(self.ctx)
            refs = [r.detach().to(torch.float64) for r in case.reference()]
            if len(refs) != len(case.outputs):
                raise ValueError(f"{len(refs)} references for {len(case.outputs)} outputs")
            absolute = frozenset(o.name for o, r in zip(case.outputs, refs) if self.check.zero_reference(r))
            for variant in self.args.variants:
                impl = next((i for i in case.impls if i.role == "ours" and i.name == variant), None)
                if impl is None:
                    sides[variant] = {"status": "missing", "error": "the case has no such implementation"}
                    continue
                sides[variant] = self._setup_impl(wid, variant, case, impl, refs)
            dtypes = {o.name: o.dtype for o in case.outputs}
            errors = {v: s["errors"] for v, s in sides.items() if s.get("errors")}
            tols = self.tolerance.tolerances(errors, frozenset(), dtypes, absolute)
            for v, errs in errors.items():
                verdict = self.tolerance.judge(errs, tols)
                sides[v]["check"] = {
                    "passed": verdict.passed,
                    "worst_output": verdict.worst_output,
                    "worst_ratio": verdict.worst_ratio,
                    "reason": verdict.reason,
                }
                sides[v]["tolerances"] = {k: {"value": t.value, "basis": t.basis} for k, t in tols.items()}
            del case, refs
        except Exception as e:  # noqa: BLE001 - a broken workload is a row
            traceback.print_exc()
            for variant in self.args.variants:
                sides.setdefault(variant, {"status": "error", "error": _err(e)})
        gc.collect()
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        return {
            "id": wid,
            "group": spec.group,
            "title": spec.title,
            "sides": _jsonable_dict(sides),
            "elapsed_s": time.perf_counter() - t0,
        }

    def _setup_impl(self, wid: str, variant: str, case: Any, impl: Any, refs: list[Any]) -> dict[str, Any]:
        check, measure, torch = self.check, self.measure, self.torch
        side: dict[str, Any] = {"status": "error"}
        try:
            t0 = time.perf_counter()
            runner = impl.setup()
            measure.sync(self.cuda)
            side["setup_s"] = time.perf_counter() - t0
            plan = runner.keep
            side["engines"] = runner.engine
            side["notes"] = runner.notes
            side["steps"] = [step_info(s) for s in getattr(plan, "steps", [])]
            errors = check.check_execute(runner, refs, case.outputs, self.ctx.device)
            side["errors"] = dict(errors)
            if not self.tolerance.sane(errors, case.sane_limit):
                side.update(status="not timed", error="outputs missing, non-finite or far off (execute)")
                return side
            est = measure.estimate_us(runner.call, self.cuda)
            held = Held(runner, None, 1, est)
            side["how"] = "CPU wall clock (dry run)"
            if self.cuda:
                try:
                    if not runner.capturable:
                        raise RuntimeError("the runner says it cannot be captured")
                    held.k = max(1, min(measure.MAX_K, int(measure.GRAPH_TARGET_US / est)))
                    held.graph = measure.capture(runner.call, held.k, warmup=1)
                    graph_errors = check.check_graph(
                        runner, held.graph.ret, held.graph.graph.replay, refs, case.outputs
                    )
                    side["errors"] = {k: _worse(errors.get(k), graph_errors.get(k)) for k in {*errors, *graph_errors}}
                    if not self.tolerance.sane(graph_errors, case.sane_limit):
                        side.update(status="not timed", error="outputs wrong on CUDA-graph replay")
                        return side
                    side["how"] = f"CUDA graph of {held.k} calls"
                except Exception as e:  # noqa: BLE001 - time it by the profiler instead, as bench does
                    torch.cuda.synchronize()
                    held.graph = None
                    side["how"] = f"profiler kernel sum (capture failed: {_err(e)})"
            side["k"], side["est_us"] = held.k, est
            self.held[(wid, variant)] = held
            side["status"] = "ok"
        except Exception as e:  # noqa: BLE001 - this variant's failure is its row
            traceback.print_exc()
            side.update(status="error", error=_err(e))
        return side

    # -- one sample --------------------------------------------------------------------------------------
    def time_one(self, wid: str, variant: str, rounds: int, k: int | None = None) -> dict[str, Any]:
        """One sample: µs per call. `k`: the calls per graph the parent chose for the row (the same for both
        versions, so that neither amortises the graph's ends over more calls); captured again if it differs."""
        measure = self.measure
        held = self.held[(wid, variant)]
        if held.graph is not None and k and k != held.k:
            held.graph = None
            held.graph = measure.capture(held.runner.call, k, warmup=1)
            held.k = k
        if held.graph is not None:
            replay = held.graph.graph.replay
            replay()  # warm: L2 and clocks after the other version's sample
            us = statistics.median(measure.events_us(replay, rounds, measure.HIDE_US)) / held.k
        elif self.cuda:
            us = measure.kernel_sum_us(held.runner.call)
        else:
            us = measure.back_to_back_us(held.runner.call, held.est_us, measure.Budget(rounds=rounds), False)
        return {"us": us, "k": held.k}


def _worse(a: float | None, b: float | None) -> float | None:
    if a is None or b is None:
        return None
    if a != a or b != b:
        return float("nan")
    return max(a, b)


def _err(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:300] if text else ''}"


def _jsonable_dict(d: Any) -> Any:
    if isinstance(d, dict):
        return {str(k): _jsonable_dict(v) for k, v in d.items()}
    if isinstance(d, (list, tuple)):
        return [_jsonable_dict(v) for v in d]
    return _jsonable(d)


def worker_main(args: argparse.Namespace) -> int:
    # answers go to the original stdout; everything else printed (opgraph, Triton, bench) goes to stderr
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)

    def say(obj: dict[str, Any]) -> None:
        proto.write(json.dumps(obj) + "\n")
        proto.flush()

    try:
        worker = Worker(args)
    except BaseException as e:  # noqa: BLE001 - the parent reads why
        traceback.print_exc()
        say({"hello": False, "error": _err(e)})
        return 1
    say(worker.hello())
    for line in sys.stdin:
        msg = json.loads(line)
        cmd = msg.get("cmd")
        if cmd == "quit":
            break
        try:
            if cmd == "setup":
                say(worker.setup(msg["id"]))
            elif cmd == "time":
                say(worker.time_one(msg["id"], msg["variant"], int(msg.get("rounds", 5)), msg.get("k")))
            else:
                say({"error": f"unknown command {cmd!r}"})
        except Exception as e:  # noqa: BLE001 - answered, the parent decides
            traceback.print_exc()
            say({"error": _err(e)})
    return 0


# -- the parent: workers per version, setups, interleaved timing, the report -----------------------------------
class Proc:
    """One worker process and the thread that reads its answers into the parent's queue."""

    def __init__(
        self, version: str, index: int, argv: list[str], env: dict[str, str], cwd: str, log: str, answers: queue.Queue
    ) -> None:
        self.version, self.index, self.log = version, index, log
        self.name = f"{version}-{index}"
        self.log_file = open(log, "w")
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log_file,
            env=env,
            cwd=cwd,
            text=True,
            bufsize=1,
        )
        self.alive = True
        self.busy: str | None = None
        self.holds: set[str] = set()
        self.hello: dict[str, Any] | None = None
        threading.Thread(target=self._read, args=(answers,), daemon=True).start()

    def _read(self, answers: queue.Queue) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                answers.put((self, json.loads(line)))
            except ValueError:
                answers.put((self, {"error": f"unreadable answer: {line[:200]}"}))
        answers.put((self, None))

    def send(self, msg: dict[str, Any]) -> bool:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(msg) + "\n")
            self.proc.stdin.flush()
            return True
        except (OSError, ValueError):
            self.alive = False
            return False

    def stop(self, kill: bool = False) -> None:
        if self.proc.poll() is None:
            if not kill:
                self.send({"cmd": "quit"})
                try:
                    self.proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    kill = True
            if kill:
                self.proc.kill()
                self.proc.wait()
        self.alive = False
        self.log_file.close()


def default_workers(dry_run: bool) -> int:
    if dry_run:
        return 1
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(4, cores // 4))


def label_of(root: str, given: str | None, fallback_env: bool) -> str:
    """--old-label / --new-label, else the root's git commit when the root is a checkout's top, else
    $OPGRAPH_COMMIT (new only), else the folder."""
    if given:
        return given
    try:
        top = subprocess.run(
            ["git", "-C", root, "rev-parse", "--show-toplevel"], capture_output=True, text=True, timeout=10, check=False
        ).stdout.strip()
        if top and os.path.realpath(top) == os.path.realpath(root):
            sha = subprocess.run(
                ["git", "-C", root, "rev-parse", "--short", "HEAD"],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            ).stdout.strip()
            dirty = subprocess.run(
                ["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            ).stdout.strip()
            if sha:
                return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    if fallback_env and os.environ.get("OPGRAPH_COMMIT"):
        return os.environ["OPGRAPH_COMMIT"]
    return os.path.basename(os.path.realpath(root)) or root


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.t0 = time.monotonic()
        self.answers: queue.Queue = queue.Queue()
        self.procs: list[Proc] = []
        self.results: dict[str, dict[str, dict[str, Any]]] = {"old": {}, "new": {}}
        self.samples: dict[tuple[str, str, str], list[float]] = {}
        self.k_used: dict[tuple[str, str], int | None] = {}
        self.notes: list[str] = []

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def log(self, msg: str) -> None:
        print(f"ab [{self.elapsed():5.0f} s] {msg}", flush=True)

    # -- workers -------------------------------------------------------------------------------------------
    def start(self, roots: dict[str, str], labels: dict[str, str], logdir: str) -> None:
        a = self.args
        base = dict(os.environ)
        if a.cache:
            base["OPGRAPH_CACHE_DIR"] = os.path.join(os.path.abspath(a.cache), "opgraph")
            base["TRITON_CACHE_DIR"] = os.path.join(os.path.abspath(a.cache), "triton")
        base.setdefault("PYTHONUNBUFFERED", "1")
        base["OPGRAPH_PROGRESS"] = "0"
        if a.dry_run:
            base["TRITON_INTERPRET"] = "1"
            base["CUDA_VISIBLE_DEVICES"] = ""
        try:
            cores = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cores = os.cpu_count() or 1
        base.setdefault("OPGRAPH_COMPILE_WORKERS", str(max(1, cores // a.workers)))
        self.cache = {
            "opgraph": base.get("OPGRAPH_CACHE_DIR", "(opgraph's default: ~/.cache/opgraph)"),
            "triton": base.get("TRITON_CACHE_DIR", "(Triton's default: ~/.triton/cache)"),
        }
        for version in ("old", "new"):
            env = dict(base)
            env["PYTHONPATH"] = roots[version] + (os.pathsep + base["PYTHONPATH"] if base.get("PYTHONPATH") else "")
            env["OPGRAPH_COMMIT"] = labels[version]
            argv = [
                sys.executable,
                os.path.abspath(__file__),
                "--worker",
                "--root",
                roots[version],
                "--suite",
                *a.suite,
                "--variants",
                *a.variants,
            ] + (["--dry-run"] if a.dry_run else [])
            for i in range(a.workers):
                self.procs.append(
                    Proc(
                        version, i, argv, env, roots[version], os.path.join(logdir, f"{version}-{i}.log"), self.answers
                    )
                )

    def wait_hellos(self) -> None:
        waiting = {p for p in self.procs}
        deadline = time.monotonic() + HELLO_TIMEOUT_S
        while waiting and time.monotonic() < deadline:
            try:
                proc, msg = self.answers.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                break
            waiting.discard(proc)
            if msg is None or not msg.get("hello"):
                proc.alive = False
                self.log(f"worker {proc.name} failed to start: {(msg or {}).get('error', 'exited')} (log {proc.log})")
                continue
            proc.hello = msg
        for p in waiting:
            self.log(f"worker {p.name} did not start within {HELLO_TIMEOUT_S:.0f} s (log {p.log})")
            p.stop(kill=True)

    def first_hello(self, version: str) -> dict[str, Any] | None:
        return next((p.hello for p in self.procs if p.version == version and p.hello), None)

    # -- setup ---------------------------------------------------------------------------------------------
    def setup_all(self, ids: dict[str, list[str]], dispatch_end: float, setup_end: float) -> None:
        pending = {v: list(ids[v]) for v in ("old", "new")}
        started: dict[str, set[str]] = {"old": set(), "new": set()}
        while True:
            now = self.elapsed()
            for p in self.procs:
                if p.alive and p.hello and p.busy is None and pending[p.version] and now < dispatch_end:
                    wid = next_setup(pending[p.version], started[other(p.version)], set(self.results[other(p.version)]))
                    pending[p.version].remove(wid)
                    started[p.version].add(wid)
                    if p.send({"cmd": "setup", "id": wid}):
                        p.busy = wid
            busy = [p for p in self.procs if p.busy is not None]
            if not busy:
                break
            left = setup_end - self.elapsed()
            if left <= 0:
                for p in busy:
                    self.log(
                        f"worker {p.name} still setting up {p.busy} at the setup deadline: killed "
                        f"({len(p.holds)} workload(s) it held lost)"
                    )
                    self._lost(p, f"worker killed at the setup deadline while setting up {p.busy}")
                    p.stop(kill=True)
                break
            try:
                proc, msg = self.answers.get(timeout=min(left, 5.0))
            except queue.Empty:
                continue
            self._answer_setup(proc, msg)
        for v in ("old", "new"):
            for wid in pending[v]:
                self.results[v].setdefault(
                    wid,
                    {
                        "id": wid,
                        "sides": {
                            x: {"status": "not set up", "error": "budget: setup phase over"} for x in self.args.variants
                        },
                    },
                )

    def _answer_setup(self, proc: Proc, msg: dict[str, Any] | None) -> None:
        wid = proc.busy
        if msg is None:
            self.log(f"worker {proc.name} died (log {proc.log})")
            self._lost(proc, "worker died")
            proc.alive = False
            proc.busy = None
            return
        if wid is None:
            return
        proc.busy = None
        if "sides" not in msg:
            msg = {
                "id": wid,
                "sides": {x: {"status": "error", "error": msg.get("error", "?")} for x in self.args.variants},
            }
        msg["worker"] = proc.name
        self.results[proc.version][wid] = msg
        proc.holds.add(wid)
        parts = [
            f"{v} {s.get('status')} [{s.get('engines', '')}] {s.get('setup_s', 0):.1f} s"
            + (f" ({s.get('error')})" if s.get("error") else "")
            for v, s in msg["sides"].items()
        ]
        self.log(f"{proc.version} {wid}: {msg.get('elapsed_s', 0):.1f} s: " + "; ".join(parts))

    def _lost(self, proc: Proc, why: str) -> None:
        for wid in sorted(proc.holds | ({proc.busy} if proc.busy else set())):
            self.results[proc.version][wid] = {
                "id": wid,
                "sides": {x: {"status": "lost", "error": why} for x in self.args.variants},
            }
        proc.holds, proc.busy = set(), None

    # -- timing --------------------------------------------------------------------------------------------
    def holder(self, version: str, wid: str) -> Proc | None:
        return next((p for p in self.procs if p.version == version and p.alive and wid in p.holds), None)

    def sample(self, version: str, wid: str, variant: str, k: int | None) -> None:
        proc = self.holder(version, wid)
        if proc is None or not proc.send(
            {"cmd": "time", "id": wid, "variant": variant, "rounds": self.args.rounds, "k": k}
        ):
            return
        while True:
            try:
                got, msg = self.answers.get(timeout=TIME_TIMEOUT_S)
            except queue.Empty:
                self.log(f"worker {proc.name}: no sample of {wid} [{variant}] in {TIME_TIMEOUT_S:.0f} s: killed")
                self._lost(proc, "worker hung while timing")
                proc.stop(kill=True)
                return
            if got is not proc:  # (a late answer of another worker: only a death can come now)
                if msg is None:
                    self._lost(got, "worker died")
                    got.alive = False
                continue
            if msg is None:
                self.log(f"worker {proc.name} died timing {wid} [{variant}] (log {proc.log})")
                self._lost(proc, "worker died while timing")
                proc.alive = False
                return
            if "us" in msg:
                self.samples.setdefault((version, wid, variant), []).append(float(msg["us"]))
            else:
                self.log(f"{version} {wid} [{variant}]: sample failed: {msg.get('error')}")
            return

    def expected_row_s(self, wid: str, variant: str) -> float:
        """Seconds one row's 4 samples take (estimate: per sample rounds + 1 replays of K calls behind a 1-ms
        spin, plus the messages)."""
        total = 0.0
        for v in ("old", "new"):
            side = self.results[v].get(wid, {}).get("sides", {}).get(variant, {})
            est, k = float(side.get("est_us") or 1000.0), int(side.get("k") or 1)
            total += 2 * ((self.args.rounds + 1) * (k * est + 1000.0) / 1e6 + 0.01)
        return total

    def row_k(self, wid: str, variant: str) -> int | None:
        """Calls per graph for both versions' samples of a row: the smaller of their choices (bench's rule, a
        replay of ~2 ms, applied to each version's estimate); None where a side has no graph."""
        ks = [
            int(side["k"])
            for v in ("old", "new")
            if (side := self.results[v].get(wid, {}).get("sides", {}).get(variant, {})).get("status") == "ok"
            and str(side.get("how", "")).startswith("CUDA graph")
        ]
        return min(ks) if ks else None

    def time_all(self, rows: list[tuple[str, str]], end: float) -> str:
        for p in range(self.args.passes):
            order = ("old", "new", "new", "old") if p % 2 == 0 else ("new", "old", "old", "new")
            for wid, variant in rows:
                if end - self.elapsed() < self.expected_row_s(wid, variant):
                    return f"timing stopped in pass {p + 1} of {self.args.passes} at the budget"
                k = self.k_used[(wid, variant)] = self.row_k(wid, variant)
                for v in order:
                    side = self.results[v].get(wid, {}).get("sides", {}).get(variant, {})
                    if side.get("status") == "ok":
                        self.sample(v, wid, variant, k)
            self.log(f"timing pass {p + 1} of {self.args.passes} done")
        return ""


def other(version: str) -> str:
    return "new" if version == "old" else "old"


def next_setup(pending: Sequence[str], started_other: set[str], done_other: set[str]) -> str:
    """The workload a free worker of one version sets up next: one the other version has set up (its
    kernels are in the shared caches when the two versions generate the same), else one the other has not
    started (fresh: compiled once, by whichever comes first), else the next (compiled by both at once)."""
    for wid in pending:
        if wid in done_other:
            return wid
    for wid in pending:
        if wid not in started_other:
            return wid
    return pending[0]


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="scripts/ab_kernels.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--old", help="the old version's package root (holding opgraph/ and bench/)")
    ap.add_argument("--new", help="the new version's package root")
    ap.add_argument(
        "--suite",
        nargs="+",
        default=list(DEFAULT_SUITE),
        help="groups, workload ids or globs, as bench.run takes them (default: %(default)s)",
    )
    ap.add_argument(
        "--variants",
        nargs="+",
        default=list(DEFAULT_VARIANTS),
        help="opgraph's builds (bench.ours.VARIANTS names; default: %(default)s)",
    )
    ap.add_argument("--budget", type=float, default=270.0, help="seconds for the whole command (default 270)")
    ap.add_argument("--out", default=None, help="folder for ab_kernels.json and .md (default $OUT, else .)")
    ap.add_argument("--dry-run", action="store_true", help="the CPU: tiny shapes, interpreter, wall-clock times")
    ap.add_argument(
        "--workers",
        type=int,
        default=None,
        help="worker processes per version (default: cores / 4, at most 4; 1 with --dry-run)",
    )
    ap.add_argument("--passes", type=int, default=2, help="timing passes (each: old,new,new,old per row)")
    ap.add_argument("--rounds", type=int, default=5, help="graph replays per sample (its median)")
    ap.add_argument("--noise-floor", type=float, default=NOISE_FLOOR, help="the least noise (relative)")
    ap.add_argument("--timing-reserve", type=float, default=40.0, help="seconds kept for timing (default 40)")
    ap.add_argument(
        "--cache",
        default=None,
        help="set OPGRAPH_CACHE_DIR and TRITON_CACHE_DIR under this folder for "
        "both versions (default: the environment's, the same for both)",
    )
    ap.add_argument("--old-label", default=None)
    ap.add_argument("--new-label", default=None)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--root", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if not args.worker and not (args.old and args.new):
        ap.error("--old and --new are required")
    return args


def parent_main(args: argparse.Namespace, argv: list[str]) -> int:
    roots = {"old": os.path.realpath(args.old), "new": os.path.realpath(args.new)}
    for v, root in roots.items():
        if not (os.path.isdir(os.path.join(root, "opgraph")) and os.path.isdir(os.path.join(root, "bench"))):
            raise SystemExit(
                f"ab_kernels: --{v} {root} holds no opgraph/ and bench/ (a package root: the repository "
                "top, or a `git archive <commit> opgraph bench` export)"
            )
    args.workers = args.workers or default_workers(args.dry_run)
    out = args.out or os.environ.get("OUT") or "."
    logdir = os.path.join(out, "ab_kernels-logs")
    os.makedirs(logdir, exist_ok=True)
    labels = {"old": label_of(roots["old"], args.old_label, False), "new": label_of(roots["new"], args.new_label, True)}
    run = Run(args)
    budget = args.budget
    reserve = min(args.timing_reserve, budget / 3)
    run.log(
        f"old {labels['old']} ({roots['old']}) vs new {labels['new']} ({roots['new']}); {args.workers} worker(s) "
        f"per version; budget {budget:.0f} s (timing reserve {reserve:.0f} s)"
    )
    run.start(roots, labels, logdir)
    rows: list[dict[str, Any]] = []
    meta: dict[str, Any] = {}
    try:
        run.wait_hellos()
        hellos = {v: run.first_hello(v) for v in ("old", "new")}
        if not all(hellos.values()):
            raise SystemExit("ab_kernels: a version's workers did not start (logs in " + logdir + ")")
        listed = {v: [w[0] for w in hellos[v]["workloads"]] for v in ("old", "new")}  # type: ignore[index]
        info = {w[0]: (w[1], w[2]) for v in ("old", "new") for w in hellos[v]["workloads"]}  # type: ignore[index]
        order = list(dict.fromkeys(listed["new"] + listed["old"]))
        ids = {v: [w for w in order if w in listed[v]] for v in ("old", "new")}
        run.log(f"{len(order)} workload(s): {len(set(listed['old']) & set(listed['new']))} in both versions")
        typos = set(hellos["old"].get("unknown", [])) & set(hellos["new"].get("unknown", []))  # type: ignore[union-attr]
        if typos:
            raise SystemExit(
                f"ab_kernels: no workload or group {sorted(typos)} in either version "
                "(`python -m bench.run --list` lists them)"
            )
        for v in ("old", "new"):
            if hellos[v].get("unknown"):  # type: ignore[union-attr]
                run.log(f"{v} knows no workload or group {hellos[v]['unknown']}")  # type: ignore[index]
        t_setup = run.elapsed()
        run.setup_all(ids, budget - reserve - DISPATCH_MARGIN_S, budget - reserve)
        setup_s = run.elapsed() - t_setup
        timed_rows = [
            (w, v)
            for w in order
            for v in args.variants
            if any(run.results[x].get(w, {}).get("sides", {}).get(v, {}).get("status") == "ok" for x in ("old", "new"))
        ]
        run.log(f"setup done in {setup_s:.0f} s; timing {len(timed_rows)} row(s)")
        t_time = run.elapsed()
        cut = run.time_all(timed_rows, budget - END_MARGIN_S)
        timing_s = run.elapsed() - t_time
        specs = []  # (make_row's arguments but the floor, k) per row
        for wid in order:
            for variant in args.variants:
                sides = {
                    v: run.results[v].get(wid, {}).get("sides", {}).get(variant)
                    if wid in listed[v]
                    else {"status": "absent", "error": "no such workload in this version"}
                    for v in ("old", "new")
                }
                samples = [run.samples.get((v, wid, variant), []) for v in ("old", "new")]
                specs.append(
                    ((wid, info[wid][1], variant, sides["old"], sides["new"], *samples), run.k_used.get((wid, variant)))
                )

        def judged(floor: float) -> list[dict[str, Any]]:
            return [{**make_row(*spec, floor), "k": k} for spec, k in specs]

        rows = judged(args.noise_floor)
        # a row whose code differs is judged against the A/A spread too: noise its own repeats cannot see
        aa = aa_spread(rows)
        if aa > args.noise_floor:
            rows = judged(aa)
        meta = {
            "schema": 1,
            "command": " ".join(["python", "scripts/ab_kernels.py", *argv]),
            "suite": list(args.suite),
            "variants": list(args.variants),
            "budget": budget,
            "dry_run": args.dry_run,
            "workers": args.workers,
            "passes": args.passes,
            "rounds": args.rounds,
            "noise_floor": args.noise_floor,
            "aa_spread": aa,
            "cache": run.cache,
            "setup_s": setup_s,
            "timing_s": timing_s,
            "wall_s": run.elapsed(),
            "cut": cut,
            "fallback": ", ".join(f"{k} {v:g}" for k, v in (hellos["new"] or {}).get("fallback", {}).items()),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            **{
                v: {
                    "label": labels[v],
                    "root": roots[v],
                    "env": hellos[v].get("env", {}),  # type: ignore[union-attr]
                    "opgraph": hellos[v].get("opgraph"),
                    "bench": hellos[v].get("bench"),
                }  # type: ignore[union-attr]
                for v in ("old", "new")
            },
        }
        not_in = {v: sorted(set(order) - set(listed[v])) for v in ("old", "new")}
        if any(not_in.values()):
            meta["not_in"] = not_in
    finally:
        for p in run.procs:
            p.stop()
    md = render(meta, rows)
    with open(os.path.join(out, "ab_kernels.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows, "totals": totals(rows)}, f, indent=1)
    with open(os.path.join(out, "ab_kernels.md"), "w") as f:
        f.write(md)
    print(md, flush=True)
    run.log(f"wrote {os.path.join(out, 'ab_kernels.json')} and .md; exit status {exit_status(rows)}")
    return exit_status(rows)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse(argv)
    if args.worker:
        return worker_main(args)
    return parent_main(args, argv)


if __name__ == "__main__":
    sys.exit(main())
