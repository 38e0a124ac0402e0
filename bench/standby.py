"""Workers started ahead of their jobs (`bench.run --gpus N`).

A spread run starts ~60 worker processes, each of which spent ~6 s before its first workload (Python,
PyTorch, Triton, torchvision and the cuDNN frontend imported) and exited after it: measured on four
H200s on 2026-11-26, ~400 worker-seconds of a run that missed its 30-minute budget by about that much.
So, on each GPU, the next worker is started while the current job runs: it imports everything, then
waits for its job's arguments on stdin (one JSON list, the `--worker` argv) and runs it as a fresh
`--worker` process would; EOF instead of a job ends it. Still one process per (repeat, group): a
process-level repeat. It does not touch the GPU before its job (no CUDA context beside a timed job)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any

STANDBY_FLAG = "--standby"


def warm_imports() -> None:
    """What a worker imports before its first workload, without initialising CUDA."""
    import torch  # noqa: F401

    from . import worker as _worker  # noqa: F401
    from . import workloads
    from .peers import cudnn_fe

    workloads.load()
    try:
        import torchvision  # noqa: F401
    except Exception:  # noqa: BLE001 - absent or built for another torch: the worker says so
        pass
    cudnn_fe.problem()


def serve(main: Callable[[list[str]], int]) -> int:
    """The standby process: imports, then one job from stdin run by `main` (bench.run's), or none."""
    warm_imports()
    line = sys.stdin.readline()
    if not line.strip():
        return 0
    return main(json.loads(line))


def core_slots(gpus: int, cores: Sequence[int] | None = None) -> list[list[int]] | None:
    """The host's cores (this process's affinity) cut into one equal, disjoint set per GPU slot, or None
    where a slot would get fewer than 2. A worker pinned to its slot's cores (its compile pools too:
    Inductor and opgraph size theirs by the affinity) cannot slow another GPU's worker down: host time
    in the execute, replay and latency rows is then not measured beside another worker's compiles."""
    cores = sorted(os.sched_getaffinity(0) if cores is None else cores)
    per = len(cores) // max(gpus, 1)
    if per < 2:
        return None
    return [cores[i * per : (i + 1) * per] for i in range(gpus)]


class StandbyPool:
    """One waiting worker per GPU slot. `launch(argv, gpu)` hands `argv` (a `--worker` command line:
    executable, -m, bench.run, args...) to the slot's waiting worker, or starts it fresh when there is
    none or it died, then starts the slot's next waiting worker; `close()` ends the waiting ones. With
    `cores`, each slot's workers run on that slot's cores only (`core_slots`)."""

    def __init__(self, cwd: str, env_of: Callable[[int], dict[str, str]], cores: list[list[int]] | None = None) -> None:
        self.cwd, self.env_of, self.cores = cwd, env_of, cores
        self.ready: dict[int, Any] = {}
        self.handed = 0  # jobs given to a waiting worker (the rest started fresh)

    def _pin(self, gpu: int) -> Callable[[], None] | None:
        if not self.cores:
            return None
        cores = self.cores[gpu]
        return lambda: os.sched_setaffinity(0, cores)

    def _popen(self, argv: list[str], gpu: int, **kw: Any) -> Any:
        return subprocess.Popen(argv, cwd=self.cwd, env=self.env_of(gpu), preexec_fn=self._pin(gpu), **kw)

    def _spawn(self, gpu: int) -> Any:
        return self._popen([sys.executable, "-m", "bench.run", STANDBY_FLAG], gpu, stdin=subprocess.PIPE, text=True)

    def launch(self, argv: list[str], gpu: int) -> Any:
        proc = self.ready.pop(gpu, None)
        if proc is not None:
            try:
                if proc.poll() is not None:
                    raise OSError("the waiting worker exited")
                proc.stdin.write(json.dumps(argv[3:]) + "\n")
                proc.stdin.close()
                self.handed += 1
            except (OSError, ValueError):  # (a dead worker's pipe)
                proc.kill()
                proc = None
        if proc is None:
            proc = self._popen(argv, gpu)
        self.ready[gpu] = self._spawn(gpu)
        return proc

    def close(self) -> None:
        for proc in self.ready.values():
            try:
                proc.stdin.close()
                proc.wait(timeout=10)
            except Exception:  # noqa: BLE001 - it is only waiting: end it
                proc.kill()
        self.ready.clear()
