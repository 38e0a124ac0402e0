"""A pool of compile-worker processes (compile_worker.py) fed JSON jobs through pipes.

Workers are separate interpreters started with `sys.executable` (as torch.compile starts its
compile workers): no fork of a process holding CUDA and PyTorch's threads, and no re-import of the
user's `__main__`, which `multiprocessing`'s spawn would do. The pool is sized to the machine's cores
(`OPGRAPH_COMPILE_WORKERS` overrides), started on first use and kept for later builds of the process.
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .compile_worker import PATH_ENV

WORKER = Path(__file__).with_name("compile_worker.py")


def default_size() -> int:
    env = os.environ.get("OPGRAPH_COMPILE_WORKERS")
    if env:
        return max(1, int(env))
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _compile_env(env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """What of a worker's environment its compiles depend on: Triton's, CUDA's and LLVM's variables, the
    paths it finds programs, libraries, modules and Triton's default cache (HOME) on (not the rest:
    pytest, for one, sets a variable per test)."""
    keep = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "HOME", "XDG_CACHE_HOME", "CC", PATH_ENV)
    prefixes = ("TRITON_", "CUDA_", "PTXAS", "OPGRAPH_", "LLVM_", "NVPTX_", "DISABLE_", "USE_IR_LOC")
    return tuple(sorted((k, v) for k, v in env.items() if k in keep or k.startswith(prefixes)))


class _Worker:
    def __init__(self, env: dict[str, str]) -> None:
        self.stderr = tempfile.TemporaryFile()  # (what a compiler that aborts says last, read if it dies)
        self.proc = subprocess.Popen(
            [sys.executable, "-u", str(WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            env=env,
            bufsize=0,
        )
        self.env = env
        self.buffer = b""
        self.job: dict[str, Any] | None = None

    def death(self) -> str:
        """Why the worker ended: its exit status (the signal's name) and the last lines it wrote to stderr."""
        status = self.proc.wait()
        why = f"status {status}"
        if status < 0:
            try:
                why += f", {signal.Signals(-status).name}"
            except ValueError:
                pass
        try:
            self.stderr.seek(0, os.SEEK_END)
            self.stderr.seek(max(0, self.stderr.tell() - 1500))
            tail = self.stderr.read().decode(errors="replace").strip().splitlines()[-6:]
        except OSError:
            tail = []
        return why + (": " + " | ".join(tail) if tail else "")

    def send(self, job: dict[str, Any]) -> None:
        self.job = job
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(job) + "\n").encode())
        self.proc.stdin.flush()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
        self.stderr.close()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.stderr.close()


class WorkerPool:
    def __init__(self, size: int) -> None:
        self.size = size
        self.workers: list[_Worker] = []
        self.lock = threading.Lock()

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("TRITON_INTERPRET", None)  # workers compile for the GPU
        env[PATH_ENV] = json.dumps([os.path.abspath(p) if p else os.getcwd() for p in sys.path])
        return env

    def run(self, jobs: Sequence[dict[str, Any]], done: Callable[[dict[str, Any], dict[str, Any]], None]) -> None:
        """Run every job (each a dict with a unique "id"), calling `done(job, answer)` as each finishes.
        A worker that dies takes its job with it: the answer says so (its status and last stderr lines),
        and a fresh worker replaces it. Left early (an interrupt, a raising `done`), the workers still
        busy are killed, so no later run reads a stale answer. One run at a time (not reentrant)."""
        with self.lock:
            try:
                self._run(jobs, done)
            except BaseException:
                for w in [w for w in self.workers if w.job is not None]:
                    w.kill()
                    self.workers.remove(w)
                raise

    def _run(self, jobs: Sequence[dict[str, Any]], done: Callable[[dict[str, Any], dict[str, Any]], None]) -> None:
        pending = list(jobs)
        env = self._env()
        want = min(self.size, len(pending))
        # a worker started under another compile environment (TRITON_CACHE_DIR changed since) would write
        # its binary where this process does not look: replaced
        wanted, kept = _compile_env(env), []
        for w in self.workers:
            if w.alive() and _compile_env(w.env) == wanted:
                kept.append(w)
            else:
                w.close()  # (a dead one too: its stderr file)
        self.workers = kept
        while len(self.workers) < want:
            self.workers.append(_Worker(env))
        sel = selectors.DefaultSelector()
        for w in self.workers:
            assert w.proc.stdout is not None
            sel.register(w.proc.stdout, selectors.EVENT_READ, w)
        busy = 0
        for w in self.workers:
            if pending:
                w.send(pending.pop(0))
                busy += 1
        while busy:
            for key, _ in sel.select():
                w = key.data
                chunk = os.read(key.fileobj.fileno(), 1 << 16)  # type: ignore[union-attr]
                if not chunk:  # the worker died
                    sel.unregister(key.fileobj)
                    job, w.job = w.job, None
                    busy -= 1
                    if job is not None:
                        done(
                            job,
                            {
                                "id": job["id"],
                                "ok": False,
                                "error": f"the compile worker exited ({w.death()})",
                            },
                        )
                    self.workers.remove(w)
                    w.stderr.close()
                    if pending:
                        fresh = _Worker(env)
                        self.workers.append(fresh)
                        assert fresh.proc.stdout is not None
                        sel.register(fresh.proc.stdout, selectors.EVENT_READ, fresh)
                        fresh.send(pending.pop(0))
                        busy += 1
                    continue
                w.buffer += chunk
                while b"\n" in w.buffer:
                    line, w.buffer = w.buffer.split(b"\n", 1)
                    answer = json.loads(line)
                    job, w.job = w.job, None
                    busy -= 1
                    if job is not None:
                        done(job, answer)
                    if pending:
                        w.send(pending.pop(0))
                        busy += 1
        sel.close()

    def close(self) -> None:
        for w in self.workers:
            w.close()
        self.workers = []


_POOL: WorkerPool | None = None
_POOL_LOCK = threading.Lock()


def shared_pool() -> WorkerPool:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = WorkerPool(default_size())
            atexit.register(_POOL.close)
        return _POOL
