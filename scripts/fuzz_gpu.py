"""The differential fuzzer on a GPU: random valid graphs (tests/fuzz) built with compiled Triton kernels
(and every other engine the build picks: library, cudnn, torch), run, and compared with the reference
engine; worker processes share the GPU until the time budget is spent.

    python scripts/fuzz_gpu.py [--minutes 8] [--workers 16] [--seed N] [--out DIR]

Writes DIR/fuzz_summary.json (DIR: --out, else $OUT, else the current directory): graphs run, plan runs
compared, mismatches, failures by kind, untyped errors by exception class, declined builds by rule,
plan steps by engine/template, and the first failures; each failing case (shrunk where time allows)
goes to DIR/fuzz_failures/seed<N>.json, replayable with
`python -m tests.fuzz.replay DIR/fuzz_failures/seed<N>.json --device cuda`. Exit status 1 on any failure.
The summary is rewritten every 20 s while the run goes (`"complete": false`): a run cut short keeps its figures.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = {"repeat": 1.0, "plan_files": 0.2, "damage": 0.2}  # every plan runs twice (the fast binder's path)


def _worker(index: int, workers: int, base: int, deadline: float, queue: mp.Queue, device: str) -> None:
    sys.path.insert(0, str(ROOT))
    if device == "cpu":  # (a dry run of the harness without a GPU: generated kernels interpreted)
        os.environ["TRITON_INTERPRET"] = "1"
    else:
        os.environ.pop("TRITON_INTERPRET", None)
    try:
        import torch

        from tests.fuzz.families import make_case
        from tests.fuzz.runner import EngineSet, Runner, Stats

        if device != "cpu":
            torch.cuda.init()
        first = EngineSet("default", None) if device != "cpu" else EngineSet("triton+torch", ("triton", "torch"))
        default = Runner(device, (first, EngineSet("torch", ("torch",))), **SETTINGS)
        ieee = EngineSet("ieee", None, (("deselect_numeric_notes", ("DOWN_CONVERT_INPUTS",)),))
        stats = Stats()
        harness: list[dict] = []
        seed = base + index
        last_report = time.monotonic()
        while time.monotonic() < deadline:
            try:
                case = make_case(seed)
            except Exception as err:  # noqa: BLE001
                stats.untyped[f"generator:{type(err).__name__}"] += 1
                seed += workers
                continue
            runner = default
            if {"matmul", "conv"} & set(case.families):  # fp32 GEMMs: the full-fp32 configs too
                runner = Runner(device, (*default.sets, ieee), **SETTINGS)
            try:
                stats.merge(runner.run(case))
            except Exception as err:  # noqa: BLE001 - the harness itself: count it, keep going
                stats.untyped[f"harness:{type(err).__name__}"] += 1
                if len(harness) < 5:
                    harness.append(
                        {
                            "seed": seed,
                            "error": f"{type(err).__name__}: {err}",
                            "traceback": traceback.format_exc()[-3000:],
                        }
                    )
            seed += workers
            if time.monotonic() - last_report > 20:
                queue.put(("progress", index, {**_payload(stats), "harness_errors": harness}))
                last_report = time.monotonic()
        queue.put(("done", index, {**_payload(stats), "harness_errors": harness}))
    except BaseException as err:  # noqa: BLE001 - report a dead worker instead of hanging the parent
        queue.put(("dead", index, f"{type(err).__name__}: {err}"))


def _payload(stats) -> dict:
    return {
        "graphs": stats.graphs,
        "runs": stats.runs,
        "damaged": stats.damaged,
        "declined": dict(stats.declined),
        "untyped": dict(stats.untyped),
        "steps": dict(stats.steps),
        "families": dict(stats.families),
        "failures": [
            {"seed": f.seed, "engines": f.engines, "kind": f.kind, "detail": f.detail} for f in stats.failures
        ],
    }


def _shrink_failures(failures: list[dict], out: Path, seconds: float, device: str) -> list[str]:
    """Shrink the first failures (one per kind and engine set) while time allows; write each case."""
    sys.path.insert(0, str(ROOT))
    from tests.fuzz.replay import load, minimal

    written, seen = [], set()
    folder = out / "fuzz_failures"
    folder.mkdir(parents=True, exist_ok=True)
    stop = time.monotonic() + seconds
    for f in failures:
        key = (f["kind"], f["engines"])
        if key in seen:
            continue
        seen.add(key)
        case = load(f["seed"])
        if time.monotonic() < stop:
            try:
                case, _ = minimal(case, device, SETTINGS)
            except Exception:  # noqa: BLE001 - keep the unshrunk case
                pass
        path = folder / f"seed{f['seed']}.json"
        path.write_text(
            json.dumps({"note": f"{f['kind']} [{f['engines']}]: {f['detail'][:300]}", **case.to_dict()}, indent=1)
            + "\n"
        )
        written.append(str(path))
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=8.0, help="time budget for running graphs (default 8)")
    ap.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 4))
    ap.add_argument("--seed", type=int, default=None, help="first seed (default: from today's date)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--shrink-seconds", type=float, default=60.0)
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # "cpu": a dry run of the harness
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base = args.seed if args.seed is not None else int(datetime.date.today().strftime("%Y%m%d")) * 1_000_000 + 500_000
    start = time.monotonic()
    deadline = start + 60 * args.minutes
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(i, args.workers, base, deadline, queue, args.device), daemon=True)
        for i in range(args.workers)
    ]
    for p in procs:
        p.start()
    latest: dict[int, dict] = {}  # each worker's newest figures (a progress report, then its final one)
    finished, dead = set(), []
    last_write = time.monotonic()
    while len(finished) + len(dead) < len(procs):
        try:
            kind, index, payload = queue.get(timeout=60 * args.minutes + 300 - (time.monotonic() - start))
        except Exception:  # noqa: BLE001 - a worker hung past the budget
            break
        if kind == "dead":
            dead.append(f"worker {index}: {payload}")
            continue
        latest[index] = payload
        if kind == "done":
            finished.add(index)
        else:
            print(f"[{time.monotonic() - start:6.0f} s] {sum(r['graphs'] for r in latest.values())} graphs", flush=True)
        if time.monotonic() - last_write > 20:  # a run cut short (a device call's limit) keeps its figures
            _write_summary(out, list(latest.values()), dead, [], args, base, time.monotonic() - start, complete=False)
            last_write = time.monotonic()
    for p in procs:
        p.join(timeout=30)
    results = list(latest.values())
    failures = [f for r in results for f in r["failures"]]
    written = _shrink_failures(failures, out, args.shrink_seconds, args.device) if failures else []
    summary = _write_summary(out, results, dead, written, args, base, time.monotonic() - start, complete=True)
    keys = ("graphs", "runs", "seconds", "mismatches", "failures", "failures_by_kind", "untyped_errors_by_class")
    print(json.dumps({k: summary[k] for k in (*keys, "dead_workers")}, indent=1))
    return 1 if failures or dead or sum(summary["untyped_errors_by_class"].values()) else 0


def _write_summary(
    out: Path, results: list[dict], dead: list[str], written: list[str], args, base: int, elapsed: float, complete: bool
) -> dict:
    """DIR/fuzz_summary.json from the workers' figures; `complete` false while the run is still going."""
    import torch
    import triton

    total = {"graphs": 0, "runs": 0, "damaged": 0}
    untyped, declined, steps, families, kinds = Counter(), Counter(), Counter(), Counter(), Counter()
    failures: list[dict] = []
    harness_errors: list[dict] = []
    for r in results:
        harness_errors += r.get("harness_errors", [])
        for k in total:
            total[k] += r[k]
        untyped.update(r["untyped"])
        declined.update(r["declined"])
        steps.update(r["steps"])
        families.update(r["families"])
        failures += r["failures"]
        kinds.update(f["kind"] for f in r["failures"])
    summary = {
        **total,
        "complete": complete,
        "seconds": round(elapsed, 1),
        "workers": args.workers,
        "first_seed": base,
        "device": torch.cuda.get_device_name(0) if args.device != "cpu" else "cpu (interpreter)",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "mismatches": kinds.get("mismatch", 0),
        "failures": len(failures),
        "failures_by_kind": dict(kinds),
        "untyped_errors_by_class": dict(untyped),
        "declined_by_rule": dict(declined),
        "steps": dict(steps),
        "families": dict(families),
        "dead_workers": dead,
        "first_failures": failures[:50],
        "harness_errors": harness_errors[:20],
        "failure_cases": written,
    }
    (out / "fuzz_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


if __name__ == "__main__":
    sys.exit(main())
