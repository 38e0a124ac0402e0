"""Run the benchmark suite: `python -m bench.run --suite all --repeats 3 --out $OUT`.

The parent process never touches the GPU: it runs each repeat as a fresh worker process (process-level
repeats), keeps within --time-limit (a repeat is started only if the last one's duration still fits; a
worker past its deadline starts no new implementation and what it finished is kept), then aggregates
the repeats (median, min-max), and writes <date>-<device>-<suite>.json (every repeat's raw records) and
.md (the tables) into --out. `python -m bench.report FILES...` re-renders or merges such files.

    --suite NAME ...   groups, workload ids or globs (also positional); `--list` shows them
    --quick            smaller shapes, shorter timings, one repeat unless --repeats: a smoke test on a GPU
    --dry-run          the whole pipeline on the CPU with tiny shapes (reference engine, generated kernels
                       under TRITON_INTERPRET=1, eager PyTorch; no torch.compile, no cuDNN): wiring checks
    --warm             set up and check every implementation without timing (fills the compile and tuning
                       caches of the machine for a later timed run; nothing written)
    --gpus N           spread the work over N GPUs of one host: each (repeat, group) is a worker process of
                       its own on one GPU (CUDA_VISIBLE_DEVICES) and that GPU's share of the cores
                       (bench/standby.py core_slots), the cold jobs first (the warm-up pass, or
                       repeat 1 of every group), longest first, then the later repeats group by group, a
                       group's repeats together, longest group first; the host-time group's repeats start
                       once no other group's cold, compiling job runs or waits, never beside each other; a
                       group's later repeats wait for its cold job (the warm-up, or repeat 1 without one). A
                       free GPU takes the first job whose expected seconds (bench/core/costs.json) fit in what
                       is left of --time-limit, else the shortest one (`next_job`); its worker process was
                       started ahead, imports done (bench/standby.py). One machine per table still holds
                       (same host, same GPU model); the header says the run was spread.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from .core import registry
from .core.aggregate import aggregate
from .core.records import RunRecord
from .core.render import render
from .standby import STANDBY_FLAG, StandbyPool, core_slots, serve
from .worker import MARGIN_S

START_SHARE = 0.9  # a job needing more than this share of a call fits only in the call's first (1 - share)


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m bench.run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("names", nargs="*", help="groups, families of groups, workload ids or globs (same as --suite)")
    ap.add_argument(
        "--suite",
        nargs="+",
        action="extend",  # (--suite a --suite b selects both)
        default=[],
        help="groups, families of groups ('attention': every "
        "attention-* group), workload ids or globs; 'all' for everything",
    )
    ap.add_argument(
        "--repeats", type=int, default=None, help="process-level repeats (default 3; 1 with --quick, 2 with --dry-run)"
    )
    ap.add_argument("--out", default=None, help="output folder (default $OUT, else bench/results)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--warm", action="store_true")
    ap.add_argument(
        "--warm-first",
        action="store_true",
        help="a --warm pass in its own process before the timed repeats (a machine with cold caches)",
    )
    ap.add_argument("--list", action="store_true", help="list groups and workloads, then exit")
    ap.add_argument("--no-tune", action="store_true", help="no tuned plans (opgraph, generated) and no cuDNN tuning")
    ap.add_argument("--tune-networks", action="store_true", help="also tuned plans of whole networks (slow first time)")
    ap.add_argument("--no-compile", action="store_true", help="no torch.compile peers")
    ap.add_argument("--no-compile-cudagraphs", action="store_true", help="no torch.compile mode=max-autotune row")
    ap.add_argument("--cold-l2", action="store_true", help="flush L2 before each call in device-time graphs")
    ap.add_argument(
        "--time-limit",
        type=float,
        default=float(os.environ.get("OPGRAPH_BENCH_TIME_LIMIT", 540)),
        help="seconds for the whole command (default 540: a 10-minute device call with margin; 0: none)",
    )
    ap.add_argument("--gpus", type=int, default=1, help="GPUs of this host to spread (repeat, group) workers over")
    ap.add_argument("--name", default=None, help="suite name in the file names (default: from the selection)")
    ap.add_argument(
        "--resume",
        default=None,
        metavar="RAWDIR",
        help="go on with the run whose raw files are in RAWDIR (a later call on the same machine, caches "
        "still warm; same selection and flags): finished workloads are kept, the rest run",
    )
    ap.add_argument(
        "--describe",
        action="store_true",
        help="print each opgraph plan's describe() (configs, tuned alternatives' times)",
    )
    ap.add_argument("--steps", action="store_true", help="print where each opgraph plan's time goes, step by step")
    # internal: one repeat in this process (`--standby`, a worker started ahead of its job, is main's)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--repeat-index", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--raw", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--seconds", type=float, default=None, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def selection(args: argparse.Namespace) -> list[registry.WorkloadSpec]:
    from . import workloads

    workloads.load()
    return registry.REGISTRY.select(list(args.suite) + list(args.names) or ["all"], quick=args.quick)


def list_workloads() -> str:
    from . import workloads

    workloads.load()
    lines = []
    for group, ids in registry.REGISTRY.groups().items():
        specs = [registry.REGISTRY.get(i) for i in ids]
        lines.append(f"{group}  (~{sum(s.minutes for s in specs):.0f} min per repeat on an H100, warm caches)")
        lines += [f"    {s.id:44s} {s.title}" for s in specs]
    return "\n".join(lines)


def slug(device: str) -> str:
    d = device.lower()
    for key in ("h200", "h100", "a100", "l40s", "b200", "gb200"):
        if key in d:
            return key
    if "cpu" in d:
        return "cpu-dry-run"
    return re.sub(r"[^a-z0-9]+", "-", d).strip("-")[:24] or "device"


def suite_name(args: argparse.Namespace, limit: int = 60) -> str:
    """--name, or the selection's names joined by "+": whole names within `limit` characters, then
    "+N-more" (a name is never cut)."""
    if args.name:
        return args.name
    names = [re.sub(r"[^A-Za-z0-9_.-]+", "_", n) for n in list(args.suite) + list(args.names) or ["all"]]
    kept = names if len("+".join(names)) <= limit else names[:1]
    for n in names[len(kept) :]:
        if len("+".join([*kept, n])) + len(f"+{len(names)}-more") > limit:
            break
        kept.append(n)
    name = "+".join(kept) + (f"+{len(names) - len(kept)}-more" if len(kept) < len(names) else "")
    return name + ("-quick" if args.quick else "") + ("-dry-run" if args.dry_run else "")


def worker_argv(
    args: argparse.Namespace, index: int, raw: str, seconds: float, suite: list[str] | None = None
) -> list[str]:
    argv = [
        sys.executable,
        "-m",
        "bench.run",
        "--worker",
        "--repeat-index",
        str(index),
        "--raw",
        raw,
        "--suite",
        *(suite or list(args.suite) + list(args.names) or ["all"]),
    ]
    if seconds != float("inf"):
        argv += ["--seconds", f"{seconds:.0f}"]
    for flag in (
        "quick",
        "dry_run",
        "warm",
        "no_tune",
        "tune_networks",
        "no_compile",
        "no_compile_cudagraphs",
        "cold_l2",
    ):
        if getattr(args, flag):
            argv.append("--" + flag.replace("_", "-"))
    return argv


def parent(args: argparse.Namespace) -> int:
    specs = selection(args)  # fails early on an unknown name
    if not args.time_limit or args.time_limit <= 0:
        args.time_limit = float("inf")
    repeats = args.repeats or (2 if args.dry_run else 1 if args.quick or args.warm else 3)
    out = args.out or os.environ.get("OUT") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S")
    rawdir = args.resume or os.path.join(out, f"raw-{stamp}")
    if args.resume and not os.path.isdir(args.resume):
        raise SystemExit(f"bench: --resume {args.resume}: no such folder (give the raw-<time> folder of the run)")
    os.makedirs(rawdir, exist_ok=True)
    env = dict(os.environ)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = here + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("PYTHONUNBUFFERED", "1")
    for flag, var in ((args.describe, "OPGRAPH_BENCH_DESCRIBE"), (args.steps, "OPGRAPH_BENCH_STEPS")):
        if flag:
            env[var] = "1"
    if args.dry_run:
        env["TRITON_INTERPRET"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""
    start, last = time.monotonic(), 0.0
    if args.gpus > 1:
        paths = run_spread(args, specs, repeats, rawdir, env, here)
        rc = finish(args, out, rawdir, paths)
        progress(args, rawdir, [(j.raw, j.ids) for j in spread_jobs(specs, repeats, rawdir, False)])
        return rc
    print(
        f"bench: {len(specs)} workload(s), {repeats} repeat(s), time limit {args.time_limit:.0f} s "
        f"(planned ~{sum(s.minutes for s in specs) * repeats:.0f} min with warm caches); raw -> {rawdir}",
        flush=True,
    )
    paths = []
    if args.warm_first and not args.warm:
        t0 = time.monotonic()
        warm = argparse.Namespace(**{**vars(args), "warm": True})
        try:
            subprocess.run(
                worker_argv(warm, 0, os.path.join(rawdir, "warm.json"), args.time_limit),
                env=env,
                cwd=here,
                check=False,
                timeout=None if args.time_limit == float("inf") else max(args.time_limit, 30),
            )
        except subprocess.TimeoutExpired:
            print("bench: the warm-up pass reached the time limit", flush=True)
        print(f"bench: warm-up pass {time.monotonic() - t0:.0f} s", flush=True)
    for i in range(1, repeats + 1):
        left = args.time_limit - (time.monotonic() - start)
        if i > 1 and last * 1.05 > left:
            print(f"bench: repeat {i} not started: {left:.0f} s left, the last took {last:.0f} s", flush=True)
            break
        raw = os.path.join(rawdir, f"repeat{i}.json")
        if done(raw, repeat_ids(specs, i)):  # (--resume)
            paths.append(raw)
            continue
        t0 = time.monotonic()
        try:
            subprocess.run(
                worker_argv(args, i, raw, left, repeat_ids(specs, i)),
                env=env,
                cwd=here,
                check=False,
                timeout=None if left == float("inf") else max(left, 30),
            )
        except subprocess.TimeoutExpired:
            print(f"bench: repeat {i} killed at the time limit (finished workloads kept)", flush=True)
        last = time.monotonic() - t0
        if os.path.exists(raw):
            paths.append(raw)
    rc = finish(args, out, rawdir, paths)
    progress(
        args, rawdir, [(os.path.join(rawdir, f"repeat{i}.json"), repeat_ids(specs, i)) for i in range(1, repeats + 1)]
    )
    return rc


def repeat_ids(specs: Sequence[registry.WorkloadSpec], repeat: int) -> list[str]:
    """The workloads repeat `repeat` runs: a correctness check that is not timed (`timed=False`) runs in
    the first repeat (and a warm-up pass) only, its result could not change."""
    return [s.id for s in specs if s.timed or repeat <= 1]


def progress(args: argparse.Namespace, rawdir: str, jobs: list[tuple[str, list[str]]]) -> None:
    """The run's last line: whether every timed (repeat, workloads) job finished, or how to go on."""
    if args.warm:
        return
    left = [raw for raw, ids in jobs if not done(raw, ids)]
    if left:
        print(
            f"bench: run incomplete: {len(left)} of {len(jobs)} timed job(s) not finished; go on with "
            f"--resume {rawdir} (same selection and flags)",
            flush=True,
        )
    else:
        print("bench: run complete", flush=True)


def done(raw: str, ids: list[str]) -> bool:
    """Whether the raw file `raw` holds every workload of `ids`, each run to its end (a resumed run
    starts no worker for it)."""
    if not os.path.exists(raw):
        return False
    got = {w.id for w in RunRecord.from_json(open(raw).read()).workloads if w.finished}
    return set(ids) <= got


@dataclasses.dataclass
class Job:
    repeat: int  # 0: the warm-up pass
    group: str
    ids: list[str]
    minutes: float
    raw: str
    alone: bool  # host-time rows: no cold job (compiles) and no other host-time job meanwhile
    cold: bool = False  # compiles and tunes from empty caches: the warm-up pass, or repeat 1 without one


def job_seconds(job: Job) -> float:
    """A job's expected seconds, for ordering (longest first): the group's measured cost (bench/core/costs.json,
    cold or warm caches), else the registry's minutes."""
    known = _costs().get(job.group)
    return float(known["cold" if job.cold else "warm"]) if known else job.minutes * 60


@functools.lru_cache(maxsize=1)
def _costs() -> dict[str, dict[str, float]]:
    with open(os.path.join(os.path.dirname(__file__), "core", "costs.json")) as f:
        return {k: v for k, v in json.load(f).items() if not k.startswith("_")}


def spread_jobs(specs: list[registry.WorkloadSpec], repeats: int, rawdir: str, warm_first: bool) -> list[Job]:
    """(repeat, group) jobs in the order they start: the cold jobs first (the warm-up pass of every group
    where asked, else repeat 1 of every group), longest first (`job_seconds`); then the timed repeats with
    warm caches group by group, longest group first, a group's repeats together (when the time ends first,
    the groups left short are few: a table needs 3 repeats, and 2 in every group make none); the timed
    repeats of groups that time the host first among those (they start once no other group's cold job runs
    or waits: `next_job`, which also may pass a job that does not fit in the time left)."""
    groups: dict[str, list[registry.WorkloadSpec]] = {}
    for s in specs:
        groups.setdefault(s.group, []).append(s)
    jobs = [
        Job(
            r,
            g,
            ids,
            sum(s.minutes for s in ss if s.id in ids),
            os.path.join(rawdir, f"{'warm' if r == 0 else f'repeat{r}'}-{g}.json"),
            g.startswith("host") and r > 0,
            r == 0 or (r == 1 and not warm_first),
        )
        for r in ([0] if warm_first else []) + list(range(1, repeats + 1))
        for g, ss in groups.items()
        if (ids := repeat_ids(ss, r))
    ]
    cold = sorted((j for j in jobs if j.cold), key=lambda j: -job_seconds(j))
    warm = sorted((j for j in jobs if not j.cold), key=lambda j: (-job_seconds(j), j.group, j.repeat))
    return (
        [j for j in cold if not j.alone]
        + [j for j in cold if j.alone]
        + [j for j in warm if j.alone]
        + [j for j in warm if not j.alone]
    )


def run_spread(
    args: argparse.Namespace,
    specs: list[registry.WorkloadSpec],
    repeats: int,
    rawdir: str,
    env: dict[str, str],
    here: str,
) -> list[str]:
    """Run the jobs on args.gpus GPUs, one worker process per GPU at a time; the raw files written."""
    every = spread_jobs(specs, repeats, rawdir, args.warm_first and not args.warm)
    jobs = [j for j in every if not done(j.raw, j.ids)]  # (--resume: what an earlier call finished)
    if args.warm:
        jobs = [
            dataclasses.replace(j, repeat=0, raw=j.raw.replace("repeat1-", "warm-"), alone=False, cold=True)
            for j in jobs
            if j.repeat == 1
        ]
    print(
        f"bench: {len(specs)} workload(s) in {len({j.group for j in every})} group(s), {repeats} repeat(s) over "
        f"{args.gpus} GPUs, {len(jobs)} of {len(every)} job(s) to run, time limit {args.time_limit:.0f} s (planned "
        f"~{sum(j.minutes for j in jobs) / args.gpus:.0f} min per GPU with warm caches); raw -> {rawdir}",
        flush=True,
    )

    devices = gpu_ids(env.get("CUDA_VISIBLE_DEVICES"), args.gpus)

    # each GPU's next worker waits ready (imports done) while the current job runs: bench/standby.py
    pool = StandbyPool(
        here, lambda gpu: {**env, "CUDA_VISIBLE_DEVICES": "" if args.dry_run else devices[gpu]}, core_slots(args.gpus)
    )

    def launch(job: Job, gpu: int, left: float) -> subprocess.Popen:
        sub = argparse.Namespace(**{**vars(args), "warm": job.repeat == 0})
        return pool.launch(worker_argv(sub, job.repeat, job.raw, left, job.ids), gpu)

    try:
        schedule(jobs, args.gpus, args.time_limit, launch)
    finally:
        pool.close()
    print(f"bench: {pool.handed} of {len(jobs)} job(s) ran in a worker started ahead", flush=True)
    # (every repeat's raw file so far: with --resume, those earlier calls finished too)
    return [j.raw for j in every if j.repeat > 0 and os.path.exists(j.raw)]


def gpu_ids(visible: str | None, gpus: int) -> list[str]:
    """The device each of the `gpus` worker slots gets: the i-th of the parent's CUDA_VISIBLE_DEVICES when it
    names at least `gpus` devices (so `CUDA_VISIBLE_DEVICES=2,3 ... --gpus 2` leaves GPUs 0 and 1 alone),
    else GPU i."""
    named = [d.strip() for d in (visible or "").split(",") if d.strip()]
    if visible is not None and named and len(named) < gpus:
        raise SystemExit(
            f"bench: --gpus {gpus} but CUDA_VISIBLE_DEVICES={visible!r} names {len(named)}: "
            f"name at least {gpus} devices or unset it"
        )
    return named[:gpus] if named else [str(i) for i in range(gpus)]


def fits(seconds: float, left: float, limit: float) -> bool:
    """Whether a job expected to take `seconds`, started with `left` of a call's `limit` seconds, runs to its
    end: the worker (given `left`) starts nothing after MARGIN_S before that, so it needs seconds + MARGIN_S.
    A job needing more than START_SHARE of a whole call fits while at least that share is left (the call's
    beginning, where the longest-first order puts it: the most time a call gives; cut, it goes on in the
    next call), so no call ever starves it. No limit (inf): everything fits."""
    return left == float("inf") or min(seconds + MARGIN_S, START_SHARE * limit) <= left


def next_job(
    pending: list[Job], running: list[Job], left: float = float("inf"), limit: float = float("inf")
) -> int | None:
    """Index in `pending` of the job to start now on a free GPU, `left` of the call's `limit` seconds left,
    or None. Eligible: a group's timed repeats start only after its cold job ended (the warm-up pass, or
    repeat 1 of a run without one: a repeat 2 beside it would compile the same kernels from cold caches at
    once). A host-time job (`alone`) starts only once no other group's cold job runs or waits (their
    compiles load every core; one waiting would start beside it) and no other host-time job runs; warm
    timed workers of other groups may run beside it (one process and core each on a many-core host) and
    may pass it while it waits: cold jobs come first in `spread_jobs`' order, so its wait ends. Of the
    eligible jobs, the first in `pending`'s order that `fits` (its `job_seconds`) in the time left; if
    none does, the shortest (what it finishes is kept, and it warms the caches): a job is not started late
    in a call, to be cut at its end and run again, while a shorter one would have finished."""
    cold = {j.group for j in (*pending, *running) if j.cold}
    compiling = {j.group for j in (*pending, *running) if j.cold and not j.alone}  # (host jobs: one at a time)
    host_busy = any(j.alone for j in running)
    eligible = [
        k
        for k, job in enumerate(pending)
        if (job.cold or job.group not in cold) and not (job.alone and (host_busy or compiling - {job.group}))
    ]
    if not eligible:
        return None
    for k in eligible:
        if fits(job_seconds(pending[k]), left, limit):
            return k
    return min(eligible, key=lambda k: job_seconds(pending[k]))


def schedule(
    jobs: list[Job],
    gpus: int,
    time_limit: float,
    launch: Callable[[Job, int, float], Any],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[Job]:
    """Run `jobs` on `gpus` GPUs, one at a time each: `launch(job, gpu, seconds left)` starts a worker and
    returns its process (poll(), kill()); `next_job` picks each (by the time left). Jobs not started 30 s
    before `time_limit` are dropped, workers still running 30 s after it are killed (a worker stops starting
    implementations MARGIN_S before it); a worker that fails or is killed frees its GPU. The parent
    never waits on a worker but through poll(): on an error here (Ctrl-C) the running workers are killed.
    The jobs that ended, in the order they ended."""
    start = clock()
    free = list(range(gpus))
    running: list[tuple[Any, int, Job, float]] = []
    pending = list(jobs)
    ended: list[Job] = []
    try:
        while pending or running:
            for item in list(running):
                proc, gpu, job, t0 = item
                rc = proc.poll()
                if rc is not None:
                    running.remove(item)
                    free.append(gpu)
                    ended.append(job)
                    print(
                        f"bench: {job.group} repeat {job.repeat} on GPU {gpu}: {clock() - t0:.0f} s"
                        + (f" (exit status {rc})" if rc else ""),
                        flush=True,
                    )
            left = time_limit - (clock() - start)
            if pending and left < 30:
                print(f"bench: {len(pending)} job(s) not started: {left:.0f} s left", flush=True)
                pending = []
            k = next_job(pending, [j for _, _, j, _ in running], left, time_limit) if free and pending else None
            if k is not None:
                job, gpu = pending.pop(k), free.pop(0)
                if not fits(job_seconds(job), left, time_limit):
                    print(
                        f"bench: {job.group} repeat {job.repeat} started with {left:.0f} s left, expected "
                        f"{job_seconds(job):.0f} s (no pending job fits; what it finishes is kept)",
                        flush=True,
                    )
                running.append((launch(job, gpu, left), gpu, job, clock()))
                continue
            sleep(0.2)
            if clock() - start > time_limit + 30:  # a worker past the limit: what it finished is kept
                for proc, _, _, _ in running:
                    if proc.poll() is None:
                        proc.kill()
    finally:
        for proc, _, _, _ in running:
            if proc.poll() is None:
                proc.kill()
    return ended


def merge_repeats(runs: list[RunRecord]) -> list[RunRecord]:
    """Spread workers' records (one group each) joined per repeat: one record per repeat."""
    by_repeat: dict[int, RunRecord] = {}
    for r in sorted(runs, key=lambda r: r.repeat):
        if r.repeat in by_repeat:
            by_repeat[r.repeat].workloads.extend(r.workloads)
        else:
            by_repeat[r.repeat] = r
    return list(by_repeat.values())


def finish(args: argparse.Namespace, out: str, rawdir: str, paths: list[str]) -> int:
    """Aggregate the repeats' raw files into the .json and .md of the suite."""
    if args.warm:
        print("bench: warm-up done (nothing timed)", flush=True)
        return 0
    runs = merge_repeats([RunRecord.from_json(open(p).read()) for p in paths])
    if args.gpus > 1:
        slots = core_slots(args.gpus)
        for r in runs:
            r.meta["spread_gpus"] = args.gpus
            if slots:
                r.meta["cores_per_worker"] = len(slots[0])
    runs = [r for r in runs if r.workloads]
    if not runs:
        print("bench: no results", file=sys.stderr)
        return 1
    agg = aggregate(runs)
    warms = [
        RunRecord.from_json(open(os.path.join(rawdir, p)).read())
        for p in sorted(os.listdir(rawdir))
        if p.startswith("warm") and p.endswith(".json")
    ]
    warm = merge_repeats(warms)[0] if warms else None
    name = f"{runs[0].meta.get('date')}-{slug(str(runs[0].meta.get('device')))}-{suite_name(args)}"
    title = f"{name}: `python -m bench.run {' '.join(sys.argv[1:])}`"
    md = render(agg, title, aggregate([warm]) if warm and warm.workloads else None)
    with open(os.path.join(out, name + ".json"), "w") as f:
        json.dump(
            {
                "schema": 2,
                "suite": suite_name(args),
                "command": sys.argv[1:],
                "runs": [json.loads(r.to_json()) for r in runs],
                "warm": json.loads(warm.to_json()) if warm else None,
            },
            f,
            indent=1,
        )
    with open(os.path.join(out, name + ".md"), "w") as f:
        f.write(md)
    print(md, flush=True)
    print(f"bench: wrote {os.path.join(out, name)}.json and .md", flush=True)
    return 0


def worker(args: argparse.Namespace) -> int:
    from .worker import run_worker

    return run_worker(args, selection(args))


def main(argv: list[str] | None = None) -> int:
    if (sys.argv[1:] if argv is None else argv) == [STANDBY_FLAG]:
        return serve(main)
    args = parse(argv)
    if args.list:
        print(list_workloads())
        return 0
    if args.worker:
        return worker(args)
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
