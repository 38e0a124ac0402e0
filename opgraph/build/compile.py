"""Compiling a plan's kernels at build time, in parallel, each distinct kernel once.

`build()` (compile="parallel", the default on CUDA) gathers every step's compile specs
(Kernel.compile_specs: the Triton engine's generated kernels, the library engine's parts), keeps one
per distinct kernel (the repeated blocks of a network generate identical kernels) and hands them to
the compiler of the step's engine (Engine.compiler(): the Triton engine's takes what this process or
Triton's disk cache already has and compiles the rest in worker processes, one per core, so a
compiler that aborts fails its kernel, not the process). A rich progress bar appears when that takes more than PROGRESS_AFTER
seconds (OPGRAPH_PROGRESS=0 hides it). A step whose kernel fails to compile gives way to its next
alternative config, as a config that fails to build does in the planner. compile="serial" compiles
in this process, one kernel after the other; compile="lazy" leaves each kernel to its first execute.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..core.config import EngineConfig
from ..core.device import Device
from ..core.errors import ExecutionError, GraphError, InternalError
from ..engines import get_engine
from ..engines.base import Compiler, CompileReport

log = logging.getLogger("opgraph.build")

MODES = ("parallel", "serial", "lazy")
PROGRESS_AFTER = 1.5  # seconds


class LazyProgress:
    """A rich progress bar that shows itself only once the work has taken PROGRESS_AFTER seconds."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.t0 = time.perf_counter()
        self.bar: Any = None
        self.task: Any = None
        self.enabled = os.environ.get("OPGRAPH_PROGRESS", "1") not in ("0", "")

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None:
            if not self.enabled or done >= total or time.perf_counter() - self.t0 < PROGRESS_AFTER:
                return
            try:
                from rich.console import Console
                from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
            except ImportError:
                self.enabled = False
                return
            self.bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(file=sys.stderr),
                transient=False,
            )
            self.bar.start()
            self.task = self.bar.add_task(self.what, total=total)
        self.bar.update(self.task, completed=done, total=total)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


def compile_steps(
    steps: Sequence[Any],
    device: Device,
    mode: str,
    more: Callable[[Any], Sequence[EngineConfig]] | None = None,
) -> tuple[list[Any], dict[str, Any]]:
    """Compile the kernels of `steps` (planner.Step) ahead of their first launch; returns the steps
    (a step whose kernel failed replaced by the first of its alternatives that compiles, its own
    engine's first: see `_replace`; `more(step)`, configs beyond the step's alternatives, e.g. the
    piece's in more heuristic modes) and statistics."""
    if mode not in MODES:
        raise GraphError(f"build(compile={mode!r})", rule="build.compile", hint=f"use one of {', '.join(MODES)}")
    stats: dict[str, Any] = {"mode": mode}
    if mode == "lazy" or not device.is_cuda:
        return list(steps), stats
    batches = SpecBatches()
    owners: dict[str, list[int]] = {}
    launches = 0
    for i, step in enumerate(steps):
        for spec, fn in step.kernel.compile_specs():
            launches += 1
            batches.add(step.config.engine, spec, fn)
            owners.setdefault(spec.key, []).append(i)
    report = batches.compile(parallel=mode == "parallel", what=f"compiling {len(batches)} kernels")
    stats.update(dataclasses.asdict(report))
    stats["launches"] = launches
    log.info(
        "compiled %d distinct kernels of %d launches (%d ready, %d cached, %d compiled on %d workers) in %.1f s",
        report.kernels,
        launches,
        report.ready,
        report.cached,
        report.compiled,
        report.workers,
        report.seconds,
    )
    out = list(steps)
    known = dict(report.failed)  # (kernels that failed: a model's repeated layers try the same alternatives)
    for i in sorted({i for key in report.failed for i in owners[key]}):
        errors = {k: report.failed[k] for k in report.failed if i in owners[k]}
        out[i] = _replace(out[i], device, errors, parallel=mode == "parallel", more=_more(more, out[i]), known=known)
    return out, stats


class SpecBatches:
    """Compile specs gathered by the compiler of their engine (`Engine.compiler()`), one per distinct key."""

    def __init__(self) -> None:
        self.batches: dict[int, tuple[Compiler, dict[str, tuple[Any, Any]]]] = {}

    def __len__(self) -> int:
        return sum(len(specs) for _, specs in self.batches.values())

    def add(self, engine: str, spec: Any, fn: Any) -> None:
        compiler = get_engine(engine).compiler()
        if compiler is None:
            raise InternalError(
                f"the {engine} engine's kernels give compile specs but it has no compiler",
                rule="internal.invariant",
                hint="this is an opgraph bug: please report it",
            )
        self.batches.setdefault(id(compiler), (compiler, {}))[1].setdefault(spec.key, (spec, fn))

    def compile(self, *, parallel: bool, what: str) -> CompileReport:
        """Each compiler's batch compiled (in parallel where `parallel`), behind one progress bar; one report."""
        progress = LazyProgress(what)
        total, offset = len(self), 0
        reports = []
        try:
            for compiler, specs in self.batches.values():

                def step(done: int, _: int, before: int = offset) -> None:
                    progress(before + done, total)

                reports.append(compiler.compile_all(specs, parallel=parallel, progress=step))
                offset += len(specs)
        finally:
            progress.close()
        return merged(reports)


def merged(reports: Iterable[CompileReport]) -> CompileReport:
    out = CompileReport()
    for r in reports:
        out.kernels += r.kernels
        out.ready += r.ready
        out.cached += r.cached
        out.compiled += r.compiled
        out.workers = max(out.workers, r.workers)
        out.seconds += r.seconds
        out.failed.update(r.failed)
    return out


def _more(more: Callable[[Any], Sequence[EngineConfig]] | None, step: Any) -> Sequence[EngineConfig]:
    """`more(step)`, or none where it fails (the step's own alternatives still serve)."""
    if more is None:
        return ()
    try:
        return more(step)
    except GraphError as err:
        log.info("step %d: no more configs (%s)", step.index, err)
        return ()


def _fewer_stages(config: EngineConfig, why: str) -> list[EngineConfig]:
    """`config` with fewer pipeline stages (down to 2), the first alternatives of a kernel over the device's
    shared memory: a tile's epilogue converts float32 operand tiles through shared memory beside the stages,
    which the candidates' fit does not count (the Llama training step's query projection with RoPE over fp32
    cos / sin tables: 245,784 bytes at 3 stages under Triton 3.6, 196,624 at 2; without this the step fell to
    its engine's broadest 64 x 64 tile, 3-4x slower: bench/results/constants.md#fewer-stages)."""
    stages = config.knob("num_stages")
    if "shared memory" not in why or not isinstance(stages, int) or stages <= 2:
        return []
    # (dataclasses.replace: the config's notes, e.g. CUDA-graph capturable, hold for its fewer stages too)
    return [
        dataclasses.replace(config, knobs=tuple((k, n if k == "num_stages" else v) for k, v in config.knobs))
        for n in range(stages - 1, 1, -1)
    ]


def _replace(
    step: Any,
    device: Device,
    errors: dict[str, str],
    *,
    parallel: bool,
    more: Sequence[EngineConfig] = (),
    known: dict[str, str] | None = None,
) -> Any:
    """The step with its first alternative config whose kernels compile (where the build's mode
    compiles: in workers unless compile="serial"; checked as the batch was: a kernel over the device's
    shared memory fails its compile, so an alternative with the same tiles as the failed config is not
    taken either). The failed config's engine is asked first (its alternatives, then its configs in
    `more`): a kernel that does not compile says nothing of the engine's others, and the next engine in
    the ranking may be op-by-op PyTorch (the heuristic's mode A offers one generated kernel a piece:
    a Llama's norm-backward GEMMs ran 20x slower on the torch engine when theirs did not compile); a kernel over
    the shared memory first tries its own tiles at fewer stages (`_fewer_stages`). `known`:
    kernels already failed (by key), not compiled again, and where this call's failures are added."""
    known = {} if known is None else known
    why = "; ".join(errors.values())
    log.info("step %d: %s failed to compile (%s); trying its alternatives", step.index, step.config, why)
    engine_name = step.config.engine
    fewer = [c for c in _fewer_stages(step.config, why) if c not in step.alternatives]
    tried, extra = {step.config, *step.alternatives, *fewer}, []
    for config in more:
        if config.engine == engine_name and config not in tried:
            tried.add(config)
            extra.append(config)
    own = [c for c in step.alternatives if c.engine == engine_name]
    order = [*fewer, *own, *extra, *(c for c in step.alternatives if c.engine != engine_name)]
    for alt in order:
        try:
            engine = get_engine(alt.engine)
            kernel = engine.compile(step.piece, alt, device)
            compiler = engine.compiler()
            specs = {spec.key: (spec, fn) for spec, fn in kernel.compile_specs()}
            failed = {k: known[k] for k in specs if k in known}
            if not failed and compiler is not None and specs:
                failed = compiler.compile_all(specs, parallel=parallel).failed
                known.update(failed)
            if failed:
                raise ExecutionError("; ".join(failed.values()), rule="build.compile_failed")
        except Exception as err:  # noqa: BLE001 - the next alternative
            log.info("step %d: alternative %s failed too: %s", step.index, alt, err)
            continue
        others = tuple(c for c in (step.config, *step.alternatives) if c is not alt)
        note = f"runs {alt} because {step.config} failed to compile: {why}"
        # (another engine: the step may run far slower than ranked, which nothing else shows)
        (log.warning if alt.engine != engine_name else log.info)(
            "step %d (%s) %s", step.index, step.piece.label(), note
        )
        return dataclasses.replace(step, config=alt, kernel=kernel, alternatives=others, note=note)
    raise ExecutionError(
        f"step {step.index} ({step.piece.label()}): {step.config} failed to compile: {why}",
        op=step.piece.nodes[0].label(),
        rule="build.compile_failed",
        hint="build with another engine, or report the graph (its kernels do not compile)",
    )
