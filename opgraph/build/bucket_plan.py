"""Planning once per bucket (docs/design/dynamic-shapes.md, "Planning per bucket").

A dynamic plan's bucket is planned once, at its hint shape (`plan_bucket`): partition, ranking,
policy and tuning run there, so every shape of the bucket gets the same pieces and configs whichever
shape came first. Nothing is compiled at the hint (lazily): each shape compiles only its own steps.
A shape of the bucket then gets the bucket's schedule carried to it (`schedule_at`): the same
pieces over the shape's static graph and the same configs, each step's kernel from its engine
(`Engine.kernel_at`): a kernel taking its sizes at run time is re-pointed (its grids and size
arguments evaluated at the shape, no generation, no compilation), any other compiled again at the
shape with the same config (the schedule's `stats["rebuilt"]` counts those). Only a step whose config
does not run the piece at that shape has its config chosen again there (the schedule's
`stats["rechosen"]`), and only a piece no engine runs at that shape re-plans the whole shape
(`stats["replanned"]`; the dynamic plan counts all three). The workspace layout and the binding are
the shape's (the runtime makes them from the schedule).

One choice is made again at every shape, by its policy: a decode attention's split-KV (split_kv.at_shape:
the split the estimate gives at the shape, among the configs the bucket offered; `stats["resplit"]`
lists those steps).
The kernel of another split is generated once per bucket from the bucket's piece (`BucketSchedule.variants`)
and re-pointed at each shape as the bucket's own is.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from ..core.bucket import Bucket
from ..core.config import EngineConfig, HeurMode
from ..core.device import Device, resolve_device
from ..core.errors import UnsupportedGraphError
from ..core.ir import FinalGraph
from ..core.piece import Piece
from ..engines import get_engine
from ..engines.base import Engine, Kernel
from . import split_kv, tile_variants
from .autotune import TuningCache
from .compile import compile_steps
from .heuristics import rank_configs
from .options import BuildOptions
from .partition import Cut
from .planner import Schedule, Step, all_by_reference, choose_step, plan_steps, sessions, usable_engines
from .shared import shared
from .tile_variants import TileChoice

log = logging.getLogger("opgraph.build")


@dataclass(frozen=True)
class BucketSchedule:
    """A bucket's plan, made once: its schedule at the bucket's hint (steps with uncompiled kernels)
    and, per step and cut, where its nodes sit in the graph's node list (the same at every shape)."""

    bucket: Bucket
    schedule: Schedule
    positions: tuple[tuple[int, ...], ...]  # per step, its nodes' indices in graph.nodes
    cut_positions: tuple[int, ...]  # per cut, its node's index
    # (step index, config) -> the bucket's kernel of another config a shape chose (split_kv.at_shape,
    # tile_variants), generated once; filled under the dynamic plan's lock
    variants: dict[tuple[int, Any], Kernel] = field(default_factory=dict, compare=False, repr=False)
    # step index -> the tile variants the step carries (tile_variants.offer), compiled with the bucket's
    # first shape (then `tiles_compiled`); a variant whose kernel fails to compile is dropped
    tiles: dict[int, TileChoice] = field(default_factory=dict, compare=False, repr=False)
    tiles_compiled: list[bool] = field(default_factory=lambda: [False], compare=False, repr=False)

    def variant(self, step: Step, config: EngineConfig) -> Kernel:
        """The bucket's kernel of `config` for `step` (generated from the bucket's piece once, uncompiled:
        each shape's schedule re-points and compiles it as it does the bucket's own)."""
        key = (step.index, config.knobs)
        kernel = self.variants.get(key)
        if kernel is None:
            kernel = self.variants[key] = get_engine(config.engine).compile(step.piece, config, self.schedule.device)
        return kernel


def plan_bucket(graph: FinalGraph, bucket: Bucket, options: BuildOptions) -> BucketSchedule:
    """Partition and choose every piece's config of `graph` (dynamic) once for `bucket`, at its hint."""
    hint = graph.in_bucket(bucket.hint_map, bucket)
    opts = BuildOptions.of(options)
    tiles = {}
    # (one session: the tile offers ask the engines about the pieces the planning matched)
    with sessions(usable_engines(opts.engines, resolve_device(opts.device))):
        schedule = plan_steps(hint, options, compile="lazy")
        for step in schedule.steps:
            choice, _ = shared(
                "tile_variants",
                step.piece,
                (step.config, id(opts.filters)),
                functools.partial(tile_variants.offer, step.piece, step.config, schedule.device, opts.filters),
            )
            if choice is not None:
                tiles[step.index] = choice
    where = {id(n): i for i, n in enumerate(schedule.graph.nodes)}
    return BucketSchedule(
        bucket,
        schedule,
        tuple(tuple(where[id(n)] for n in s.piece.nodes) for s in schedule.steps),
        tuple(where[id(c.node)] for c in schedule.cuts),
        tiles=tiles,
    )


def schedule_at(planned: BucketSchedule, graph: FinalGraph, options: BuildOptions) -> Schedule:
    """The bucket's schedule at one of its shapes (`graph`: the dynamic graph `in_bucket` of it), its
    kernels compiled as the build's options say. See the module docstring."""
    opts = BuildOptions.of(options)
    shaped = all_by_reference(graph) if opts.by_reference else graph
    base = planned.schedule
    dev = base.device
    usable = usable_engines(opts.engines, dev)
    # (resplit: the step indices; rebuilt: steps whose engine built their kernel again at the shape)
    # (retiled: the steps running a tile variant; variant_kernels: the tiles' kernels compiled with the
    # bucket's first shape, at this shape, that its plan does not run)
    stats: dict[str, Any] = {"kernels_s": {}, "rechosen": 0, "resplit": [], "retiled": [], "rebuilt": 0}
    env = graph.origin.env if graph.origin is not None else {}
    steps = []
    extra: list[Step] = []  # (the tiles this shape compiles and does not run)
    first = not planned.tiles_compiled[0]
    with sessions(usable):
        for step, where in zip(base.steps, planned.positions):
            piece = Piece(
                step.index, tuple(shaped.nodes[i] for i in where), step.piece.inputs, step.piece.outputs, shaped
            )
            config, kernel = step.config, step.kernel
            resplit = split_kv.at_shape(piece, config, step.alternatives, dev, step.piece)
            tiles = planned.tiles.get(step.index)
            if resplit is not None and opts.filters.rejects(resplit) is None:
                log.debug("  %s: split-KV at this shape: %s (the bucket's: %s)", piece.label(), resplit, config)
                config, kernel = resplit, planned.variant(step, resplit)
            elif tiles is not None and (tiled := tiles.at(env)) is not None:
                log.debug("  %s: tile variant at this shape: %s (the bucket's: %s)", piece.label(), tiled, config)
                config, kernel = tiled, planned.variant(step, tiled)
            if first and tiles is not None:  # (every tile of the step compiled now: the bucket's own too)
                for other in tiles.configs:
                    if other is not config:
                        bucket_kernel = step.kernel if other is step.config else planned.variant(step, other)
                        at = get_engine(other.engine).kernel_at(bucket_kernel, piece, dev)
                        if at is not None:  # (a variant failing gives way to the bucket's own: dropped then)
                            fallback = step.alternatives if other is step.config else (step.config,)
                            extra.append(Step(step.index, piece, other, at, fallback))
            shaped_kernel = get_engine(config.engine).kernel_at(kernel, piece, dev)
            if shaped_kernel is not None and opts.filters.rejects_kernel(shaped_kernel) is None:
                if config is not step.config:
                    stats["resplit" if config is resplit else "retiled"].append(step.index)
                stats["rebuilt"] += not shaped_kernel.repointed
                if config is step.config:
                    alternatives = step.alternatives  # (the bucket's tuple: no object per shape)
                else:
                    alternatives = tuple(c for c in (step.config, *step.alternatives) if c is not config)
                steps.append(Step(step.index, piece, config, shaped_kernel, alternatives))
                continue
            stats["rechosen"] += 1
            log.info("  %s: %s does not run it at this shape: its config is chosen again", piece.label(), config)
            try:
                steps.append(_rechoose(piece, step.index, usable, dev, opts, stats))
            except UnsupportedGraphError as err:
                log.info("  %s: no engine runs it at this shape (%s): the shape is planned anew", piece.label(), err)
                whole = plan_steps(graph, opts)
                return dataclasses.replace(whole, stats={**whole.stats, "replanned": True})
        steps, stats["compile"] = _compile_with_variants(planned, steps, extra, dev, opts.compile, stats)
    return Schedule(shaped, dev, tuple(steps), ShapedCuts(base.cuts, planned.cut_positions, shaped), stats)


class ShapedCuts(Sequence[Cut]):
    """The bucket's cuts over a shape's graph, each made when read (describe, plan files): a shape's
    plan keeps no Cut objects of its own (a dynamic plan makes one per new shape, and every object it
    keeps counts toward the garbage collector's full passes)."""

    def __init__(self, cuts: Sequence[Cut], positions: Sequence[int], graph: FinalGraph) -> None:
        self._cuts, self._positions, self._graph = cuts, positions, graph

    def __len__(self) -> int:
        return len(self._cuts)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and tuple(self) == tuple(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(tuple(self))

    @overload
    def __getitem__(self, i: int) -> Cut: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[Cut, ...]: ...
    def __getitem__(self, i: int | slice) -> Cut | tuple[Cut, ...]:
        if isinstance(i, slice):
            return tuple(self[j] for j in range(*i.indices(len(self))))
        return dataclasses.replace(self._cuts[i], node=self._graph.nodes[self._positions[i]])


def _compile_with_variants(
    planned: BucketSchedule, steps: list[Step], extra: list[Step], dev: Device, mode: str, stats: dict[str, Any]
) -> tuple[list[Step], dict[str, Any]]:
    """Compile the shape's steps and, at the bucket's first shape, the other tiles of its steps with variants
    (`extra`: the variants, or the bucket's own tile, that no step of this shape runs), so that no later
    shape compiles one; a variant whose kernel fails to compile is dropped from its step's choice.
    stats["variant_kernels"]: the kernels of `extra`."""
    wanted = [*steps, *extra]
    compiled, report = compile_steps(wanted, dev, mode)
    for want, got in zip(wanted, compiled):
        choice = planned.tiles.get(want.index)
        if got.config is want.config or choice is None or all(want.config is not v for v in choice.variants):
            continue
        log.info("  step %d: tile variant %s did not compile: dropped", want.index, want.config)
        smaller = choice.without(want.config)
        if smaller is None:
            planned.tiles.pop(want.index)
        else:
            planned.tiles[want.index] = smaller
    stats["variant_kernels"] = [s.kernel for s in extra]
    planned.tiles_compiled[0] = True
    return compiled[: len(steps)], report


def _rechoose(
    piece: Piece, index: int, usable: list[Engine], dev: Device, opts: BuildOptions, stats: dict[str, Any]
) -> Step:
    """The piece's step with its config chosen at its own shape, as a static build chooses it."""
    if not opts.autotune:
        return choose_step(piece, index, usable, dev, opts, stats)
    candidates = opts.filters.keep(rank_configs(piece, usable, dev, (*opts.modes, HeurMode.B)).configs)[0]
    return choose_step(piece, index, usable, dev, opts, stats, TuningCache(), candidates)


__all__ = ["BucketSchedule", "plan_bucket", "schedule_at"]
