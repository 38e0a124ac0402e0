"""One repeat of a suite in this process: environment, ceilings, then each workload in turn; the
record is rewritten after every workload, so a run cut short keeps what it finished."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import time
from typing import Any, Callable, Sequence

from . import measure
from .case import Ctx
from .core.aggregate import MACHINE_KEYS
from .core.floors import Ceilings
from .core.records import RunRecord
from .core.registry import WorkloadSpec
from .runner import log, run_workload

MARGIN_S = 25.0  # stop starting implementations this long before the worker's deadline


def features(args: argparse.Namespace) -> frozenset[str]:
    import torch

    out = set()
    cuda = torch.cuda.is_available() and not args.dry_run
    if cuda:
        out.add("cuda")
        if not args.no_compile:
            out.add("compile")
        from .peers import cudnn_fe

        if cudnn_fe.problem() is None:
            out.add("cudnn_frontend")
    try:
        import torchvision  # noqa: F401

        out.add("torchvision")
    except Exception:  # noqa: BLE001 - absent, or built for another torch
        pass
    out.update(lib for lib in ("transformers", "timm") if importlib.util.find_spec(lib) is not None)
    return frozenset(out)


def configure_torch(cuda: bool) -> None:
    import torch

    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        import torch._dynamo

        torch._dynamo.config.cache_size_limit = 64
    except Exception:  # noqa: BLE001
        pass


def write(record: RunRecord, path: str) -> None:
    _replace(path, record.to_json())


def _replace(path: str, text: str) -> None:
    """Write `text` to `path` whole or not at all (a reader never sees half a file)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def resumed(record: RunRecord, raw: str | None) -> set[str]:
    """Where this repeat's raw file exists (`bench.run --resume`: an earlier call ran part of it), its
    finished workloads go into `record` and their ids are returned: this process runs the others. The
    record keeps the first process's environment and notes how many processes it took."""
    if not raw or not os.path.exists(raw):
        return set()
    before = RunRecord.from_json(open(raw).read())
    kept = [w for w in before.workloads if w.finished]
    record.workloads.extend(kept)
    record.meta = {**before.meta, "processes": int(before.meta.get("processes", 1)) + 1}
    record.ceilings = before.ceilings or record.ceilings
    log(f"resumed {raw}: {len(kept)} finished workload(s) kept")
    return {w.id for w in kept}


def shared_ceilings(raw: str | None, meta: dict[str, Any], measure_now: Callable[[], Ceilings]) -> Ceilings:
    """The run's ceilings: measured by its first worker on the machine and kept beside the raw files
    (ceilings.json), read by the later ones (a worker otherwise spends ~5 s of copies and GEMMs on them,
    ~20 workers a repeat). Measured again where the file is from another machine or unreadable."""
    if not raw:
        return measure_now()
    path = os.path.join(os.path.dirname(os.path.abspath(raw)), "ceilings.json")
    machine = {k: str(meta.get(k)) for k in MACHINE_KEYS}
    try:
        with open(path) as f:
            kept = json.load(f)
        if kept["machine"] == machine:
            return Ceilings.from_dict(kept["ceilings"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    ceil = measure_now()
    _replace(path, json.dumps({"machine": machine, "ceilings": ceil.to_dict()}))
    return ceil


def run_worker(args: argparse.Namespace, specs: Sequence[WorkloadSpec]) -> int:
    import torch

    t_start = time.monotonic()
    feats = features(args)
    cuda = "cuda" in feats
    configure_torch(cuda)
    scale = "tiny" if args.dry_run else "quick" if args.quick else "full"
    quick = args.quick or args.dry_run  # smoke tests: no tuned builds, no torch.compile mode="max-autotune" row
    ctx = Ctx(
        device="cuda" if cuda else "cpu",
        scale=scale,
        tune=not (args.no_tune or quick),
        tune_networks=args.tune_networks,
        compile=not args.no_compile,
        compile_cudagraphs=not (args.no_compile_cudagraphs or quick),
        cold_l2=args.cold_l2,
        features=feats,
        timing=not args.warm,
        deadline=t_start + args.seconds - MARGIN_S if args.seconds else None,
    )
    budget = (
        measure.Budget(rounds=2, latency_calls=3)
        if args.dry_run
        else measure.Budget(rounds=3, latency_calls=10)
        if args.quick
        else measure.Budget()
    )
    from . import env

    meta = env.meta(ctx.device, dry_run=args.dry_run)
    meta.update(scale=scale, features=sorted(feats), warm=args.warm)
    log(f"bench worker, repeat {args.repeat_index}: {meta}")
    ceil = shared_ceilings(args.raw, meta, lambda: env.ceilings(ctx.device, budget))
    log(
        f"ceilings: copy {ceil.copy_gbps:.0f} GB/s, read {ceil.read_gbps or 0:.0f} GB/s, GEMM "
        + ", ".join(f"{k} {v:.0f} TFLOP/s" for k, v in ceil.gemm_tflops.items())
    )
    record = RunRecord(meta, ceil, [], args.repeat_index)
    done = resumed(record, args.raw)
    for spec in specs:
        if spec.id in done:
            continue
        if ctx.out_of_time():
            log(f"== {spec.id}: not started (time limit)")
            continue
        record.workloads.append(run_workload(ctx, spec, budget))
        if args.raw:
            write(record, args.raw)
        if cuda:
            torch.cuda.empty_cache()
    log(f"bench worker done in {time.monotonic() - t_start:.0f} s")
    return 0
