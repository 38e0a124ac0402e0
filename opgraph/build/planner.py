"""The planner: partition a finalized graph, rank and filter each piece's engine configs (heuristics or
tuning), compile the chosen kernels. Its result, a `Schedule`, is what the runtime's ExecutionPlan runs."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

from ..core.config import EngineConfig, HeurMode, as_modes
from ..core.device import Device, resolve_device
from ..core.errors import ExecutionError, GraphError, UnsupportedGraphError
from ..core.ir import FinalGraph
from ..core.piece import Piece
from ..engines import get_engine
from ..engines.base import Engine, Kernel
from ..ops.collective import COLLECTIVE_KINDS
from .autotune import TuningCache, precompile, tune
from .compile import compile_steps
from .filters import ConfigFilter
from .heuristics import PieceConfigs, rank_configs
from .options import BuildOptions
from .partition import Cut, partition
from .shared import shared_answers
from .sibling_merge import refine

log = logging.getLogger("opgraph.build")


@dataclass(frozen=True)
class Step:
    index: int
    piece: Piece
    config: EngineConfig
    kernel: Kernel = field(compare=False, repr=False)
    alternatives: tuple[EngineConfig, ...] = ()
    # why the step runs other than the config ranked first for it (its kernel did not compile: compile.py)
    note: str = field(default="", compare=False)


@dataclass(frozen=True)
class Schedule:
    """The planner's result: the (possibly by-reference) graph, the device, the steps in order and the
    cuts between pieces with every engine's reason."""

    graph: FinalGraph
    device: Device
    steps: tuple[Step, ...]
    cuts: Sequence[Cut]  # (a dynamic plan's shape: its bucket's, made when read: bucket_plan.ShapedCuts)
    stats: dict[str, Any] = field(default_factory=dict, compare=False)  # where the build's time went


def default_engines(device: Device) -> list[str]:
    """In order of preference: generated kernels, then a library conv/matmul with generated kernels
    around it, then a cuDNN frontend graph (where nvidia-cudnn-frontend is installed), then op-by-op
    PyTorch (which runs any op) on CUDA; the reference engine on the CPU. Engines that are not
    available on the device are left out of the build."""
    return ["reference"] if not device.is_cuda else ["triton", "library", "cudnn", "torch"]


def usable_engines(names: Sequence[str] | None, device: Device) -> list[Engine]:
    if isinstance(names, str):
        names = [names]
    chosen = list(names) if names is not None else default_engines(device)
    if not chosen:
        raise UnsupportedGraphError(
            f"no engine is available for {device}",
            rule="engine.none",
            hint="build with device='cpu' to use the reference engine",
        )
    engines = [get_engine(n) for n in chosen]
    usable = [e for e in engines if e.available(device).ok]
    if not usable:
        reasons = "; ".join(f"{e.name}: {e.available(device).reason}" for e in engines)
        raise UnsupportedGraphError(
            f"none of the engines {chosen} can run on {device} ({reasons})",
            rule="engine.unavailable",
            hint="pick engines available on this device, or another device",
        )
    return usable


def all_by_reference(graph: FinalGraph) -> FinalGraph:
    """The graph with every bound (non-virtual, not pass-by-value) tensor by reference."""
    tensors = {
        u: (dataclasses.replace(t, is_by_reference=True) if not t.is_virtual and not t.is_pass_by_value else t)
        for u, t in graph.tensors.items()
    }
    return dataclasses.replace(graph, tensors=tensors)


@contextmanager
def sessions(engines: Sequence[Engine]) -> Iterator[None]:
    """One build's span for every engine it uses (Engine.session) and for the answers its identical
    pieces share (build/shared.py): what they learn of its pieces is dropped when it ends."""
    with ExitStack() as stack:
        stack.enter_context(shared_answers())
        for e in engines:
            stack.enter_context(e.session())
        yield


def engine_configs(
    graph: FinalGraph, *, heur_mode: Any = None, device: Any = None, engines: Sequence[str] | None = None
) -> list[PieceConfigs]:
    dev = resolve_device(device)
    usable = usable_engines(engines, dev)
    with sessions(usable):
        pieces, cuts = partition(graph, usable, dev)
        pieces, _ = refine(pieces, cuts, usable, dev, as_modes(heur_mode))
        return [rank_configs(p, usable, dev, as_modes(heur_mode)) for p in pieces]


def plan_steps(graph: FinalGraph, options: BuildOptions | None = None, **keywords: Any) -> Schedule:
    """Partition `graph`, rank every piece's configs (or time them: `autotune`) and compile the chosen
    one: the steps an ExecutionPlan runs. `options` (opgraph.build.options.BuildOptions), with any
    of its fields as keywords over it: Graph.build's options."""
    opts = BuildOptions.of(options, **keywords)
    if opts.by_reference:
        graph = all_by_reference(graph)
    dev = resolve_device(opts.device)
    if opts.autotune and dev.is_cuda:
        import torch

        if torch.cuda.is_current_stream_capturing():
            raise GraphError(
                "build(autotune=True) was called while a CUDA graph is being captured: timing candidates "
                "synchronises the device, which breaks the capture",
                rule="autotune.capturing",
                hint="build (and tune) before capturing; the cache makes later builds time nothing",
            )
    usable = usable_engines(opts.engines, dev)
    with sessions(usable):
        return _plan(graph, opts, dev, usable)


def _plan(graph: FinalGraph, opts: BuildOptions, dev: Device, usable: list[Engine]) -> Schedule:
    filters = opts.filters
    modes = opts.modes
    compile_mode = opts.compile
    t0 = time.perf_counter()
    stats: dict[str, Any] = {"kernels_s": {}}
    pieces, cuts = partition(graph, usable, dev, allow_partition=opts.allow_partition)
    if opts.allow_partition:
        pieces, cuts = refine(pieces, cuts, usable, dev, modes)
    stats["partition_s"] = time.perf_counter() - t0
    log.info(
        "partition '%s' for %s with engines %s: %d piece(s)", graph.name, dev, [e.name for e in usable], len(pieces)
    )
    for cut in cuts:
        log.info("  not fused before %s: %s", cut.node.label(), "; ".join(f"{e}: {w}" for e, w in cut.reasons))
    cache = TuningCache() if opts.autotune else None
    names = [e.name for e in usable]
    tuning: dict[int, list[EngineConfig]] = {}
    if cache is not None:  # every piece's candidates, compiled at once before any piece is timed
        for piece in pieces:
            tuning[id(piece)] = filters.keep(rank_configs(piece, usable, dev, (*modes, HeurMode.B)).configs)[0]
        t1 = time.perf_counter()
        stats["precompile"] = precompile([(p, tuning[id(p)]) for p in pieces], dev, names, cache, filters, compile_mode)
        stats["precompile_s"] = time.perf_counter() - t1
    steps = [
        choose_step(piece, index, usable, dev, opts, stats, cache, tuning.get(id(piece)))
        for index, piece in enumerate(pieces)
    ]
    stats["plan_s"] = time.perf_counter() - t0
    t1 = time.perf_counter()

    def more(step: Step) -> list[EngineConfig]:  # (a step whose kernel fails: its engine's other kernels first)
        return filters.keep(rank_configs(step.piece, usable, dev, (*modes, HeurMode.B)).configs)[0]

    steps, stats["compile"] = compile_steps(steps, dev, compile_mode, more)
    stats["compile_s"] = time.perf_counter() - t1
    return Schedule(graph, dev, tuple(steps), tuple(cuts), stats)


def choose_step(
    piece: Piece,
    index: int,
    usable: Sequence[Engine],
    dev: Device,
    opts: BuildOptions,
    stats: dict[str, Any],
    cache: TuningCache | None = None,
    candidates: list[EngineConfig] | None = None,
) -> Step:
    """The step running `piece`: its configs ranked in the build's modes and filtered, then timed
    (`cache`: autotuning, over `candidates`) or the first that compiles within the workspace limit."""
    filters, modes = opts.filters, opts.modes
    ranked = rank_configs(piece, usable, dev, modes)
    configs, dropped = filters.keep(ranked.configs)
    if not configs:
        reasons = (
            "; ".join(
                [
                    *(f"{n}: {why}" for n, why in ranked.declined),
                    *(f"{c} filtered out: {why}" for c, why in dropped),
                ]
            )
            or "no config in these modes"
        )
        raise UnsupportedGraphError(
            f"no engine config for {piece.label()} in heuristic modes {[m.name for m in modes]} ({reasons})",
            op=piece.nodes[0].label(),
            rule="engine.no_config",
            hint="add HeurMode.FALLBACK to heur_mode, allow more engines, or relax the build's note, "
            "engine and workspace filters"
            if dropped
            else "add HeurMode.FALLBACK to heur_mode, or allow more engines",
        )
    for name, why in ranked.declined:
        log.info("  %s: %s declined: %s", piece.label(), name, why)
    for config, why in dropped:
        log.info("  %s: %s filtered out: %s", piece.label(), config, why)
    if cache is not None and not any(n.kind in COLLECTIVE_KINDS for n in piece.nodes):
        # autotune (a collective is not timed: its ranks' builds would have to time it together)
        config, kernel, others, _ = tune(
            piece, configs if candidates is None else candidates, dev, [e.name for e in usable], cache, filters
        )
        return Step(index, piece, config, kernel, others)
    t1 = time.perf_counter()
    config, kernel = _first_within_workspace(piece, configs, dev, filters)
    stats.setdefault("kernels_s", {})
    stats["kernels_s"][config.engine] = stats["kernels_s"].get(config.engine, 0.0) + time.perf_counter() - t1
    return Step(index, piece, config, kernel, tuple(c for c in configs if c is not config))


def _first_within_workspace(
    piece: Piece, configs: Sequence[EngineConfig], dev: Device, filters: ConfigFilter
) -> tuple[EngineConfig, Kernel]:
    """The first config (in rank order) that compiles and whose kernel's workspace passes the build's
    limit, compiled. A config that fails to compile (a library plan its own support check accepted,
    then could not build) gives way to the next one; if all fail, the first failure is raised."""
    too_big = []
    failed: list[GraphError] = []
    for config in configs:
        t0 = time.perf_counter()
        try:
            kernel = get_engine(config.engine).compile(piece, config, dev)
        except ExecutionError as err:
            log.info("  %s: %s failed to compile, trying the next config: %s", piece.label(), config, err)
            failed.append(err)
            continue
        why = filters.rejects_kernel(kernel)
        if why is None:
            log.info(
                "  %s -> %s (%d candidate configs; compiled in %.1f ms)",
                piece.label(),
                config,
                len(configs),
                (time.perf_counter() - t0) * 1e3,
            )
            return config, kernel
        log.info("  %s: %s filtered out: %s", piece.label(), config, why)
        too_big.append(f"{config}: {why}")
    if failed and not too_big:
        raise failed[0]
    raise UnsupportedGraphError(
        f"every engine config of {piece.label()} needs more workspace than the build allows ({'; '.join(too_big)})",
        op=piece.nodes[0].label(),
        rule="engine.workspace_limit",
        hint="raise deselect_workspace_greater_than, or add HeurMode.B / FALLBACK for more candidates",
    )
