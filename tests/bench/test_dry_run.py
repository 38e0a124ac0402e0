"""The whole benchmark pipeline on the CPU (python -m bench.run --dry-run): worker processes, checks,
timing stand-ins, repeat aggregation, files. Wiring only: the numbers mean nothing here."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_dry_run_writes_checked_tables(tmp_path):
    env = {**os.environ, "PYTHONPATH": ROOT}
    cmd = [
        sys.executable,
        "-m",
        "bench.run",
        "--dry-run",
        "--suite",
        "memory.pointwise_dag.fp16",
        "conv.r50_1x1_c256_k64.fp16",
        "host.execute_tiny_conv",
        "--repeats",
        "2",
        "--no-tune",
        "--warm-first",
        "--out",
        str(tmp_path),
    ]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    md_files = [p for p in os.listdir(tmp_path) if p.endswith(".md")]
    json_files = [p for p in os.listdir(tmp_path) if p.endswith(".json")]
    assert len(md_files) == 1 and len(json_files) == 1
    data = json.load(open(tmp_path / json_files[0]))
    assert len(data["runs"]) == 2 and {r["repeat"] for r in data["runs"]} == {1, 2}
    assert data["warm"]["meta"]["warm"] and len(data["warm"]["workloads"]) == 3
    md = open(tmp_path / md_files[0]).read()
    assert "2 process-level repeat(s)" in md and "### Execute: plain calls" in md and "### Host time" in md
    assert "### Setup in the warm-up pass" in md
    for run in data["runs"]:
        by_id = {w["id"]: w for w in run["workloads"]}
        assert set(by_id) == {"memory.pointwise_dag.fp16", "conv.r50_1x1_c256_k64.fp16", "host.execute_tiny_conv"}
        dag = {i["impl"]: i for i in by_id["memory.pointwise_dag.fp16"]["impls"]}
        # every output of every implementation that ran was checked, ours and the peers' alike
        for name in ("opgraph", "generated", "torch eager"):
            assert set(dag[name]["errors"]) == {"y1", "y2"}, name
            assert dag[name]["verdict"]["passed"], (name, dag[name]["verdict"])
        assert dag["generated"]["engine"].startswith("triton")
        assert dag["torch.compile"]["status"] == "unavailable"
        assert "execute_us" in dag["opgraph"]["metrics"] and "setup_s" in dag["opgraph"]["metrics"]
        host = {i["impl"]: i for i in by_id["host.execute_tiny_conv"]["impls"]}
        assert "host_us" in host["opgraph"]["metrics"] and host["opgraph"]["verdict"]["passed"]
    # re-rendering the file gives the same tables
    again = subprocess.run(
        [sys.executable, "-m", "bench.report", str(tmp_path / json_files[0])],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert again.returncode == 0 and "### CUDA graph: device time" in again.stdout


def test_spread_jobs_order_repeats_and_put_host_rows_first_in_the_timed_phase():
    from bench import workloads
    from bench.core import registry
    from bench.run import spread_jobs

    workloads.load()
    specs = registry.REGISTRY.select(
        ["memory.pointwise_dag.fp16", "conv.r50_1x1_c256_k64.fp16", "host.execute_tiny_conv"]
    )
    jobs = spread_jobs(specs, 3, "/raw", warm_first=True)
    # the warm-up pass, then the host group's timed repeats (never beside a warm-up: next_job), then the
    # other groups' repeats group by group, the longer group (memory: bench/core/costs.json) first
    assert [j.repeat for j in jobs] == [0] * 3 + [1, 2, 3] * 3
    assert all(j.group == "host" and j.alone for j in jobs[3:6]) and not any(j.alone for j in jobs[6:] + jobs[:3])
    assert [j.group for j in jobs[6:]] == ["memory"] * 3 + ["conv-fp16"] * 3
    assert len({j.raw for j in jobs}) == len(jobs)
    # without a warm-up pass: every group's cold repeat 1 first (the host's last of them), then the same order
    jobs = spread_jobs(specs, 3, "/raw", warm_first=False)
    assert [(j.group, j.repeat) for j in jobs] == [
        ("memory", 1),
        ("conv-fp16", 1),
        ("host", 1),
        ("host", 2),
        ("host", 3),
        ("memory", 2),
        ("memory", 3),
        ("conv-fp16", 2),
        ("conv-fp16", 3),
    ]
    assert [j.cold for j in jobs] == [True] * 3 + [False] * 6


def test_a_check_that_is_not_timed_runs_in_the_first_repeat_only():
    """The training groups' float32 checks are set up and checked, never timed: a second repeat could
    not change them, so repeats 2 and 3 of the group run its timed workload alone."""
    from bench import workloads
    from bench.core import registry
    from bench.run import repeat_ids, spread_jobs

    workloads.load()
    specs = registry.REGISTRY.select(["training-resnet18"])
    assert [s.timed for s in specs] == [True, False]
    # one GPU: one worker per repeat, told its workloads
    assert repeat_ids(specs, 1) == [s.id for s in specs] and repeat_ids(specs, 3) == ["training.resnet18.b64"]
    for warm_first in (False, True):
        jobs = {j.repeat: j.ids for j in spread_jobs(specs, 3, "/raw", warm_first=warm_first)}
        assert jobs[1] == [s.id for s in specs] and jobs[2] == jobs[3] == ["training.resnet18.b64"]


def test_jobs_start_longest_first_by_the_measured_costs():
    """Each round is ordered by the groups' measured seconds (bench/core/costs.json), cold for a warm-up
    or a first repeat without one, warm otherwise; a group without a measurement by its registry minutes."""
    from bench import workloads
    from bench.core import registry
    from bench.run import job_seconds, spread_jobs

    workloads.load()
    specs = registry.REGISTRY.select(
        ["memory.pointwise_dag.fp16", "training.mobilenet_v2.b64", "attention.sdpa_bwd.s16k"]
    )
    cold = [j for j in spread_jobs(specs, 2, "/raw", warm_first=False) if j.repeat == 1]
    warm = [j for j in spread_jobs(specs, 2, "/raw", warm_first=False) if j.repeat == 2]
    assert [j.group for j in cold] == ["training-mobilenet_v2", "attention-bwd-16k", "memory"]
    assert all(j.cold for j in cold) and not any(j.cold for j in warm)
    assert job_seconds(cold[0]) > job_seconds(warm[0]) > 0
    assert [job_seconds(j) for j in warm] == sorted((job_seconds(j) for j in warm), reverse=True)


def test_a_family_of_groups_is_selected_by_its_name():
    from bench import workloads
    from bench.core import registry

    workloads.load()
    groups = registry.REGISTRY.groups()
    family = [g for g in groups if g.startswith("attention-")]
    assert len(family) >= 4 and "attention" not in groups  # spread over GPUs, selected as one
    got = {s.id for s in registry.REGISTRY.select(["attention"])}
    assert got == {i for g in family for i in groups[g]}
    assert {s.id for s in registry.REGISTRY.select(["attention-mod"])} == set(groups["attention-mod"])
    with pytest.raises(KeyError):
        registry.REGISTRY.select(["attent"])


@pytest.mark.slow
def test_dry_run_spread_over_two_gpus_merges_repeats(tmp_path):
    """--gpus 2: one worker process per (repeat, group), two at a time; the tables as from one worker per
    repeat (each repeat holds every workload), the header says how the run was spread."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    cmd = [
        sys.executable,
        "-m",
        "bench.run",
        "--dry-run",
        "--suite",
        "memory.pointwise_dag.fp16",
        "conv.r50_1x1_c256_k64.fp16",
        "host.execute_tiny_conv",
        "--repeats",
        "2",
        "--no-tune",
        "--warm-first",
        "--gpus",
        "2",
        "--out",
        str(tmp_path),
    ]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    json_files = [p for p in os.listdir(tmp_path) if p.endswith(".json")]
    data = json.load(open(tmp_path / json_files[0]))
    assert sorted(r["repeat"] for r in data["runs"]) == [1, 2]
    for run in data["runs"]:
        assert {w["id"] for w in run["workloads"]} == {
            "memory.pointwise_dag.fp16",
            "conv.r50_1x1_c256_k64.fp16",
            "host.execute_tiny_conv",
        }
        assert run["meta"]["spread_gpus"] == 2
    assert len(data["warm"]["workloads"]) == 3
    md = open(tmp_path / json_files[0].replace(".json", ".md")).read()
    assert "2 process-level repeat(s)" in md and "Spread over 2 GPUs" in md
    assert out.stdout.rstrip().splitlines()[-1] == "bench: run complete"
    handed = re.search(r"bench: (\d+) of (\d+) job\(s\) ran in a worker started ahead", out.stdout)
    assert handed and 0 < int(handed.group(1)) < int(handed.group(2))  # (each GPU's first job starts fresh)
    # --resume of the finished run starts no worker and writes the same tables over every repeat
    (rawdir,) = [tmp_path / p for p in os.listdir(tmp_path) if p.startswith("raw-")]
    os.remove(tmp_path / json_files[0])
    again = subprocess.run(
        [*cmd, "--resume", str(rawdir)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "bench worker" not in again.stdout + again.stderr and again.stdout.rstrip().endswith("bench: run complete")
    resumed = json.load(open(tmp_path / json_files[0]))
    assert sorted(r["repeat"] for r in resumed["runs"]) == [1, 2]
    assert all(len(r["workloads"]) == 3 for r in resumed["runs"])


# -- the --gpus scheduler, on fake workers and a fake clock (pure Python) ----------------------------


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


class _Proc:
    """A worker that exits with `rc` after `seconds` (None: never, until killed)."""

    def __init__(self, clock: _Clock, seconds: float | None, rc: int = 0) -> None:
        self.clock, self.end, self.rc, self.killed = clock, None if seconds is None else clock.t + seconds, rc, False

    def poll(self) -> int | None:
        if self.killed:
            return -9
        return self.rc if self.end is not None and self.clock.t >= self.end else None

    def kill(self) -> None:
        self.killed = True


def _job(repeat, group, alone=False, minutes=1.0, cold=None):
    """A job of a group without a measured cost: expected `minutes` * 60 s (`job_seconds`); cold: a
    warm-up pass unless told."""
    from bench.run import Job

    return Job(
        repeat,
        group,
        [group],
        minutes,
        f"/raw/{repeat}-{group}.json",
        alone,
        cold=repeat == 0 if cold is None else cold,
    )


def _run(jobs, gpus, limit, seconds, rc=None):
    """schedule() on fake workers lasting seconds[(repeat, group)]: [(event, time, job, gpu)]."""
    from bench.run import schedule

    clock, events, procs = _Clock(), [], {}

    def launch(job, gpu, left):
        events.append(("start", clock.t, (job.repeat, job.group), gpu))
        procs[(job.repeat, job.group)] = _Proc(clock, seconds[(job.repeat, job.group)], (rc or {}).get(job.group, 0))
        return procs[(job.repeat, job.group)]

    ended = schedule(jobs, gpus, limit, launch, clock=clock, sleep=clock.sleep)
    return events, ended, procs, clock


def test_schedule_waits_for_a_groups_warm_up_before_its_timed_repeats():
    """Warm-up of a (long) then b on 2 GPUs: b's warm-up ends first, but a's repeat 1 must not start
    beside a's own warm-up (cold caches, two compiles of the same kernels); b's may."""
    jobs = [_job(0, "a"), _job(0, "b"), _job(1, "a"), _job(1, "b")]
    events, ended, _, _ = _run(jobs, 2, float("inf"), {(0, "a"): 10, (0, "b"): 1, (1, "a"): 1, (1, "b"): 1})
    start = {key: t for _, t, key, _ in events}
    assert start[(1, "a")] >= 10 and start[(1, "b")] < 2, events
    assert len(ended) == 4


def test_schedule_host_job_waits_for_warm_ups_not_for_timed_workers():
    """The host-time job starts once the last warm-up pass ended (compiles load every core), beside timed
    workers of other groups; two host-time jobs never overlap; timed jobs pass it while it waits."""
    jobs = [
        _job(0, "a"),
        _job(0, "b"),
        _job(0, "host"),
        _job(1, "host", alone=True),
        _job(2, "host", alone=True),
        _job(1, "b"),
        _job(1, "a"),
    ]
    secs = {(0, "a"): 5, (0, "b"): 1, (0, "host"): 1, (1, "host"): 3, (2, "host"): 3, (1, "b"): 10, (1, "a"): 1}
    events, ended, _, _ = _run(jobs, 4, float("inf"), secs)
    start = {key: t for _, t, key, _ in events}
    assert start[(1, "b")] < 5 and start[(1, "host")] >= 5  # b's timed repeat passed it during a's warm-up
    assert start[(2, "host")] >= start[(1, "host")] + 3
    assert start[(1, "host")] < start[(1, "b")] + 10  # beside b's timed repeat, not after it
    assert len(ended) == 7


def test_schedule_more_jobs_than_gpus_and_failing_workers_end():
    """A failed worker (exit status 1) frees its GPU like a finished one; every job runs once, never
    two on one GPU at a time."""
    jobs = [_job(1, g) for g in "abcdef"]
    secs = {(1, g): 1 + i for i, g in enumerate("abcdef")}
    events, ended, _, clock = _run(jobs, 2, float("inf"), secs, rc={"b": 1, "c": 1})
    assert sorted(k for _, _, k, _ in events) == sorted((1, g) for g in "abcdef") and len(ended) == 6
    busy: dict[int, float] = {}
    for _, t, key, gpu in events:
        assert t >= busy.get(gpu, 0.0), events
        busy[gpu] = t + secs[key]
    assert clock.t < 40  # no waiting beyond the work itself (7 + 9 + 11 s per GPU at worst, ticks 0.2 s)


def test_schedule_time_limit_drops_jobs_and_kills_a_hung_worker():
    """A worker that never exits is killed 30 s past the limit; jobs not started 30 s before it are
    dropped; the loop returns (no hang)."""
    jobs = [_job(1, "a"), _job(1, "b"), _job(2, "a")]
    events, ended, procs, clock = _run(jobs, 1, 100.0, {(1, "a"): None, (1, "b"): 1, (2, "a"): 1})
    assert [k for _, _, k, _ in events] == [(1, "a")]
    assert procs[(1, "a")].killed and 130 <= clock.t < 132
    assert [(j.repeat, j.group) for j in ended] == [(1, "a")]


def test_schedule_kills_running_workers_when_the_parent_fails():
    from bench.run import schedule

    clock, procs = _Clock(), []

    def launch(job, gpu, left):
        procs.append(_Proc(clock, None))
        return procs[-1]

    def sleep(s):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        schedule([_job(1, "a"), _job(1, "b")], 2, float("inf"), launch, clock=clock, sleep=sleep)
    assert len(procs) == 2 and all(p.killed for p in procs)


def test_without_a_warm_up_pass_host_rows_wait_for_the_cold_first_repeats():
    """No --warm-first: repeat 1 of every group compiles from empty caches, so the host-time rows wait for
    those (another group's repeat 2, its repeat 1 done, may pass them; the compiling group's own repeat 2
    waits too); with --warm, the host group's warm-up is an ordinary job."""
    from bench import workloads
    from bench.core import registry
    from bench.run import next_job, spread_jobs

    workloads.load()
    specs = registry.REGISTRY.select(
        ["memory.pointwise_dag.fp16", "conv.r50_1x1_c256_k64.fp16", "host.execute_tiny_conv"]
    )
    jobs = spread_jobs(specs, 2, "/raw", warm_first=False)
    host1 = next(j for j in jobs if j.alone and j.repeat == 1)
    cold_memory = next(j for j in jobs if j.group == "memory" and j.repeat == 1)
    memory2 = next(j for j in jobs if j.group == "memory" and j.repeat == 2)
    conv2 = next(j for j in jobs if j.group.startswith("conv") and j.repeat == 2)
    assert cold_memory.cold and not any(j.cold for j in jobs if j.repeat == 2)
    assert next_job([host1, conv2], [cold_memory]) == 1  # the host job waits; a warm repeat behind it passes
    assert next_job([host1, memory2], [cold_memory]) is None  # memory's repeat 2 waits for its cold repeat 1
    assert next_job([host1], [cold_memory]) is None and next_job([host1], []) == 0
    # nor while another group's cold repeat waits to start (it would start beside the host rows); the host
    # group's own cold repeat 1 does not hold it back
    assert next_job([host1, cold_memory], []) == 1
    assert next_job([host1, conv2], []) == 0


def test_next_job_host_rows_never_beside_a_warm_up_or_each_other():
    from bench.run import next_job

    pending = [_job(1, "host", alone=True), _job(2, "a")]
    assert next_job(pending, [_job(0, "b")]) == 1  # a warm-up runs: host waits, 2/a passes it
    assert next_job(pending, [_job(1, "b")]) == 0  # beside a timed worker
    assert next_job([_job(2, "host", alone=True)], [_job(1, "host", alone=True)]) is None
    assert (
        next_job(
            [_job(1, "host", alone=True)],
            [],
        )
        == 0
    )


def test_schedule_starts_a_short_job_near_the_calls_end_not_a_long_one():
    """Late in a call a free GPU takes the first pending job that fits in the time left (its expected
    seconds + the worker's MARGIN_S), not a longer one ahead of it that the call's end would cut."""
    from bench.run import MARGIN_S, next_job

    long, short = _job(1, "long", minutes=5.0), _job(1, "short", minutes=1.0)  # 300 s, 60 s expected
    assert next_job([long, short], [], 140.0, 540.0) == 1
    assert next_job([long, short], [], 300 + MARGIN_S, 540.0) == 0  # just fits: the existing order
    assert next_job([long, short], [], 300 + MARGIN_S - 1, 540.0) == 1  # the worker's margin counts
    jobs = [_job(1, "first", minutes=6.0), long, short]
    events, ended, _, _ = _run(jobs, 1, 540.0, {(1, "first"): 400, (1, "long"): 300, (1, "short"): 60})
    start = {key: t for _, t, key, _ in events}
    assert 400 <= start[(1, "short")] < 401 and start[(1, "long")] >= start[(1, "short")] + 60, events


def test_when_nothing_fits_the_shortest_eligible_job_starts():
    """No pending job fits in the time left: the shortest eligible one starts (what it finishes is kept,
    and it warms the caches); an ineligible one (a repeat 2 whose cold repeat 1 runs) is not taken."""
    from bench.run import next_job

    pending = [
        _job(1, "a", minutes=5.0),
        _job(1, "b", minutes=3.0),
        _job(2, "c", minutes=0.5),
        _job(1, "d", minutes=2.0),
        _job(1, "e", minutes=4.0),
    ]
    assert next_job(pending, [_job(1, "c", cold=True)], 60.0, 540.0) == 3  # 120 s, not c's repeat 2 (30 s)
    assert next_job(pending, [], 60.0, 540.0) == 2  # c's repeat 1 done: its repeat 2 is the shortest
    jobs = [_job(1, "first", minutes=7.5), _job(1, "a", minutes=5.0), _job(1, "b", minutes=3.0)]
    events, _, procs, _ = _run(jobs, 1, 540.0, {(1, "first"): 480, (1, "a"): 300, (1, "b"): 180})
    assert [k for _, _, k, _ in events] == [(1, "first"), (1, "b")] and procs[(1, "b")].killed, events


def test_a_job_longer_than_a_call_starts_at_the_calls_beginning():
    """A job expected to take more than a whole call fits while most of the call is left (START_SHARE),
    so the longest-first order starts it first and the fit rule never starves it; later in the call a
    shorter one passes it."""
    from bench.run import START_SHARE, next_job

    huge, small = _job(1, "huge", minutes=12.0), _job(1, "small", minutes=1.0)  # 720 s > a 540-s call
    assert next_job([huge, small], [], 540.0, 540.0) == 0
    assert next_job([huge, small], [], START_SHARE * 540.0, 540.0) == 0
    assert next_job([huge, small], [], START_SHARE * 540.0 - 1, 540.0) == 1
    assert next_job([huge], [], 100.0, 540.0) == 0  # alone, it still starts (nothing else to run)
    events, _, procs, _ = _run([huge, small], 2, 540.0, {(1, "huge"): None, (1, "small"): 60})
    assert [(t, k) for _, t, k, _ in events] == [(0.0, (1, "huge")), (0.0, (1, "small"))]
    events, _, _, _ = _run([huge, small], 1, 540.0, {(1, "huge"): 600, (1, "small"): 60})
    assert [k for _, _, k, _ in events] == [(1, "huge")]  # then past the limit: small is dropped


def test_a_groups_repeat_2_waits_for_its_cold_repeat_1():
    """No warm-up pass: repeat 2 of a group does not start beside its repeat 1 (cold caches, the same
    compiles twice at once) but after it; other groups' repeat 2 pass it meanwhile."""
    jobs = [_job(1, "a", cold=True), _job(1, "b", cold=True), _job(2, "a"), _job(2, "b"), _job(2, "c")]
    secs = {(1, "a"): 10, (1, "b"): 1, (2, "a"): 1, (2, "b"): 1, (2, "c"): 1}
    events, ended, _, _ = _run(jobs, 2, float("inf"), secs)
    start = {key: t for _, t, key, _ in events}
    assert start[(2, "a")] >= 10 and start[(2, "b")] < 2 and start[(2, "c")] < 3, events
    assert len(ended) == 5


def test_without_a_time_limit_jobs_start_in_their_order():
    """--time-limit 0 (inf): every job fits, so the order is `spread_jobs`' (eligibility aside), however
    long a job is expected to take; with a limit the same jobs start shortest first late in a call."""
    from bench.run import next_job

    pending = [_job(1, "a", minutes=60.0), _job(1, "b", minutes=1.0)]
    assert next_job(pending, []) == next_job(pending, [], float("inf"), float("inf")) == 0
    assert next_job(pending, [], 100.0, 540.0) == 1
    jobs = [_job(1, g, minutes=m) for g, m in zip("abcd", (1.0, 30.0, 2.0, 20.0))]
    events, ended, _, _ = _run(jobs, 1, float("inf"), {(1, g): 5 for g in "abcd"})
    assert [k for _, _, k, _ in events] == [(1, g) for g in "abcd"] and len(ended) == 4


def test_merge_repeats_joins_groups_and_warm_files():
    """Per-group raw files of one repeat (and of the warm-up) become one record each."""
    from bench.core.records import RunRecord, WorkloadResult
    from bench.run import merge_repeats

    def rec(repeat, ids):  # as a worker writes it and finish() reads it back
        text = RunRecord({"device": "cpu"}, None, [WorkloadResult(i, i, i) for i in ids], repeat).to_json()
        return RunRecord.from_json(text)

    merged = merge_repeats([rec(2, ["b"]), rec(1, ["a"]), rec(1, ["b"]), rec(2, ["a"])])
    assert [r.repeat for r in merged] == [1, 2]
    assert [sorted(w.id for w in r.workloads) for r in merged] == [["a", "b"], ["a", "b"]]
    warm = merge_repeats([rec(0, ["a"]), rec(0, ["host"])])
    assert len(warm) == 1 and len(warm[0].workloads) == 2


def test_done_and_progress_know_a_cut_job(tmp_path, capsys):
    """A spread run's (repeat, group) job is done when its raw file holds each of its workloads run to
    the end; one cut by the time limit, or missing, leaves the run incomplete (and says how to go on)."""
    from bench.core.records import ImplResult, RunRecord, WorkloadResult
    from bench.run import done, progress

    def write(name, workloads):
        (tmp_path / name).write_text(RunRecord({"device": "cpu"}, None, workloads, 1).to_json())
        return str(tmp_path / name)

    cut = WorkloadResult(
        "b", "b", "g", impls=[ImplResult("opgraph", "ours", status="skipped", error="time limit reached")]
    )
    whole = write("repeat1-g.json", [WorkloadResult("a", "a", "g"), WorkloadResult("b", "b", "g")])
    partial = write("repeat2-g.json", [WorkloadResult("a", "a", "g"), cut])
    assert done(whole, ["a", "b"]) and not done(partial, ["a", "b"]) and done(partial, ["a"])
    assert not done(str(tmp_path / "repeat3-g.json"), ["a"])
    timed = argparse.Namespace(warm=False)
    progress(timed, str(tmp_path), [(whole, ["a", "b"]), (partial, ["a", "b"])])
    assert f"1 of 2 timed job(s) not finished; go on with --resume {tmp_path}" in capsys.readouterr().out
    progress(timed, str(tmp_path), [(whole, ["a", "b"])])
    assert "bench: run complete" in capsys.readouterr().out
    progress(argparse.Namespace(warm=True), str(tmp_path), [(partial, ["a", "b"])])  # a warm-up pass times nothing
    assert capsys.readouterr().out == ""


def test_gpu_ids_follow_the_parents_visible_devices():
    from bench.run import gpu_ids

    assert gpu_ids(None, 2) == ["0", "1"]
    assert gpu_ids("", 2) == ["0", "1"]
    assert gpu_ids("2,3", 2) == ["2", "3"]
    assert gpu_ids(" 1, 3 ,5", 2) == ["1", "3"]
    with pytest.raises(SystemExit, match="names 1"):
        gpu_ids("3", 2)


@pytest.mark.slow
def test_resume_keeps_finished_workloads_and_runs_the_rest(tmp_path):
    """`--resume RAWDIR`: a later call goes on with a run an earlier call's time limit cut (a suite larger
    than one device call, run over several calls on one warm machine). Simulated: the first call's raw
    file loses one workload and another is marked cut by the time limit; the resumed call runs those
    two, keeps the third as it was, and writes tables over all three."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    ids = ["memory.pointwise_chain.fp16", "memory.pointwise_dag.fp16", "host.execute_tiny_conv"]  # (run order)
    base = [
        sys.executable,
        "-m",
        "bench.run",
        "--dry-run",
        "--suite",
        *ids,
        "--repeats",
        "1",
        "--no-tune",
        "--out",
        str(tmp_path),
    ]
    first = subprocess.run(base, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    (rawdir,) = [tmp_path / p for p in os.listdir(tmp_path) if p.startswith("raw-")]
    raw = rawdir / "repeat1.json"
    rec = json.load(open(raw))
    assert [w["id"] for w in rec["workloads"]] == ids
    kept = rec["workloads"][0]
    cut = rec["workloads"][2]
    cut["impls"][-1].update(status="skipped", error="time limit reached")
    rec["workloads"] = [kept, cut]  # the DAG never started
    json.dump(rec, open(raw, "w"))
    for p in os.listdir(tmp_path):
        if not p.startswith("raw-"):
            os.remove(tmp_path / p)
    again = subprocess.run(
        [*base, "--resume", str(rawdir)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "1 finished workload(s) kept" in again.stdout + again.stderr
    after = json.load(open(raw))
    assert sorted(w["id"] for w in after["workloads"]) == sorted(ids)
    assert after["workloads"][0] == kept  # as the first call left it, not run again
    assert after["meta"]["processes"] == 2
    assert all(i["status"] != "skipped" for w in after["workloads"] for i in w["impls"])
    (json_file,) = [p for p in os.listdir(tmp_path) if p.endswith(".json")]
    (run,) = json.load(open(tmp_path / json_file))["runs"]
    assert {w["id"] for w in run["workloads"]} == set(ids)
    # a third call finds everything done and starts no worker
    third = subprocess.run(
        [*base, "--resume", str(rawdir)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert third.returncode == 0 and "resumed" not in third.stdout + third.stderr, third.stdout[-2000:]
    assert "bench: run complete" in third.stdout and "bench: run complete" in again.stdout
    assert "run incomplete" not in first.stdout


def test_two_host_time_groups_without_a_warm_up_do_not_wait_for_each_other():
    """Each host group's cold repeat 1 is also a host-time job: they run one at a time, never waiting for
    each other's compile (which would wait forever)."""
    from bench.run import next_job

    a1, b1 = _job(1, "host-a", alone=True, cold=True), _job(1, "host-b", alone=True, cold=True)
    assert next_job([a1, b1], []) == 0
    assert next_job([b1], [a1]) is None  # (one host job at a time)
    assert next_job([a1, _job(1, "memory", cold=True)], []) == 1  # a compiling group still holds them


# -- workers started ahead of their jobs (bench/standby.py) -----------------------------------------------


class _FakeProc:
    def __init__(self, argv, cwd=None, env=None, stdin=None, text=None, preexec_fn=None):
        import io

        self.argv, self.env, self.killed, self.exit = argv, env, False, None
        self.stdin = io.StringIO() if stdin is not None else None
        self.sent = []
        if self.stdin is not None:
            self.stdin.close = lambda: self.sent.append(self.stdin.getvalue())

    def poll(self):
        return self.exit

    def kill(self):
        self.killed = True

    def wait(self, timeout=None):
        return 0


def test_standby_pool_hands_jobs_to_waiting_workers_and_replaces_dead_ones(monkeypatch):
    from bench import standby

    started = []
    monkeypatch.setattr(standby.subprocess, "Popen", lambda *a, **k: started.append(_FakeProc(*a, **k)) or started[-1])
    pool = standby.StandbyPool("/repo", lambda gpu: {"CUDA_VISIBLE_DEVICES": str(gpu)})
    argv = [sys.executable, "-m", "bench.run", "--worker", "--raw", "r1"]
    first = pool.launch(argv, 1)  # nothing waits yet: started fresh, then a waiting worker for GPU 1
    assert first.argv == argv and first.env == {"CUDA_VISIBLE_DEVICES": "1"} and pool.handed == 0
    waiting = pool.ready[1]
    assert waiting.argv[-1] == standby.STANDBY_FLAG and waiting.env == {"CUDA_VISIBLE_DEVICES": "1"}
    second = pool.launch([*argv[:-1], "r2"], 1)  # the waiting worker takes it: the args after `-m bench.run`
    assert second is waiting and waiting.sent == [json.dumps(["--worker", "--raw", "r2"]) + "\n"]
    assert pool.handed == 1
    pool.ready[1].exit = 1  # the next waiting worker died: killed, the job started fresh
    dead = pool.ready[1]
    third = pool.launch([*argv[:-1], "r3"], 1)
    assert dead.killed and third.argv[-1] == "r3" and third is not dead and pool.handed == 1
    pool.close()
    assert pool.ready == {}


def test_a_standby_worker_runs_the_job_it_reads_or_exits_on_eof(monkeypatch):
    import io

    from bench import standby

    monkeypatch.setattr(standby, "warm_imports", lambda: None)
    ran = []
    monkeypatch.setattr(standby.sys, "stdin", io.StringIO(json.dumps(["--worker", "--raw", "r"]) + "\n"))
    assert standby.serve(lambda argv: ran.append(argv) or 7) == 7 and ran == [["--worker", "--raw", "r"]]
    monkeypatch.setattr(standby.sys, "stdin", io.StringIO(""))
    assert standby.serve(lambda argv: ran.append(argv) or 7) == 0 and len(ran) == 1


def test_a_long_selection_is_named_by_whole_group_names():
    """The results file's name keeps whole names and counts the rest (suite-e's was cut mid-word:
    "...+attention-mod+attentio")."""
    from bench.run import parse, suite_name

    args = parse(["conv", "memory", "host", "matmul", "attention-fwd", "attention-mod", "attention-bwd"])
    name = suite_name(args)
    assert name == "conv+memory+host+matmul+attention-fwd+attention-mod+1-more" and len(name) <= 60
    assert suite_name(parse(["conv", "memory"])) == "conv+memory"
    fits = ["a" * 29, "b" * 30]  # 60 characters joined: whole, no "+N-more"
    assert suite_name(parse(fits)) == "+".join(fits)
    assert suite_name(parse(["--name", "suite-e", "conv"])) == "suite-e"
    assert suite_name(parse(["x" * 70, "y"])) == "x" * 70 + "+1-more"  # a first name alone is kept whole
