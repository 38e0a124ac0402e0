"""Autotuning: time every candidate config of a piece on the real device and keep the fastest,
remembering the answer on disk.

Candidates are whole pieces (a fused kernel with its prologue and epilogue, not the main op alone),
timed over buffers of the piece's own dims, strides and types. The cache key hashes everything that
can change the answer: the piece's signature (ops, attributes, shapes, strides, types), the device and
its compute capability, and the versions of opgraph, PyTorch, Triton and CUDA. A second build of the
same graph in a new process finds every piece in the cache and times nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..core.cache import describe, fault, locked, unwritable, write_atomic
from ..core.config import EngineConfig
from ..core.device import Device
from ..core.errors import ExecutionError, GraphError, UnsupportedGraphError
from ..core.piece import Piece
from ..engines import get_engine
from ..engines.base import Binding, Kernel, Launcher
from ..memory.addresses import TABLE_KEY, AddressTable
from ..memory.buffers import address_of
from .filters import ConfigFilter

log = logging.getLogger("opgraph.autotune")


def cache_path() -> Path:
    from ..core.cache import tuning_path

    return tuning_path()


# how the inputs configs are timed on are made: 2, the ops' tuning_inputs (lengths, offsets, page tables);
# 1, random data for all (answers cached then are not reused)
TIMING_INPUTS = 2


def environment(device: Device) -> dict[str, Any]:
    """Everything outside the piece that can change which config is fastest."""
    from ..core.version import __version__

    env: dict[str, Any] = {
        "opgraph": __version__,
        "inputs": TIMING_INPUTS,
        "device": device.name,
        "capability": device.capability,
        "sm_count": device.sm_count,
    }
    for dist in ("torch", "triton", "nvidia-cudnn-frontend"):
        env[dist] = _version(dist)
    torch = sys.modules.get("torch")
    if torch is not None and device.is_cuda:
        env["cuda"] = torch.version.cuda
        env["cudnn"] = torch.backends.cudnn.version()  # the library engines' kernels come from it
    return env


def _version(dist: str) -> str | None:
    """An installed distribution's version, without importing it."""
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def config_failure(err: BaseException) -> bool:
    """Whether `err` is a candidate config failing to build or run (opgraph's typed errors, CUDA and
    library runtime errors, Triton's compilation and resource errors), which tuning skips; anything
    else (a TypeError, an AssertionError: opgraph's own bugs) propagates."""
    if isinstance(err, (GraphError, RuntimeError)):
        return True
    return (type(err).__module__ or "").split(".")[0] in ("triton", "cudnn", "torch")


def cache_key(piece: Piece, device: Device, engines: Sequence[str], filters: str = "") -> str:
    doc: dict[str, Any] = {"piece": piece.signature(), "env": environment(device), "engines": sorted(engines)}
    origin = piece.graph.origin
    if origin is not None:  # a dynamic plan's bucket: candidates decided over its ranges, not the hint's alone
        doc["bucket"] = origin.bucket.ranges
    if filters:  # a build with config filters tunes (and remembers) apart from an unfiltered one
        doc["filters"] = filters
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:24]


def _answer(entry: Any) -> bool:
    """Whether a cached entry has the shape `tune` writes."""
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("engine"), str)
        and isinstance(entry.get("knobs", []), list)
        and isinstance(entry.get("times", {}), dict)
    )


class TuningCache:
    """A JSON file of {key: {"engine", "knobs", "times": {config: µs}}}, shared by threads and
    processes: each answer is merged in under a lock and the file replaced at once, so none is lost.
    A file or entry that cannot be read or written (corrupt, the wrong shape, no rights) costs a tuning
    run, never the build: the fault is reported once as a CacheWarning (opgraph.core.cache)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or cache_path()
        self._data: dict[str, Any] | None = None
        self._mine: dict[str, Any] = {}  # answers of this process, kept where the file cannot be written

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_bytes())
        except (FileNotFoundError, NotADirectoryError):
            return {}
        except (OSError, ValueError) as err:
            why = "not JSON" if type(err) is json.JSONDecodeError else describe(err)
            fault(self.path, f"cannot be read ({why}); every piece is tuned again")
            return {}
        if not isinstance(data, dict):
            fault(
                self.path,
                f"is not a tuning file (a JSON {type(data).__name__}); every piece is tuned again",
                f"remove {self.path.name}, or run `opgraph cache clear --no-kernels`",
            )
            return {}
        return data

    def _load(self) -> dict[str, Any]:
        if self._data is None:
            self._data = {**self._read(), **self._mine}
        return self._data

    def get(self, key: str) -> dict[str, Any] | None:
        entry = self._load().get(key)
        if entry is None or _answer(entry):
            return entry
        fault(
            self.path,
            f"entry {key[:12]}... is not a tuning answer; that piece is tuned again",
            f"remove {self.path.name}, or run `opgraph cache clear --no-kernels`",
        )
        return None

    def put(self, key: str, entry: dict[str, Any]) -> None:
        """Merge `entry` into the file, with what other threads and processes wrote meanwhile."""
        self._mine[key] = entry
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with locked(self.path):
                data = {**self._read(), key: entry}
                write_atomic(self.path, json.dumps(data, indent=1, sort_keys=True).encode())
        except OSError as err:
            unwritable(err)
            data = {**(self._data or {}), key: entry}
        self._data = {**data, **self._mine}


def _time(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _knobs_json(config: EngineConfig) -> list:
    return [[k, v] for k, v in config.knobs]


def config_id(config: EngineConfig) -> str:
    return config.engine + json.dumps(_knobs_json(config), default=str)


def _buffers(piece: Piece, device: Device) -> dict[int, Any]:
    """Random inputs and empty outputs with the piece's dims, strides and types, on the device."""
    import numpy as np

    from ..memory.fill import empty_like_desc, random_values

    rng = np.random.default_rng(0)
    given = tuning_inputs(piece)
    bufs: dict[int, Any] = {}
    for uid in (*piece.inputs, *piece.outputs):
        t = piece.tensor(uid)
        if t.is_pass_by_value:
            bufs[uid] = 0.5
            continue
        arr = random_values(t, rng) if uid in piece.inputs else empty_like_desc(t)
        if uid in given:
            arr[...] = given[uid]
        if device.is_cuda:
            from ..core.torch_interop import numpy_to_torch

            arr = numpy_to_torch(arr, device.torch_name)
        bufs[uid] = arr
    return bufs


TUNE_PASSES = 5  # on a GPU: passes over the candidates (round-robin), each timing every one still in the race once
PRUNE_AT = 1.5  # after the first pass, candidates this many times the fastest's time are timed no more
BURST_US = 2000.0  # later passes: calls a measurement so that a burst lasts about this long (1 to 10)


def tuning_inputs(piece: Piece) -> dict[int, Any]:
    """The piece's inputs that random data cannot stand for (lengths, offsets, page tables), by UID: what
    its ops' `tuning_inputs` give."""
    out: dict[int, Any] = {}
    for node in piece.nodes:
        roles = node.op.input_roles()
        tensors = {r: piece.tensor(u) for r, u in zip(roles, node.inputs) if isinstance(u, int)}
        for role, values in node.op.tuning_inputs(tensors).items():
            uid = node.input(role)
            if isinstance(uid, int) and uid in piece.inputs and uid not in out:  # (the first role's, shared)
                out[uid] = values
    return out


def bound_run(kernel: Kernel, piece: Piece, bufs: dict[int, Any], scratch: Any, device: Device) -> Callable[[], None]:
    """`kernel` bound to `bufs` and run as a plan's execute runs its step (`Kernel.bind`; on CUDA the
    current stream): the tuner times the code the plan will run. `Kernel.run`, the self-contained path,
    is another code path: generated kernels launch through Triton's JIT (a second compilation of the
    same source, with its own specializations) and cuDNN plans rebuild their variant pack in Python
    each call. Timed that way, tuned plans came out slower than the heuristic's choice, which was among
    the candidates (bench/results/constants.md#tuning-the-plans-code)."""
    binding = Binding()
    for uid, value in bufs.items():
        binding.buffers[uid] = value
        if not isinstance(value, (bool, int, float)):
            binding.pointers[uid] = address_of(value)
    table = AddressTable(piece.graph, device)
    if table:  # by-reference tensors: the kernel reads their addresses from the table, as in a plan
        table.update_from({uid: binding.pointers.get(uid, 0) for uid in table.slots}, force=True)
        binding.buffers[TABLE_KEY] = table.tensor
        binding.pointers[TABLE_KEY] = address_of(table.tensor)
    if device.is_cuda:
        import torch

        binding.stream.set(int(torch.cuda.current_stream(device.index).cuda_stream))
    return _BoundRun(kernel, binding, kernel.bind(binding, scratch), table)


class _BoundRun:
    """One run of a bound candidate. It holds the launcher, not only its calls: the launcher owns what
    the calls point at (a native launch's argument slots, cuDNN's pointer array, global scratch), which
    its release would free under them; and the binding and address table the kernel reads."""

    def __init__(self, kernel: Kernel, binding: Binding, launcher: Launcher, table: AddressTable) -> None:
        self.kernel, self.binding, self.launcher, self.table = kernel, binding, launcher, table
        self.preludes = list(binding.preludes.values())

    def __call__(self) -> None:
        for fn, args in (*self.preludes, *self.launcher.calls):
            rc = fn(*args)
            if rc:
                raise ExecutionError(
                    f"{self.kernel.config} failed to launch (code {rc})",
                    rule="autotune.launch",
                    hint="the candidate is skipped; build with autotune=False to see it alone",
                )


def time_kernel(
    kernel: Kernel, piece: Piece, device: Device, bufs: dict[int, Any], warmup: int = 3, burst: int = 10
) -> float:
    """One measurement of a candidate's device µs per run on CUDA (a burst of runs behind a spin kernel:
    its host time hidden, as in a captured CUDA graph or a plan that runs ahead of the device; timing
    each run from an idle device would charge a library call's host setup in full and pick by host
    overhead); `tune` takes the median of TUNE_PASSES of them. On the CPU: wall clock. Either way the
    candidate runs as a plan runs it (`bound_run`)."""
    from ..core.timing import time_call, time_device
    from ..memory.workspace import allocate

    scratch = allocate(kernel.scratch_bytes, device) if kernel.scratch_bytes else None
    run = bound_run(kernel, piece, bufs, scratch, device)
    if device.is_cuda:
        return time_device(run, warmup=warmup, rounds=1, burst=burst)
    return time_call(run, cuda=False, warmup=1, repeat=2)


def _skip(err: Exception, piece: Piece, config: EngineConfig, failed: list[EngineConfig]) -> None:
    """A candidate's own failure (see config_failure) is recorded and the candidate skipped; anything else
    is opgraph's bug and propagates."""
    if not config_failure(err):
        raise err
    log.info("%s: %s failed: %s", piece.label(), config, err)
    failed.append(config)


def _more_passes(
    timed: list[tuple[list[float], EngineConfig, Kernel]],
    piece: Piece,
    device: Device,
    bufs: dict[int, Any],
    failed: list[EngineConfig],
) -> None:
    """Passes 2..TUNE_PASSES over the candidates, one measurement each per pass (round-robin): a drift of
    the GPU's clocks over the tuning weighs on every candidate alike (timing each candidate's rounds in
    one go, in candidate order, may measure the first, timed right after the compiles, slower than it
    runs later). Only the first-timed candidate and those within PRUNE_AT of the first pass's fastest go
    on (a drift of a few percent cannot make the others win; they keep their one time), and a measurement's burst is as many
    calls as fill ~BURST_US (one call of a 50-ms attention backward, ten of a 20-µs conv): tuned builds
    spent most of their timing on the long and the losing candidates
    (bench/results/constants.md#tuning-passes)."""
    if not device.is_cuda or len(timed) < 2:
        return  # (one candidate: nothing to compare)
    fastest = min(samples[0] for samples, _, _ in timed)
    going = [entry for k, entry in enumerate(timed) if k == 0 or entry[0][0] <= PRUNE_AT * fastest]
    for _ in range(TUNE_PASSES - 1):
        if len(going) < 2:
            return
        for entry in list(going):
            samples, config, kernel = entry
            burst = max(1, min(10, round(BURST_US / max(samples[0], 1e-3))))
            try:
                samples.append(time_kernel(kernel, piece, device, bufs, 0, burst))
            except Exception as err:  # noqa: BLE001 - as in the first pass
                _skip(err, piece, config, failed)
                kernel.drop_cached_buffers()
                timed.remove(entry)
                going.remove(entry)


def precompile(
    jobs: Sequence[tuple[Piece, Sequence[EngineConfig]]],
    device: Device,
    engines: Sequence[str],
    cache: TuningCache,
    filters: ConfigFilter | None = None,
    mode: str = "parallel",
) -> dict[str, Any]:
    """Compile the candidate kernels of every piece the cache does not answer, all at once on every
    core (the build's compiler pool), before `tune` times them one piece after the other, which would
    otherwise compile them one at a time (GPT-2's training step: 392 steps, 46 distinct pieces, ~370
    distinct candidate kernels). Repeated pieces (a network's identical blocks) share their kernels. A
    candidate that fails to generate or compile is left to `tune`, which skips and records it. `mode`
    is the build's compile mode ("serial": in this process; "lazy": nothing ahead). Statistics; nothing
    on a CPU (interpreted kernels are not compiled ahead)."""
    if not device.is_cuda or mode == "lazy":
        return {}
    from .compile import SpecBatches

    filters = filters or ConfigFilter()
    batches = SpecBatches()
    seen: set[str] = set()
    for piece, candidates in jobs:
        key = cache_key(piece, device, engines, filters.key())
        if key in seen or cache.get(key) is not None:
            continue
        seen.add(key)
        for config in candidates:
            if get_engine(config.engine).compiler() is None:
                continue  # nothing to compile ahead (a cuDNN plan built here would be built again when timed)
            try:
                kernel = get_engine(config.engine).compile(piece, config, device)
            except Exception as err:  # noqa: BLE001 - tune meets it again and records it
                if not config_failure(err):
                    raise
                continue
            for spec, fn in kernel.compile_specs():
                batches.add(config.engine, spec, fn)
    report = batches.compile(
        parallel=mode == "parallel", what=f"compiling {len(batches)} candidate kernels of {len(seen)} pieces to tune"
    )
    log.info("precompiled %d candidate kernels of %d pieces in %.1f s", len(batches), len(seen), report.seconds)
    return {"pieces": len(seen), **dataclasses.asdict(report)}


def tune(
    piece: Piece,
    candidates: Sequence[EngineConfig],
    device: Device,
    engines: Sequence[str],
    cache: TuningCache,
    filters: ConfigFilter | None = None,
) -> tuple[EngineConfig, Kernel, tuple[EngineConfig, ...], bool]:
    """The fastest candidate (with its measured time), its kernel, the others (with theirs), and
    whether the answer came from the cache. `filters` rejects kernels by workspace (candidates are
    already filtered by notes and engine)."""
    filters = filters or ConfigFilter()
    key = cache_key(piece, device, engines, filters.key())
    hit = cache.get(key)
    if hit is not None:
        times = hit.get("times", {})
        known = [dataclasses.replace(c, measured_us=_time(times.get(config_id(c)))) for c in candidates]
        for c in known:
            if c.engine == hit.get("engine") and _knobs_json(c) == hit.get("knobs"):
                log.info("%s: cached choice %s", piece.label(), c)
                kernel = get_engine(c.engine).compile(piece, c, device)
                return c, kernel, tuple(o for o in known if o is not c), True
    bufs = _buffers(piece, device)
    timed: list[tuple[list[float], EngineConfig, Kernel]] = []
    failed: list[EngineConfig] = []
    too_big: list[str] = []
    if device.is_cuda and len(candidates) > 1:
        from ..core.timing import settle_clocks

        settle_clocks()  # the first pass follows the compiles, on a GPU idle meanwhile
    for i, config in enumerate(candidates):
        log.info("%s: timing %d/%d %s", piece.label(), i + 1, len(candidates), config)
        try:
            kernel = get_engine(config.engine).compile(piece, config, device)
            why = filters.rejects_kernel(kernel)
            if why is not None:  # not a candidate of this build: neither timed nor an alternative
                log.info("%s: %s filtered out: %s", piece.label(), config, why)
                too_big.append(f"{config}: {why}")
                continue
            us = time_kernel(kernel, piece, device, bufs)
        except Exception as err:  # noqa: BLE001 - only a candidate's own failure is skipped
            _skip(err, piece, config, failed)
            continue
        timed.append(([us], config, kernel))
    _more_passes(timed, piece, device, bufs, failed)
    results: list[tuple[float, EngineConfig, Kernel]] = []
    for samples, config, kernel in timed:
        kernel.drop_cached_buffers()  # views of the timing buffers
        us = statistics.median(samples)
        results.append((us, dataclasses.replace(config, measured_us=us), kernel))
    if not results and too_big and not failed:
        raise UnsupportedGraphError(
            f"every engine config of {piece.label()} needs more workspace than the build allows ({'; '.join(too_big)})",
            op=piece.nodes[0].label(),
            rule="engine.workspace_limit",
            hint="raise deselect_workspace_greater_than",
        )
    if not results:
        raise GraphError(
            f"every candidate config of {piece.label()} failed while tuning",
            rule="autotune.all_failed",
            hint="build without autotune=True to see the first error",
        )
    results.sort(key=lambda r: r[0])
    us, best, kernel = results[0]
    cache.put(
        key,
        {
            "engine": best.engine,
            "knobs": _knobs_json(best),
            "times": {config_id(c): t for t, c, _ in results},
            "piece": [n.label() for n in piece.nodes],
        },
    )
    others = tuple(c for _, c, _ in results[1:]) + tuple(failed)
    log.info("%s: chose %s (%.1f us)", piece.label(), best, us)
    return best, kernel, others, False
