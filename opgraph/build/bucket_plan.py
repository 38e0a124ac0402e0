"""Planning once per bucket (docs/design/dynamic-shapes.md, "Planning per bucket").

A dynamic plan's bucket is planned once, at its hint shape (`plan_bucket`): partition, ranking,
policy and tuning run there, so every shape of the bucket gets the same pieces and configs whichever
shape came first. Nothing is compiled at the hint (lazily): each shape compiles only its own steps.
A shape of the bucket then gets the bucket's schedule carried to it (`schedule_at`): the same
pieces over the shape's static graph and the same configs, each step's kernel from its engine
(`Engine.kernel_at`): a kernel taking its sizes at run time is re-pointed (its grids and size
arguments evaluated at the shape, no generation, no compilation), any other compiled again at the
shape with the same config. Only a step whose config does not run the piece at that shape has its
config chosen again there (the schedule's `stats["rechosen"]`), and only a piece no engine runs at
that shape re-plans the whole shape (`stats["replanned"]`; the dynamic plan counts both). The workspace layout and the binding are the
shape's (the runtime makes them from the schedule).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

from ..core.bucket import Bucket
from ..core.config import HeurMode
from ..core.device import Device
from ..core.errors import UnsupportedGraphError
from ..core.ir import FinalGraph
from ..core.piece import Piece
from ..engines import get_engine
from ..engines.base import Engine
from .autotune import TuningCache
from .compile import compile_steps
from .heuristics import rank_configs
from .options import BuildOptions
from .planner import Schedule, Step, all_by_reference, choose_step, plan_steps, sessions, usable_engines

log = logging.getLogger("opgraph.build")


@dataclass(frozen=True)
class BucketSchedule:
    """A bucket's plan, made once: its schedule at the bucket's hint (steps with uncompiled kernels)
    and, per step and cut, where its nodes sit in the graph's node list (the same at every shape)."""

    bucket: Bucket
    schedule: Schedule
    positions: tuple[tuple[int, ...], ...]  # per step, its nodes' indices in graph.nodes
    cut_positions: tuple[int, ...]  # per cut, its node's index


def plan_bucket(graph: FinalGraph, bucket: Bucket, options: BuildOptions) -> BucketSchedule:
    """Partition and choose every piece's config of `graph` (dynamic) once for `bucket`, at its hint."""
    hint = graph.in_bucket(bucket.hint_map, bucket)
    schedule = plan_steps(hint, options, compile="lazy")
    where = {id(n): i for i, n in enumerate(schedule.graph.nodes)}
    return BucketSchedule(
        bucket,
        schedule,
        tuple(tuple(where[id(n)] for n in s.piece.nodes) for s in schedule.steps),
        tuple(where[id(c.node)] for c in schedule.cuts),
    )


def schedule_at(planned: BucketSchedule, graph: FinalGraph, options: BuildOptions) -> Schedule:
    """The bucket's schedule at one of its shapes (`graph`: the dynamic graph `in_bucket` of it), its
    kernels compiled as the build's options say. See the module docstring."""
    opts = BuildOptions.of(options)
    shaped = all_by_reference(graph) if opts.by_reference else graph
    base = planned.schedule
    dev = base.device
    usable = usable_engines(opts.engines, dev)
    stats: dict[str, Any] = {"kernels_s": {}, "rechosen": 0}
    steps = []
    with sessions(usable):
        for step, where in zip(base.steps, planned.positions):
            piece = Piece(
                step.index, tuple(shaped.nodes[i] for i in where), step.piece.inputs, step.piece.outputs, shaped
            )
            kernel = get_engine(step.config.engine).kernel_at(step.kernel, piece, dev)
            if kernel is not None and opts.filters.rejects_kernel(kernel) is None:
                steps.append(Step(step.index, piece, step.config, kernel, step.alternatives))
                continue
            stats["rechosen"] += 1
            log.info("  %s: %s does not run it at this shape: its config is chosen again", piece.label(), step.config)
            try:
                steps.append(_rechoose(piece, step.index, usable, dev, opts, stats))
            except UnsupportedGraphError as err:
                log.info("  %s: no engine runs it at this shape (%s): the shape is planned anew", piece.label(), err)
                whole = plan_steps(graph, opts)
                return dataclasses.replace(whole, stats={**whole.stats, "replanned": True})
        steps, stats["compile"] = compile_steps(steps, dev, opts.compile)
    cuts = tuple(dataclasses.replace(c, node=shaped.nodes[i]) for c, i in zip(base.cuts, planned.cut_positions))
    return Schedule(shaped, dev, tuple(steps), cuts, stats)


def _rechoose(
    piece: Piece, index: int, usable: list[Engine], dev: Device, opts: BuildOptions, stats: dict[str, Any]
) -> Step:
    """The piece's step with its config chosen at its own shape, as a static build chooses it."""
    if not opts.autotune:
        return choose_step(piece, index, usable, dev, opts, stats)
    candidates = opts.filters.keep(rank_configs(piece, usable, dev, (*opts.modes, HeurMode.B)).configs)[0]
    return choose_step(piece, index, usable, dev, opts, stats, TuningCache(), candidates)


__all__ = ["BucketSchedule", "plan_bucket", "schedule_at"]
